"""The vLLM tests: skipped (saying why) where vLLM is not installed, *failed* where it must be.

The ``vllm`` tox environment sets ``CAPKV_REQUIRE_VLLM=1``: there a missing or
broken vLLM is an error, never a silent skip. Each test's wall time is recorded
and listed at the end of the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in-process: inspectable
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from tests.vllm.requirement import VLLM_ERROR  # noqa: E402  # after the environment above is set

WALL_TIMES: dict[str, float] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if VLLM_ERROR is None:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"vLLM is not installed ({VLLM_ERROR}); the `vllm` tox environment runs these")
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _wall_time(request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.perf_counter()
    yield
    WALL_TIMES[request.node.nodeid] = time.perf_counter() - start


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not WALL_TIMES:
        return
    terminalreporter.section("vLLM wall times (fixtures shared by a module count once, in its first test)")
    for nodeid, seconds in WALL_TIMES.items():
        terminalreporter.write_line(f"wall {seconds:7.1f} s  {nodeid}")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny hybrid Llama, written once per session."""
    from tests.vllm.model import write_model

    return write_model(tmp_path_factory.mktemp("tiny-hybrid-llama"))
