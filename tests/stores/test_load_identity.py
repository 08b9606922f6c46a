"""Each load is its own: the review's scenarios of round 4's asynchronous machinery (issue 35).

1. A request's load is aborted, its id reused for a second load, and both end before one ``get_finished``:
   two reports (one per call), alone and inside a ``MultiConnector``.
2. The aborted load's report never settles the reload: aborting the reload mid-load saves none of the blocks
   it never filled, so no later request loads them as good KV.
3. A read that raises a ``BaseException`` that is not an ``Exception`` fails its own load; the loads handed
   back before it in the same call are reported, and nothing escapes into ``get_finished``.

Each drives the store's real reader thread over a scripted slow backend (:mod:`tests.stores.scripted`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from capkv import KVConnectorOutput, MultiConnector, check_stack, finish_request
from capkv.stores import MemoryBackend, StoreConnector, StoreKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, make_spec
from tests.stores.scripted import Gate, Raise, ScriptedReads

PROMPT = tokens(35, 100)
OFFERED = 96
READS = 2
"""Backend reads per load here: one ``get`` per chunk, a chunk per group."""


class Fatal(BaseException):
    """Not an ``Exception``: what a ``SystemExit``, a ``KeyboardInterrupt`` or a C extension's bug looks like."""


def _engine(backend: ScriptedReads, *, stacked: bool = False) -> MiniEngine:
    spec = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
    connector: Any = StoreConnector(spec, backend)
    if stacked:
        connector = MultiConnector(connector)
        check_stack(connector, spec)
    engine = MiniEngine(spec, connector)
    engine.run("seed", PROMPT)
    _store(connector).flush()
    return engine


def _store(connector: Any) -> StoreConnector:
    return connector.children[0] if isinstance(connector, MultiConnector) else connector


def _plan_load(engine: MiniEngine, request_id: str, prompt: list[int] = PROMPT) -> tuple[Req, tuple[list[int], ...]]:
    """Look up, allocate and plan an asynchronous load by hand, as vLLM does (the request then waits)."""
    request = Req(request_id, [*prompt, 1])
    offered, load_async = engine.connector.get_num_new_matched_tokens(request, 0)
    assert (offered, load_async) == (OFFERED, True)
    blocks = engine._allocate(len(request.all_token_ids), offered)
    engine.connector.update_state_after_alloc(request, blocks, offered)
    request.num_computed_tokens = offered  # as vLLM sets it while the request waits for its KV
    return request, blocks


def _ship(engine: MiniEngine) -> None:
    """Build and bind a step's metadata and start its loads, without asking what finished."""
    connector = engine.connector
    metadata = connector.build_connector_meta(None)
    connector.bind_connector_metadata(metadata)
    connector.start_load_kv(None)
    connector.wait_for_save()
    worker_meta = connector.build_connector_worker_meta()
    connector.clear_connector_metadata()
    connector.update_connector_output(KVConnectorOutput(worker_meta=worker_meta))


