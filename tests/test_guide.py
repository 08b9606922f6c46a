"""The connector guide's complete example is code the suite runs: extracted, type-checked, and conformance-tested."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from capkv import SupportsHMA
from capkv.stores import Backend
from capkv.testing import assert_conformant

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "writing-a-connector.md"
MARKER = "<!-- capkv-guide-example: memstore.py -->"
BACKEND_MARKER = "<!-- capkv-guide-example: directory_backend.py -->"


def example_source(marker: str = MARKER) -> str:
    """The Python block right after the marker in the guide."""
    text = GUIDE.read_text()
    found = re.search(re.escape(marker) + r"\n```python\n(.*?)\n```\n", text, re.DOTALL)
    if found is None:
        raise AssertionError(f"{GUIDE.name}: no python block after {marker}")
    return found.group(1) + "\n"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("guide") / "memstore.py"
    path.write_text(example_source())
    return path


@pytest.fixture(scope="module")
def backend_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("guide") / "directory_backend.py"
    path.write_text(example_source(BACKEND_MARKER))
    return path


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"guide_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_guides_connector_conforms(example: Path) -> None:
    memstore = load(example).MemStore
    assert issubclass(memstore, SupportsHMA)
    report = assert_conformant(memstore)
    assert len(report.results) == 20  # 5 layouts x 4 placements (it loads slices: also behind a front tier)
    assert all(min(r.warm_loaded_tokens) > 0 for r in report.results)
    shown = [line for line in GUIDE.read_text().splitlines() if line.startswith(("capkv.testing: MemStore", "  ok "))]
    assert len(shown) >= 3 and all(line in str(report).splitlines() for line in shown), shown


@pytest.mark.parametrize("which", ["example", "backend_example"])
def test_the_guides_examples_pass_mypy_strict(which: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(which)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", "", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_guides_backend_is_a_backend_and_its_store_conforms(backend_example: Path, tmp_path: Path) -> None:
    module = load(backend_example)
    assert isinstance(module.DirectoryBackend(tmp_path / "probe"), Backend)
    store = module.DirectoryStore
    assert issubclass(store, SupportsHMA)
    roots = iter(range(1000))
    report = assert_conformant(
        lambda spec: store(spec, root=str(tmp_path / f"store-{next(roots)}")), before_warm=store.flush
    )
    assert all(min(r.warm_loaded_tokens) > 0 for r in report.results)
    assert any(tmp_path.glob("store-*/*-g0-*")) and not any(tmp_path.glob("store-*/*.tmp"))  # values, whole


def test_the_readme_links_the_guide() -> None:
    assert "(docs/writing-a-connector.md)" in (ROOT / "README.md").read_text()
