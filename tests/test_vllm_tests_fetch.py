"""vLLM's own tests are taken from each release's source distribution at set-up, byte for byte, never committed."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.v1 import fetch

ROOT = Path(__file__).resolve().parent.parent
RELEASES = list(fetch.RELEASES.values())


def _archive(tmp_path: Path, release: fetch.Release, files: dict[str, bytes]) -> Path:
    path = tmp_path / release.sdist_name
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"vllm-{release.version}/tests/v1/{name}")
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


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_a_file_that_differs_from_vllms_is_refused_and_none_written(tmp_path: Path, release: fetch.Release) -> None:
    files = {path: b"# not vLLM's\n" for path in release.files}
    archive = _archive(tmp_path, release, files)
    with pytest.raises(SystemExit, match="SHA-256 differs"):
        fetch.extract(release, archive, tmp_path / "v1")
    assert fetch.missing(release, tmp_path / "v1") == list(release.files)
    assert not (tmp_path / "v1").exists()


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_an_archive_that_is_not_vllms_is_refused(tmp_path: Path, release: fetch.Release) -> None:
    archive = _archive(tmp_path, release, {})
    with pytest.raises(SystemExit, match=f"not vLLM {release.version}'s source distribution"):
        fetch.sdist(release, str(archive))


def test_one_releases_files_are_not_taken_for_anothers(tmp_path: Path) -> None:
    """0.32's test module in place counts as missing for 0.33 (and the other way), so fetch replaces it."""
    old, new = fetch.RELEASES["0.32.0"], fetch.RELEASES["0.33.0"]
    changed = [path for path in old.files if old.files[path] != new.files.get(path)]
    assert "kv_connector/unit/test_multi_connector.py" in changed
    for path in changed:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x")
    assert set(changed) <= set(fetch.missing(new, tmp_path))


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_files_in_place_are_checked_byte_for_byte(tmp_path: Path, release: fetch.Release) -> None:
    root = tmp_path / "v1"
    assert fetch.missing(release, root) == list(release.files)
    first = next(iter(release.files))
    (root / first).parent.mkdir(parents=True)
    (root / first).write_bytes(b"x")
    assert first in fetch.missing(release, root)
    assert all(len(digest) == 64 and int(digest, 16) >= 0 for digest in release.files.values())
    assert hashlib.sha256(b"x").hexdigest() not in release.files.values()
    assert release.url.endswith("/" + release.sdist_name)


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_the_cached_sdist_is_used_when_its_digest_matches(tmp_path: Path, release: fetch.Release,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPKV_CACHE", str(tmp_path))
    (tmp_path / release.sdist_name).write_bytes(b"stale")
    monkeypatch.setattr(fetch.urllib.request, "urlopen", _refuse)
    with pytest.raises(ConnectionError):  # a stale cache is not trusted: it goes to download (refused here)
        fetch.sdist(release, None)
    assert not list(tmp_path.glob("*.part"))


def _refuse(*args: object, **kwargs: object) -> object:
    raise ConnectionError("no network in this test")
