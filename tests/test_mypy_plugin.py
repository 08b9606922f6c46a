"""The plugin's entry point and its pinned mypy releases."""

from __future__ import annotations

import mypy.version
import pytest

from capkv._mypy_plugin import SUPPORTED_MYPY, CapkvPlugin
from capkv.mypy import plugin


def test_the_installed_mypy_is_a_supported_release() -> None:
    major, minor = (int(part) for part in mypy.version.__version__.split(".")[:2])
    assert (major, minor) in SUPPORTED_MYPY


def test_entry_point_warns_only_for_untested_releases(capsys: pytest.CaptureFixture[str]) -> None:
    assert plugin("2.4.1") is CapkvPlugin
    assert capsys.readouterr().err == ""
    assert plugin("3.0.0+dev.abc") is CapkvPlugin
    assert capsys.readouterr().err == "capkv.mypy: tested with mypy 2.3, 2.4, not 3.0.0+dev.abc: messages may differ\n"
