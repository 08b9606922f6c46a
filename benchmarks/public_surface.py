"""How big capkv's public surface is: public modules and the names they export.

A module is public when no part of its dotted name starts with ``_``; its names
are its ``__all__`` (or, without one, its attributes not starting with ``_``
other than modules). Prints the module count, the names summed over modules
(``capkv.KVSpec`` and ``capkv.errors.ConfigError`` count once per module: both
are API a refactor must keep), and the distinct objects behind them. A module
that declares itself deprecated (``__deprecated__``, as capkv 0.2.0's shims of
0.1.0 modules did) is counted apart: it is not part of the surface.

Run from a checkout: ``python benchmarks/public_surface.py [--names] [ROOT]``
(ROOT: the directory holding ``capkv/``, default this checkout — point it at a
worktree of another commit to compare). ``--names`` prints the surface itself,
one ``module:name`` a line, sorted: ``tests/data/surface-<release>.txt`` is that
output for a release (see that file's header for the exact command). Run it
with vLLM installed to include ``capkv.vllm``.
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
    args = sys.argv[1:]
    listing = "--names" in args
    args = [arg for arg in args if arg != "--names"]
    root = Path(args[0] if args else Path(__file__).resolve().parent.parent).resolve()
    os.environ["CAPKV_DEV"] = "0"
    sys.path.insert(0, str(root))
    import capkv

    if Path(capkv.__file__).resolve().parent != root / "capkv":
        raise SystemExit(f"imported capkv from {capkv.__file__}, not from {root}")
    modules = ["capkv"] + [m.name for m in pkgutil.walk_packages(capkv.__path__, "capkv.")]
    public = [m for m in modules if not any(part.startswith("_") for part in m.split("."))]
    surface: list[str] = []
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
        surface += [f"{name}:{n}" for n in exported]
        objects.update(id(getattr(module, n)) for n in exported)
    if listing:
        for line in failed:
            print(f"not importable here: {line}", file=sys.stderr)
        print("\n".join(sorted(surface)))
        return
    print(f"capkv at {root}")
    print(f"  importable modules: {len(modules)}, public: {len(public) - len(deprecated_modules)}", end="")
    print(f" (+ {len(deprecated_modules)} deprecated, kept for compatibility)" if deprecated_modules else "")
    print(f"  public names (summed over public modules): {len(surface)}")
    print(f"  distinct public objects: {len(objects)}")
    for line in failed:
        print(f"  not importable here: {line}")


if __name__ == "__main__":
    main()
