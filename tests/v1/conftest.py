"""Runs the installed vLLM release's own connector tests (put in place, unchanged, by ``fetch.py``) against capkv's drop-in.

This file is capkv's, not vLLM's (see ``README.md`` here). Before vLLM's test
modules are imported it

- requires vLLM and vLLM's test files (``python -m tests.v1.fetch`` puts them in
  place): where either is missing these tests are not collected (said in the
  header), and under ``CAPKV_REQUIRE_VLLM=1`` that is an error;
- puts the hub offline over local stand-ins for the models vLLM's tests name
  (:mod:`tests.vllm.standins`);
- points vLLM's name ``"MultiConnector"`` — its connector registry's entry and the
  class in ``vllm.distributed.kv_transfer.kv_connector.v1.multi_connector`` that
  vLLM's code and tests import — at ``capkv.vllm.MultiConnector``: while vLLM's test
  module is imported (it binds the name then), and around each of its tests (vLLM's
  code looks the name up when it runs); other tests of the session see vLLM's own.
  With ``CAPKV_VLLM_MULTI=vllm`` it leaves vLLM's own in place, to count what the
  same tests give against vLLM's composite.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.v1.fetch import installed_release, missing
from tests.vllm.requirement import VLLM_ERROR  # noqa: E402  # after the environment above is set

AGAINST = os.environ.get("CAPKV_VLLM_MULTI", "capkv")
if AGAINST not in ("capkv", "vllm"):
    raise RuntimeError(f"CAPKV_VLLM_MULTI must be 'capkv' or 'vllm', got {AGAINST!r}")


def _missing() -> list[str]:
    try:
        return missing(installed_release())
    except SystemExit as exc:  # a vLLM release tests/v1 does not know
        return [str(exc)]


MISSING = _missing() if VLLM_ERROR is None else []
"""The installed release's test files not in place (or not that release's bytes)."""
if MISSING and VLLM_ERROR is None and os.environ.get("CAPKV_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"CAPKV_REQUIRE_VLLM=1 but vLLM's tests are not in place ({MISSING}): run python -m tests.v1.fetch")

collect_ignore = ["fetch.py", "wheel_env.py", "newest.py"] + (["kv_connector"] if VLLM_ERROR is not None or MISSING else [])


def pytest_report_header() -> str:
    if VLLM_ERROR is not None:
        return f"tests/v1 (vLLM's own tests): not collected, vLLM is not installed ({VLLM_ERROR})"
    if MISSING:
        return f"tests/v1 (vLLM's own tests): not collected, not in place ({MISSING}): python -m tests.v1.fetch"
    release = installed_release().version
    return f"tests/v1 (vLLM {release}'s own tests): MultiConnector is {'vLLM' if AGAINST == 'vllm' else 'capkv'}'s"


def _standins() -> None:
    """The stand-in models, and a private temporary directory (vLLM's tests log connector calls
    to files in it, by fixed names)."""
    from tests.vllm.standins import go_offline, write_standins

    scratch = Path(tempfile.mkdtemp(prefix="capkv-vllm-tests-"))
    atexit.register(shutil.rmtree, scratch, True)
    go_offline(write_standins(scratch / "hub"))
    (scratch / "tmp").mkdir()
    tempfile.tempdir = str(scratch / "tmp")


VLLM_TESTS = ("tests.v1.kv_connector.unit.test_multi_connector",)


def _rewire(patch: pytest.MonkeyPatch) -> None:
    """vLLM's name ``"MultiConnector"`` means capkv's drop-in, until ``patch`` is undone."""
    from vllm.distributed.kv_transfer.kv_connector import factory
    from vllm.distributed.kv_transfer.kv_connector.v1 import multi_connector

    import capkv.vllm

    drop_in = capkv.vllm.MultiConnector
    patch.setitem(factory.KVConnectorFactory._registry, "MultiConnector", lambda: drop_in)
    patch.setattr(multi_connector, "MultiConnector", drop_in)


def _import_vllm_tests() -> None:
    """vLLM's test modules, imported with the name rewired (they bind it at import)."""
    patch = pytest.MonkeyPatch()
    _rewire(patch)
    try:
        for module in VLLM_TESTS:
            importlib.import_module(module)
    finally:
        patch.undo()


if VLLM_ERROR is None and not MISSING:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    _standins()
    if AGAINST == "capkv":
        _import_vllm_tests()


@pytest.fixture(autouse=True)
def _against(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of vLLM's tests runs against the composite chosen (capkv's unless CAPKV_VLLM_MULTI=vllm)."""
    if AGAINST == "capkv":
        import capkv.vllm

        _rewire(monkeypatch)
        for module in VLLM_TESTS:  # the module really bound capkv's class (not a second import of it)
            if getattr(importlib.import_module(module), "MultiConnector") is not capkv.vllm.MultiConnector:
                raise RuntimeError(f"{module} did not bind capkv.vllm.MultiConnector")


@pytest.fixture(autouse=True)
def _in_a_scratch_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's tests write relative paths (``storage_1/``): keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)
