"""One version: ``capkv/_version.py`` is what ``capkv.__version__``, a wheel and an editable install report.

The distribution is built from a copy of the checkout (never in place: a build
writes ``build/`` and ``*.egg-info`` beside the sources) through setuptools' own
PEP 517/660 hooks, as pip would call them.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import capkv

ROOT = Path(__file__).resolve().parents[1]

BUILD = """\
import sys
from setuptools import build_meta
hook = getattr(build_meta, sys.argv[1])
print(hook(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("dist") / "capkv-src"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, copy / name)
    shutil.copytree(ROOT / "capkv", copy / "capkv", ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def built(source: Path, hook: str) -> Path:
    out = source.parent / hook
    out.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", BUILD, hook, str(out)], cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def metadata_version(wheel: Path) -> tuple[str, zipfile.ZipFile]:
    archive = zipfile.ZipFile(wheel)
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    return email.parser.Parser().parsestr(archive.read(name).decode())["Version"], archive


def test_the_version_is_a_release_number() -> None:
    """A release (``0.2.0``) or, between releases, the next one in development (``0.3.0.dev0``)."""
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", capkv.__version__)
    assert "__version__" in dir(capkv)


def test_a_wheel_carries_the_version_capkv_reports(source: Path) -> None:
    version, archive = metadata_version(built(source, "build_wheel"))
    assert version == capkv.__version__
    shipped = archive.read("capkv/_version.py").decode()
    assert shipped == (ROOT / "capkv" / "_version.py").read_text()


def test_an_editable_install_carries_the_version_capkv_reports(source: Path) -> None:
    version, archive = metadata_version(built(source, "build_editable"))
    assert version == capkv.__version__
    assert not any(n.startswith("capkv/") for n in archive.namelist())  # the code stays in the checkout


def test_the_changelog_has_a_section_for_this_version() -> None:
    """Unreleased work names the version it becomes; a released version has its own heading."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    version = re.escape(capkv.__version__.partition(".dev")[0])
    released = re.search(rf"^## \[{version}\]", changelog, re.MULTILINE) if ".dev" not in capkv.__version__ else None
    unreleased = re.search(rf"^## \[Unreleased\]\n\nTo be released as {version} ", changelog, re.MULTILINE)
    assert released or unreleased, capkv.__version__
