"""How big capkv's public surface is: public modules and the names they export.

A module is public when no part of its dotted name starts with ``_``; its names
are its ``__all__`` (or, without one, its attributes not starting with ``_``
other than modules). Prints the module count, the names summed over modules
(``capkv.KVSpec`` and ``capkv.contracts.KVSpec`` count twice: both are API a
refactor must keep), and the distinct objects behind them.

Modules kept only for compatibility (capkv 0.1.0's, which warn on every name:
they set ``__deprecated__``) are counted apart, with the deprecated names the
fronts and those modules still serve (``capkv._deprecations``).

Run from a checkout: ``python benchmarks/public_surface.py [ROOT]`` (ROOT: the
directory holding ``capkv/``, default this checkout — point it at an export of
another commit to compare).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import types
from pathlib import Path


def public_names(module: types.ModuleType) -> list[str]:
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return list(declared)
    return [
        name for name, value in vars(module).items() if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    os.environ["CAPKV_DEV"] = "0"
    sys.path.insert(0, str(root))
    import capkv

    if Path(capkv.__file__).resolve().parent != root / "capkv":
        raise SystemExit(f"imported capkv from {capkv.__file__}, not from {root}")
    modules = ["capkv"] + [m.name for m in pkgutil.walk_packages(capkv.__path__, "capkv.")]
    public = [m for m in modules if not any(part.startswith("_") for part in m.split("."))]
    names = 0
    objects: set[int] = set()
    failed: list[str] = []
    deprecated_modules: list[str] = []
    for name in public:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency (vllm, redis) absent here
            failed.append(f"{name} ({exc})")
            continue
        if hasattr(module, "__deprecated__"):
            deprecated_modules.append(name)
            continue
        exported = public_names(module)
        names += len(exported)
        objects.update(id(getattr(module, n)) for n in exported)
    print(f"capkv at {root}")
    print(f"  importable modules: {len(modules)}, public: {len(public) - len(deprecated_modules)}", end="")
    print(f" (+ {len(deprecated_modules)} deprecated, kept for compatibility)" if deprecated_modules else "")
    print(f"  public names (summed over public modules): {names}")
    print(f"  distinct public objects: {len(objects)}")
    try:
        table = importlib.import_module("capkv._deprecations")
    except ImportError:
        pass
    else:
        served = sum(len(n) for n in table.DEPRECATED.values())
        removed = sum(len(n) for n in table.REMOVED.values())
        print(f"  deprecated names still served (with a DeprecationWarning): {served}; removed names explained: {removed}")
    for line in failed:
        print(f"  not importable here: {line}")


if __name__ == "__main__":
    main()
