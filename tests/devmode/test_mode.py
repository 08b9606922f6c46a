"""The switch: environment, ``-X dev``, explicit override — and ``python -O``, which forces it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capkv import devmode

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import capkv
from capkv import devmode
from tests.fakes import HMA, Req
at_import = devmode.enabled()
devmode.set_dev_mode(True)
connector = HMA()
checked = capkv.devmode.instrument(connector, capkv.KVSpec(num_groups=1, num_blocks=4))
bad = ([True, 9, 9],)
try:
    checked.update_state_after_alloc(Req("r"), bad, 0)
    refused = False
except capkv.ContractError:
    refused = True
print(json.dumps({
    "optimize": sys.flags.optimize,
    "at_import": at_import,
    "after_set": devmode.enabled(),
    "types_checked": devmode.types_checked(),
    "same_object": checked is connector,
    "refused": refused,
    "reached_unchanged": bool(connector.calls) and connector.calls[0][1][1] is bad,
}))
"""


def probe(*flags: str, env: dict[str, str]) -> dict[str, object]:
    """Run the probe in a fresh interpreter: dev mode is decided at start-up."""
    environment = {k: v for k, v in os.environ.items() if k not in ("CAPKV_DEV", "PYTHONDEVMODE", "PYTHONOPTIMIZE")}
    result = subprocess.run(
        [sys.executable, *flags, "-c", PROBE], cwd=ROOT, env={**environment, **env},
        capture_output=True, text=True, timeout=120, check=True,
    )
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_python_O_forces_dev_mode_off_whatever_asks_for_it() -> None:
    facts = probe("-O", "-X", "dev", env={"CAPKV_DEV": "1"})
    assert facts == {
        "optimize": 1, "at_import": False, "after_set": False, "types_checked": False,
        "same_object": True, "refused": False, "reached_unchanged": True,
    }


@pytest.mark.parametrize(
    ("flags", "env"),
    [((), {"CAPKV_DEV": "1"}), (("-X", "dev"), {}), ((), {"PYTHONDEVMODE": "1"})],
    ids=["CAPKV_DEV=1", "-X dev", "PYTHONDEVMODE=1"],
)
def test_dev_mode_is_on_at_import(flags: tuple[str, ...], env: dict[str, str]) -> None:
    facts = probe(*flags, env=env)
    assert facts["at_import"] is True and facts["types_checked"] is True
    assert facts["same_object"] is False and facts["refused"] is True and facts["reached_unchanged"] is False


def test_off_by_default_and_by_CAPKV_DEV_0() -> None:
    for flags, env in (((), {}), (("-X", "dev"), {"CAPKV_DEV": "0"})):
        facts = probe(*flags, env=env)
        assert facts["at_import"] is False and facts["types_checked"] is False
        assert facts["after_set"] is True and facts["refused"] is True, "the explicit API still turns it on"


@pytest.mark.parametrize(("value", "on"), [("1", True), ("yes", True), ("0", False), ("off", False), ("False", False), ("", None)])
def test_environment_values(value: str, on: bool | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPKV_DEV", value)
    with devmode.dev_mode(None) as in_effect:
        expected = bool(sys.flags.dev_mode) if on is None else on
        assert in_effect is devmode.enabled() is (expected and not devmode.forced_off())


def test_the_override_is_scoped() -> None:
    with devmode.dev_mode(True) as outer:
        with devmode.dev_mode(False) as inner:
            assert inner is False and devmode.enabled() is False
        assert devmode.enabled() is outer is (not devmode.forced_off())
