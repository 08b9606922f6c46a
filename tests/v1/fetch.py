"""Put vLLM 0.32.0's own MultiConnector tests in place, from vLLM's source distribution.

capkv does not carry vLLM's code: the tests under ``tests/v1/kv_connector/unit/``
(``FILES`` below) are taken, unchanged, from the ``vllm-0.32.0.tar.gz`` that vLLM
published on PyPI, checked by SHA-256 (the archive and each file), and are ignored
by git. The ``vllm`` tox environment runs this before its tests (a download from the
package registry, like its ``pip install``); the tests themselves touch no network.

    python -m tests.v1.fetch [--sdist PATH]

``--sdist`` (or ``CAPKV_VLLM_SDIST``) names an archive already on disk; otherwise it
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
from pathlib import Path

SDIST_NAME = "vllm-0.32.0.tar.gz"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/"
    + SDIST_NAME
)
SDIST_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
FILES = {
    "kv_connector/unit/test_multi_connector.py": "7bc42b5f395625c7c0e0f764603baf181b834e4205c436335fc83f361736147b",
    "kv_connector/unit/utils.py": "7ec9051f3b04868c6f1c5a8052b85f9b7b51e6ddb3eaa25dbfdc1350ce664a82",
    "kv_connector/unit/conftest.py": "1608eabf3bb974279dac2add204cde3175f5d3df265adc6c66b32b0708993714",
}
"""The files, relative to ``tests/v1`` here and in the archive, and their SHA-256."""

HERE = Path(__file__).resolve().parent
DOWNLOAD_TIMEOUT_SECONDS = 300.0


def missing(root: Path = HERE) -> list[str]:
    """The files not in place under ``root``, or not byte-identical to vLLM 0.32.0's."""
    return [path for path, digest in FILES.items() if not _matches(root / path, digest)]


def _matches(path: Path, digest: str) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist(explicit: str | None) -> Path:
    """vLLM 0.32.0's source archive, checked: the one named, the cached one, or a fresh download."""
    if explicit:
        path = Path(explicit)
        if _sha256(path) != SDIST_SHA256:
            raise SystemExit(f"{path} is not vLLM 0.32.0's source distribution (SHA-256 differs)")
        return path
    cache = Path(os.environ.get("CAPKV_CACHE", Path.home() / ".cache" / "capkv"))
    path = cache / SDIST_NAME
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".part", delete=False) as part:
        try:
            with urllib.request.urlopen(SDIST_URL, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:  # noqa: S310 (a fixed https URL)
                while chunk := response.read(1 << 20):
                    part.write(chunk)
        except BaseException:
            Path(part.name).unlink(missing_ok=True)
            raise
    if _sha256(Path(part.name)) != SDIST_SHA256:
        Path(part.name).unlink()
        raise SystemExit(f"downloaded {SDIST_URL}: SHA-256 differs from vLLM 0.32.0's")
    Path(part.name).replace(path)
    return path


def extract(archive: Path, root: Path = HERE) -> None:
    """Write ``FILES`` from ``archive`` under ``root``, each checked before it is written."""
    prefix = "vllm-0.32.0/tests/v1/"
    with tarfile.open(archive, "r:gz") as tar:
        for path, digest in FILES.items():
            member = tar.extractfile(prefix + path)
            if member is None:
                raise SystemExit(f"{archive} has no {prefix + path}")
            data = member.read()
            if hashlib.sha256(data).hexdigest() != digest:
                raise SystemExit(f"{prefix + path} in {archive}: SHA-256 differs")
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", default=os.environ.get("CAPKV_VLLM_SDIST"), help="vllm-0.32.0.tar.gz on disk")
    args = parser.parse_args(argv)
    if not missing():
        print("tests/v1: vLLM 0.32.0's tests are in place")
        return 0
    extract(sdist(args.sdist))
    left = missing()
    if left:
        print(f"tests/v1: still missing {left}", file=sys.stderr)
        return 1
    print(f"tests/v1: vLLM 0.32.0's tests put in place ({', '.join(FILES)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
