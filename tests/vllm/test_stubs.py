"""stubs/vllm against the installed vLLM: ``python -m mypy.stubtest`` finds no difference.

The stubs describe every supported release at once; ``stubtest-allowlist.txt`` holds what every
release needs, ``stubtest-allowlist-X.Y.txt`` what only that release does (stubtest fails on an
entry left unused, so each list stays exact). Runs where vLLM is installed (the ``vllm`` and
``vllm33`` tox environments); elsewhere it is skipped, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

ROOT = Path(__file__).resolve().parents[2]


def _release_allowlist() -> Path:
    """``stubs/stubtest-allowlist-X.Y.txt`` for the installed vLLM; a release without one is not supported yet."""
    import vllm

    release = ".".join(vllm.__version__.split("+")[0].split(".")[:2])
    path = ROOT / "stubs" / f"stubtest-allowlist-{release}.txt"
    assert path.is_file(), f"vLLM {vllm.__version__} has no {path.name}: check the stubs against it and add one"
    return path


def test_stubs_match_installed_vllm() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "stubtest.ini"
        config.write_text("[mypy]\npython_version = 3.11\n")  # stubs only: capkv's strict flags are not the point
        proc = subprocess.run(
            [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(config), "--ignore-missing-stub",
             "--allowlist", str(ROOT / "stubs" / "stubtest-allowlist.txt"), "--allowlist", str(_release_allowlist()),
             "vllm"],
            cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT / "stubs")},
            capture_output=True, text=True, timeout=900, check=False,
        )
    assert proc.returncode == 0, f"stubtest found differences:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    assert "Success: no issues found" in proc.stdout


def test_stubs_cover_the_connectors_capkv_wraps() -> None:
    """Every module stubbed is a real vLLM module (a stub of nothing would pass stubtest vacuously)."""
    import importlib

    stubs = ROOT / "stubs"
    modules = sorted(
        ".".join(p.relative_to(stubs).with_suffix("").parts).removesuffix(".__init__")
        for p in (stubs / "vllm").rglob("*.pyi")
    )
    assert "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector" in modules
    for name in modules:
        importlib.import_module(name)