def _steps_until(engine: MiniEngine, request_id: str, count: int, timeout_s: float = 10.0) -> int:
    """Step until ``request_id`` was reported received ``count`` times in all (for at most ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while engine.receipts[request_id] < count and time.monotonic() < deadline:
        engine.step()
        time.sleep(0.002)
    return engine.receipts[request_id]


@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "in a MultiConnector"])
def test_two_loads_of_one_id_ending_before_one_get_finished_are_two_reports(stacked: bool) -> None:
    backend = ScriptedReads()
    engine = _engine(backend, stacked=stacked)
    gate = Gate()
    backend.then(gate)
    first, first_blocks = _plan_load(engine, "reused")
    _ship(engine)  # the first load is on the reader, held at the gate
    delay_free, _ = finish_request(engine.connector, first, first_blocks)  # aborted mid-load
    assert delay_free is False  # the engine keeps its blocks until the receive is reported
    _plan_load(engine, "reused")  # the id again, a second load
    _ship(engine)
    gate.open()
    _store(engine.connector).flush()  # both loads are over before the next get_finished
    assert _steps_until(engine, "reused", 2) == 2, "the second load of a reused id was never reported received"
    assert engine.connector.get_block_ids_with_load_errors() == {}


def test_an_aborted_loads_report_never_settles_the_reload_and_nothing_unfilled_is_saved() -> None:
    backend = ScriptedReads()
    engine = _engine(backend)
    first_gate, second_gate = Gate(), Gate()
    backend.then(*[first_gate] * READS, *[second_gate] * READS)
    first, first_blocks = _plan_load(engine, "reused")
    _ship(engine)
    assert first_gate.reached.wait(10)
    assert finish_request(engine.connector, first, first_blocks)[0] is False
    second, blocks = _plan_load(engine, "reused")
    _ship(engine)  # the reload waits behind the first on the reader
    first_gate.open()
    assert _steps_until(engine, "reused", 1) == 1  # the aborted load's report: it settles that load only
    assert second_gate.reached.wait(10)
    backend.values.clear()  # evicted meanwhile: the reload's keys are saveable again
    delay_free, _ = finish_request(engine.connector, second, blocks)  # aborted mid-load too
    if delay_free:  # the old code planned the save of the reload's blocks, which its load never filled
        engine.held["reused"] = blocks
    engine.step()
    second_gate.open()
    assert _steps_until(engine, "reused", 2) == 2
    _store(engine.connector).flush()
    later = engine.run("later", [*PROMPT, 2])  # the engine checks every block it loads, bit for bit
    assert later.hit_tokens == 0, "the reload's unfilled blocks were saved and offered as a hit"
    assert delay_free is False


def test_a_read_raising_a_base_exception_fails_its_load_and_loses_no_other_report() -> None:
    backend = ScriptedReads()
    engine = _engine(backend)
    gate = Gate()
    backend.then(*[gate] * READS, Raise(Fatal("the reader's read died")))
    _plan_load(engine, "before")
    _ship(engine)
    _plan_load(engine, "broken")
    _ship(engine)
    gate.open()
    _store(engine.connector).flush()  # both loads are over: the second raised a BaseException on the reader
    errors: dict[int, set[int]] = {}
    for _ in range(5):
        engine.step(lambda found: [errors.setdefault(g, set()).update(ids) for g, ids in found.items()])
    assert engine.receipts["before"] == 1 and engine.receipts["broken"] == 1
    assert errors and all(errors.values())  # the broken load's blocks, as load errors
    with pytest.raises(RuntimeError, match="met Fatal.*the reader's read died"):
        _store(engine.connector).flush()
    _store(engine.connector).flush()  # raised once


def test_a_request_failed_in_the_step_its_synchronous_load_failed_saves_nothing_from_the_load_on() -> None:
    """vLLM fails a request (``kv_load_failure_policy="fail"``) while taking in the output of the step its load
    failed in, before the connector hears that output: the blocks computed in that step were computed on KV
    that never arrived, and a store on its own must not save them."""

    class Breaks(MemoryBackend):
        broken = False

        def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
            if self.broken:
                raise ConnectionError("backend down")
            return super().get(keys)

    backend = Breaks()
    spec = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
    connector = StoreConnector(spec, backend)
    engine = MiniEngine(spec, connector)
    engine.run("seed", PROMPT[:64])
    connector.flush()
    request = Req("failed", [*PROMPT, 1])
    offered, load_async = connector.get_num_new_matched_tokens(request, 0)
    assert (offered, load_async) == (64, False)
    blocks = engine._allocate(len(request.all_token_ids), offered)
    connector.update_state_after_alloc(request, blocks, offered)
    backend.broken = True
    connector.bind_connector_metadata(connector.build_connector_meta(None))
    connector.start_load_kv(None)
    engine.compute(request, blocks, offered, len(PROMPT))  # the forward, on KV the load never delivered
    request.num_computed_tokens = len(PROMPT)
    connector.wait_for_save()
    assert connector.get_block_ids_with_load_errors()
    delay_free, _ = finish_request(connector, request, blocks)  # failed before its step's output comes back
    metadata = connector.build_connector_meta(None)
    assert delay_free is False and metadata.saves == (), "blocks computed on a failed load were planned for saving"
