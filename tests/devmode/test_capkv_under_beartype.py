"""In dev mode — and so in this test suite — capkv's own functions run under beartype."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import capkv
from capkv import ContractError, KVSpec, devmode

ROOT = Path(__file__).resolve().parents[2]

IMPORT_ALL = """
import importlib, importlib.util, pkgutil, warnings
from beartype.roar import BeartypeClawDecorWarning, BeartypeDecorHintPepDeprecationWarning
warnings.simplefilter("error", BeartypeClawDecorWarning)
warnings.simplefilter("error", BeartypeDecorHintPepDeprecationWarning)
import capkv
assert capkv.devmode.types_checked()
have_vllm = importlib.util.find_spec("vllm") is not None
for module in pkgutil.walk_packages(capkv.__path__, "capkv.", onerror=lambda name: None):
    if module.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(module.name)
    except ImportError as exc:  # an extra's adapters without the extra (capkv.vllm's error names it)
        if have_vllm or exc.name != "vllm" or not module.name.startswith(("capkv.vllm", "capkv.adapters.vllm")):
            raise
print("ok")
"""


def test_beartype_accepts_every_capkv_module() -> None:
    """No function is left unchecked (or warned about) for a typing construct beartype cannot take."""
    env = {**os.environ, "CAPKV_DEV": "1"}
    env.pop("PYTHONOPTIMIZE", None)
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_the_suite_runs_capkv_under_beartype() -> None:
    assert devmode.types_checked() is (not devmode.forced_off())


def test_a_call_against_capkv_type_hints_is_a_contract_error() -> None:
    if not devmode.types_checked():
        with pytest.raises(TypeError):
            KVSpec(num_groups="2", num_blocks=4)  # type: ignore[arg-type]
        return
    with pytest.raises(ContractError, match="num_groups"):
        KVSpec(num_groups="2", num_blocks=4)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="block_ids"):
        capkv.finish_request(capkv.MultiConnector(_hma()), _req(), [[1]])  # type: ignore[arg-type]


def test_capkv_own_refusals_are_kept_under_beartype() -> None:
    with pytest.raises(capkv.CapabilityError, match='sub-connector #1 "object" is not a KVConnector'):
        capkv.MultiConnector(object())  # type: ignore[call-overload]


def _hma() -> capkv.HMAConnector:
    from tests.fakes import HMA

    return HMA()


def _req() -> capkv.Request:
    from tests.fakes import Req

    return Req("r")
