"""The test suite runs in dev mode: capkv's own functions under beartype, connectors checkable.

``CAPKV_DEV`` must be set before capkv is first imported, which is why this is
done here, at the top of the root conftest. Under ``python -O`` dev mode is
forced off, and the suite then checks production behaviour instead.
"""

import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("CAPKV_DEV", "1")

# Property tests check behaviour, not speed: on a loaded 2-core CI machine a first example that
# imports or compiles can take seconds, which hypothesis's default 200 ms deadline reports as a failure.
settings.register_profile("capkv", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("capkv")

import capkv  # noqa: E402
from capkv.connectors import FileStoreConnector  # noqa: E402

if os.environ["CAPKV_DEV"] == "1" and not capkv.devmode.forced_off() and not capkv.devmode.types_checked():
    raise RuntimeError("capkv was imported before tests/conftest.py could turn dev mode on")


def pytest_report_header() -> str:
    """Say in the run's header which mode the suite runs in."""
    mode = "on" if capkv.devmode.enabled() else "off"
    if capkv.devmode.forced_off():
        mode += " (forced off by python -O)"
    return f"capkv dev mode: {mode}; capkv under beartype: {capkv.devmode.types_checked()}"


@pytest.fixture(autouse=True)
def _shut_down_file_stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Shut down every ``FileStoreConnector`` a test creates, so no writer thread outlives its test."""
    created: list[FileStoreConnector] = []
    original = FileStoreConnector.__init__

    @functools.wraps(original)  # keeps the signature: hosts build stores by it
    def recording_init(self: FileStoreConnector, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(FileStoreConnector, "__init__", recording_init)
    yield
    for connector in created:
        connector.shutdown()
