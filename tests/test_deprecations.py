"""The deprecation policy, pinned: every name capkv 0.1.0 exported still imports, and says where it went.

``tests/data/surface-0.1.0.txt`` is 0.1.0's public surface (module:name). Each
name is still public where it was, or is deprecated (it imports, with one
``DeprecationWarning`` that points at the importing line and names the new home,
and is the very object found there), or was removed (an ``ImportError`` that
says why). Type checkers see every deprecated name with its exact type, and a
deprecated function as deprecated (PEP 702: mypy's ``deprecated`` error code,
pyright's ``reportDeprecated``); PEP 702 has no form for a re-exported class or
constant, which warn at run time only.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

from capkv import _deprecations

ROOT = Path(__file__).resolve().parents[1]
SURFACE = [
    tuple(line.split(":"))
    for line in (ROOT / "tests" / "data" / "surface-0.1.0.txt").read_text().splitlines()
    if line and not line.startswith("#")
]
DEPRECATED = sorted((module, name) for module, names in _deprecations.DEPRECATED.items() for name in names)
REMOVED = sorted((module, name) for module, names in _deprecations.REMOVED.items() for name in names)


def importing(module: str, name: str) -> tuple[dict[str, object], list[warnings.WarningMessage]]:
    """Run ``from module import name`` as user code (file ``user.py``) and record every warning."""
    namespace: dict[str, object] = {}
    code = compile(f"from {module} import {name}\n", "user.py", "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(code, namespace)  # noqa: S102 - the import statement under test
    return namespace, caught


def public_now(module: str, name: str) -> bool:
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    return name in getattr(found, "__all__", ()) or (
        isinstance(found.__dict__.get(name), types.ModuleType) and f"{module}.{name}" == found.__dict__[name].__name__
    )


def test_the_surface_file_is_0_1_0s() -> None:
    assert len(SURFACE) == 378  # benchmarks/public_surface.py at 63f8a6c: 71 public modules, 378 names
    assert len({module for module, _ in SURFACE}) == 71 - 1  # capkv.cli exported nothing in 0.1.0


@pytest.mark.parametrize(("module", "name"), SURFACE, ids=[f"{m}.{n}" for m, n in SURFACE])
def test_every_0_1_0_name_still_imports_or_says_why_not(module: str, name: str) -> None:
    if (module, name) in REMOVED:
        with pytest.raises(ImportError, match=rf"^{re.escape(f'{module}.{name}')} was removed in capkv 0\.2\.0: "):
            importing(module, name)
        return
    namespace, caught = importing(module, name)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    if public_now(module, name):
        assert (module, name) not in DEPRECATED
        assert deprecations == []
        return
    assert (module, name) in DEPRECATED, f"{module}.{name} left a public module without a deprecation"
    assert len(deprecations) == 1, [str(w.message) for w in deprecations]  # once, also for a package
    warning = deprecations[0]
    assert warning.filename == "user.py"  # it points at the import, not at capkv
    target = _deprecations.DEPRECATED[module][name]
    assert str(warning.message) == _deprecations.message(module, name)
    assert str(warning.message).startswith(f"{module}.{name} is deprecated (capkv 0.2.0, removed in 0.3.0): ")
    if _deprecations.is_public(target):
        assert f"use {target}.{name}" in str(warning.message)
        assert name in importlib.import_module(target).__all__
    else:
        assert "internal" in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert namespace[name] is getattr(importlib.import_module(target), name)


@pytest.mark.parametrize(("module", "name"), DEPRECATED[::17], ids=[f"{m}.{n}" for m, n in DEPRECATED[::17]])
def test_attribute_access_warns_too(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{module}.{name} is deprecated")) as caught:
        getattr(imported, name)
    assert len(caught) == 1


def test_the_table_only_names_what_0_1_0_exported() -> None:
    """Nothing is deprecated that was not public, and nothing is both deprecated and removed."""
    surface = set(SURFACE)
    assert set(DEPRECATED) - surface == {("capkv.mypy", "CAPKV_HMA"), ("capkv.mypy", "CapkvPlugin"),
                                         ("capkv.mypy", "SUPPORTED_MYPY")} - surface
    assert set(REMOVED) <= surface
    assert not set(DEPRECATED) & set(REMOVED)


def test_a_shim_never_replaces_the_name_it_shares() -> None:
    """0.1.0's module ``capkv.devmode.instrument`` is a shim; ``capkv.devmode.instrument`` stays the function."""
    code = textwrap.dedent(
        """
        import warnings
        warnings.simplefilter("ignore")
        import capkv.devmode.instrument, capkv.cli.main, capkv.contracts.class_level
        from capkv.devmode.instrument import Instrumented
        import capkv.devmode, capkv.cli, types
        assert isinstance(capkv.devmode.instrument, types.FunctionType), capkv.devmode.instrument
        assert isinstance(capkv.cli.main, types.FunctionType), capkv.cli.main
        import capkv.connectors.file_store
        assert capkv.connectors.file_store.__name__ == "capkv.connectors.file_store"  # no clash: reachable
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_private_names_are_never_served_as_deprecated() -> None:
    import capkv

    with pytest.raises(AttributeError, match="no attribute '_anything'"):
        getattr(capkv, "_anything")  # noqa: B009
    with pytest.raises(AttributeError, match="no attribute 'Typo'"):
        getattr(importlib.import_module("capkv.contracts"), "Typo")  # noqa: B009


# ---- what type checkers see ---------------------------------------------------------------------


def deprecated_uses(tmp_path: Path) -> tuple[Path, dict[int, tuple[str, str, bool]]]:
    """A user module reading every deprecated name as ``module.name``; line -> (module, name, is a function).

    An attribute read is what both checkers flag wherever it is (mypy flags a
    ``from`` import only at module level and without ``as``).
    """
    def shadowed(module: str) -> bool:  # capkv.cli.main is the function: read that module with from-imports
        package, _, leaf = module.rpartition(".")
        return bool(package) and (
            leaf in _deprecations.DEPRECATED.get(package, {})
            or leaf in getattr(importlib.import_module(package), "__all__", ())
        )

    lines = ["from __future__ import annotations", ""]
    lines += [f"import {module}" for module in sorted({module for module, _ in DEPRECATED}) if not shadowed(module)]
    lines.append("")
    where: dict[int, tuple[str, str, bool]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module, name in DEPRECATED:
            value = getattr(importlib.import_module(module), name)
            lines.append(f"from {module} import {name}" if shadowed(module) else f"{module}.{name}")
            where[len(lines)] = (module, name, isinstance(value, types.FunctionType))
    # The deprecated stubs keep the signature: a wrong call or result is still an error.
    lines += [
        "verdict: bool = capkv.capabilities.supports_hma(object())",
        "wrong: str = capkv.capabilities.supports_hma(object())",
    ]
    for line in (len(lines) - 1, len(lines)):
        where[line] = ("capkv.capabilities", "supports_hma", True)
    path = tmp_path / "user.py"
    path.write_text("\n".join(lines) + "\n")
    return path, where


def library_env() -> dict[str, str]:
    """capkv found on the interpreter's path, as an installed library would be (this checkout first)."""
    return {**{k: v for k, v in os.environ.items() if k != "MYPYPATH"}, "PYTHONPATH": str(ROOT)}


def check_verdicts(found: dict[int, list[str]], where: dict[int, tuple[str, str, bool]], total: int) -> None:
    wrong_call = total
    for line, messages in sorted(found.items()):
        assert line in where, f"line {line}: {messages}"
    for line, (module, name, function) in where.items():
        messages = found.get(line, [])
        if line == wrong_call:
            assert any("str" in m and "bool" in m for m in messages), messages
        if function:
            assert any(_deprecations.message(module, name) in m for m in messages), (line, module, name, messages)
        else:
            assert messages == [], (line, module, name, messages)


def test_mypy_sees_every_deprecated_name_and_flags_the_functions(tmp_path: Path) -> None:
    user, where = deprecated_uses(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--enable-error-code", "deprecated", "--follow-imports", "silent",
         "--no-error-summary", "--show-error-codes", "--cache-dir", str(tmp_path / "cache"), str(user)],
        cwd=tmp_path, env=library_env(), capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    found: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        match = re.match(r".*user\.py:(\d+): (?:error|note): (.*)", line)
        if match:
            found.setdefault(int(match[1]), []).append(match[2])
    assert found, done.stdout + done.stderr
    check_verdicts(found, where, total=max(where))


def test_pyright_sees_every_deprecated_name_and_flags_the_functions(tmp_path: Path) -> None:
    user, where = deprecated_uses(tmp_path)
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"typeCheckingMode": "standard", "reportDeprecated": "error", "pythonVersion": "3.11"})
    )
    done = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", str(user)],
        cwd=tmp_path, env=library_env(), capture_output=True, text=True, timeout=900, check=False,
    )
    report = json.loads(done.stdout)
    found: dict[int, list[str]] = {}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            found.setdefault(diagnostic["range"]["start"]["line"] + 1, []).append(diagnostic["message"])
    check_verdicts(found, where, total=max(where))
