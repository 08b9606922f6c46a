"""``flush`` and ``close`` are bounded: a read stuck in a backend never holds them, nor the interpreter's exit.

Past the bound, a load still running is given up: reported received with every block a load error, and
never written afterwards (the engine may already recompute into those blocks). A load whose read writes
into the KV cache itself (the file store reads into the engine's blocks) cannot be given up while it
does: ``flush`` says so, and the load is reported when its read returns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec
from tests.stores.controlled import ControlledFileStore, Fault
from tests.stores.scripted import Gate, ScriptedReads
from tests.stores.test_load_identity import OFFERED, PROMPT, _engine, _plan_load, _ship, _steps_until

BOUND_S = 0.2
SLACK_S = 5.0
"""Beyond its bound, what a bounded call may take on a loaded machine before it counts as hung."""


def _bytes_of(engine: MiniEngine, blocks: tuple[list[int], ...]) -> list[torch.Tensor]:
    return [
        engine._block(layer, block_id).clone()
        for group, ids in enumerate(blocks) for layer in engine.spec.groups[group].layer_names for block_id in ids
        if block_id != engine.spec.null_block_id
    ]


def _timed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    began = time.monotonic()
    try:
        call()
    except BaseException as error:  # noqa: BLE001 (returned to the test)
        return time.monotonic() - began, error
    return time.monotonic() - began, None


def test_a_flush_past_its_bound_gives_a_stuck_load_up_and_the_late_read_writes_nothing() -> None:
    backend = ScriptedReads()
    engine = _engine(backend)
    gate = Gate()
    backend.then(gate)
    _, blocks = _plan_load(engine, "stuck")
    _ship(engine)
    assert gate.reached.wait(10)
    before = _bytes_of(engine, blocks)
    took, error = _timed(lambda: engine.connector.flush(timeout_s=BOUND_S))
    assert took < BOUND_S + SLACK_S
    assert isinstance(error, TimeoutError) and "1 given up, reported failed" in str(error), error
    errors = engine._receive("stuck")
    promised = {g: {b for b in ids[: OFFERED // 16] if b != engine.spec.null_block_id} for g, ids in enumerate(blocks)}
    assert all(ids <= errors.get(g, set()) for g, ids in promised.items()), "its blocks are not all load errors"
    gate.open()  # the read returns now, long after the engine was told
    _plan_load(engine, "after")  # behind it on the reader: once it is received, the late read is over
    _ship(engine)
    assert _steps_until(engine, "after", 1) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _bytes_of(engine, blocks), strict=True)), (
        "the late read wrote into the blocks of a load that was given up"
    )
    assert engine.receipts["stuck"] == 1


def test_close_is_bounded_and_the_loads_it_gives_up_are_still_reported() -> None:
    backend = ScriptedReads()
    engine = _engine(backend)
    gate = Gate()
    backend.then(gate)
    _plan_load(engine, "stuck")
    _ship(engine)
    assert gate.reached.wait(10)
    took, error = _timed(lambda: engine.connector.close(timeout_s=BOUND_S))
    gate.open()
    assert took < BOUND_S + SLACK_S
    assert isinstance(error, TimeoutError) and "at close, reported failed" in str(error), error
    _, recving = engine.connector.get_finished(set())
    assert recving == {"stuck"}
    assert engine.connector.get_block_ids_with_load_errors()


def test_a_read_stuck_inside_the_kv_cache_is_not_given_up_by_flush_and_is_reported_when_it_returns(
    tmp_path: Path,
) -> None:
    spec = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
    store = ControlledFileStore(spec, root=tmp_path, expected=lambda key: None)
    store.controlled.run_freely()
    engine = MiniEngine(spec, store)
    engine.run("seed", PROMPT)
    store.flush()
    stuck = Fault("stuck", released=threading.Event())
    store.controlled.arm_read(stuck)
    _plan_load(engine, "in place")
    _ship(engine)
    deadline = time.monotonic() + 10
    while not store.controlled.stuck["read"] and time.monotonic() < deadline:
        time.sleep(0.01)
    took, error = _timed(lambda: store.flush(timeout_s=BOUND_S))
    assert took < BOUND_S + SLACK_S
    assert isinstance(error, TimeoutError) and "1 still reading into the KV cache" in str(error), error
    assert stuck.released is not None
    stuck.released.set()
    assert engine._receive("in place") == {}, "the load ran whole: no block failed"
    store.close()


def test_a_stuck_read_does_not_hold_the_interpreter_at_exit() -> None:
    script = textwrap.dedent("""
        from tests.stores.scripted import Gate, ScriptedReads
        from tests.stores.test_load_identity import _engine, _plan_load, _ship
        backend = ScriptedReads()
        engine = _engine(backend)
        gate = Gate(timeout_s=600)
        backend.then(gate)
        _plan_load(engine, "stuck")
        _ship(engine)
        assert gate.reached.wait(30)
        print("exiting with a read stuck", flush=True)
    """)
    root = str(Path(__file__).parents[2])
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError("the interpreter waited for the stuck read at exit (killed after 90 s)") from expired
    assert done.returncode == 0 and "exiting with a read stuck" in done.stdout, done.stderr[-2000:]
    assert time.monotonic() - began < 80
