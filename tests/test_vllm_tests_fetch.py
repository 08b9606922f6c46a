"""vLLM's own tests are taken from vLLM's source distribution at set-up, byte for byte, never committed."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.v1 import fetch

ROOT = Path(__file__).resolve().parent.parent


def _archive(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / fetch.SDIST_NAME
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"vllm-0.32.0/tests/v1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_vllms_files_are_not_in_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "tests/v1"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    assert not {f"tests/v1/{path}" for path in fetch.FILES} & set(tracked)
    ignored = subprocess.run(
        ["git", "check-ignore", *(f"tests/v1/{path}" for path in fetch.FILES)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    ).stdout.split()
    assert ignored == [f"tests/v1/{path}" for path in fetch.FILES]


def test_a_file_that_differs_from_vllms_is_refused_and_not_written(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {path: b"# not vLLM's\n" for path in fetch.FILES})
    with pytest.raises(SystemExit, match="SHA-256 differs"):
        fetch.extract(archive, tmp_path / "v1")
    assert fetch.missing(tmp_path / "v1") == list(fetch.FILES)


def test_an_archive_that_is_not_vllms_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {})
    with pytest.raises(SystemExit, match="not vLLM 0.32.0's source distribution"):
        fetch.sdist(str(archive))


def test_files_in_place_are_checked_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    assert fetch.missing(root) == list(fetch.FILES)
    first = next(iter(fetch.FILES))
    (root / first).parent.mkdir(parents=True)
    (root / first).write_bytes(b"x")
    assert first in fetch.missing(root)
    assert all(len(digest) == 64 and int(digest, 16) >= 0 for digest in fetch.FILES.values())
    assert hashlib.sha256(b"x").hexdigest() not in fetch.FILES.values()
