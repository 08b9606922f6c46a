"""The last release's public names still import from where they were, without a warning.

``tests/data/surface-0.2.0.txt`` lists every name capkv 0.2.0 exported and had not
deprecated (its header says how it was generated). 0.3.0 removed what 0.2.0
deprecated (CHANGELOG.md, "Removed"); everything else must stay where users found it.
``capkv.vllm``'s names are checked by ``tests/vllm/test_surface.py`` (with vLLM).
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

SURFACE_FILE = Path(__file__).resolve().parent / "data" / "surface-0.2.0.txt"
SURFACE: list[tuple[str, str]] = [
    (module, name)
    for module, _, name in (line.partition(":") for line in SURFACE_FILE.read_text().splitlines())
    if module and not module.startswith("#")
]
NEEDS_VLLM = {"capkv.vllm"}
"""Modules that import only with vLLM installed: their rows are checked under tests/vllm."""


def check_still_public(module: str, name: str) -> None:
    """``from module import name`` works as user code, warns nothing of capkv's, and the name is still in ``__all__``."""
    namespace: dict[str, object] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"from {module} import {name}\n", "user.py", "exec"), namespace)  # noqa: S102 - the import under test
    about_capkv = [w for w in caught if w.filename == "user.py" or "capkv" in str(w.message)]  # not torch's, vLLM's
    assert [str(w.message) for w in about_capkv] == []
    front = importlib.import_module(module)
    assert name in front.__all__, f"{module}.{name} imports but is no longer exported"
    assert name in dir(front)
    assert namespace[name] is getattr(front, name)


def test_the_surface_file_is_0_2_0s() -> None:
    """145 names in 13 modules: what ``benchmarks/public_surface.py --names`` printed for the tag v0.2.0."""
    assert len(SURFACE) == len(set(SURFACE)) == 145
    assert len({module for module, _ in SURFACE}) == 13
    assert sum(module in NEEDS_VLLM for module, _ in SURFACE) == 6


@pytest.mark.parametrize(
    ("module", "name"),
    [row for row in SURFACE if row[0] not in NEEDS_VLLM],
    ids=[f"{m}.{n}" for m, n in SURFACE if m not in NEEDS_VLLM],
)
def test_every_0_2_0_name_still_imports_from_its_module(module: str, name: str) -> None:
    check_still_public(module, name)
