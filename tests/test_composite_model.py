"""The composite against a reference model of the engine and its KV: a hypothesis state machine.

An engine (the model) admits, runs, preempts, aborts and finishes requests of 4 blocks of 16 tokens through
``MultiConnector`` over 1 to 3 children, each loading synchronously or asynchronously, promoted into or not.
Hypothesis picks the children's hits, which loads fail (all or part of their blocks), when each load and save
completes, stray and repeated reports, and what the engine does: it reuses request ids (the old request may
still wait for its load), caps a hit (to 0, or fewer blocks), fails an allocation after asking, aborts
requests mid-load (also while a step is in flight, as vLLM's asynchronous scheduling does), preempts, and
skips an empty step output (as vLLM does). A request may start with a local prefix hit (its first block,
computed by the engine). Failed loads are recomputed or end the request, by a policy drawn per run (vLLM's
``kv_load_failure_policy``), in vLLM's order: the engine acts on the step's load errors before it hands the
connector the step's output. As vLLM does, the engine keeps the blocks of a request aborted while it waits
for its asynchronous load until that load's receive, and frees them then.

The model knows which blocks hold what they should (``filled``). After every step it asserts:

- no block saved that was never filled: every block a child is handed at finish, below the request's
  computed tokens, holds its KV (or is the null block);
- no early free: a send is reported only after every child that accepted the save reported it, and the
  receive of a request aborted mid-load (which frees its blocks) only after every child that accepted a save
  of its blocks did;
- no double free: a request aborted mid-load is never also kept by the stack (``delay_free``): vLLM would
  free its blocks at the first of the two reports and fail on the second;
- no lost or doubled report: each receive reported is owed, matched to the oldest load of that id, after
  every child loading a slice of it asynchronously reported it; every failed block reaches the engine;
- failures end or recompute the request: its computed tokens never reach past a failed block;
and at the end, once every load and save completes, no load or send is left unreported.

The one undecidable case is kept out (see README, "Completions are tracked by child"): a child repeating an
old report of a request while it owes a new load (or save) of the same id, or owing saves of two requests of
one id. A report carries only the id, so it is that load's (or either save's) completion as far as anyone
can tell.

``CAPKV_MODEL_EXAMPLES`` sets how many runs hypothesis makes (default 2000, as issue 24 asks).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from capkv import KVConnectorOutput, MultiConnector
from tests.fakes import HMA
from tests.test_tiers import spec

EXAMPLES = int(os.environ.get("CAPKV_MODEL_EXAMPLES", "2000"))
STEPS = 60
BLOCK = 16
BLOCKS = 4
TOKENS = BLOCK * BLOCKS
NULL = 0
IDS = ("r0", "r1", "r2")
SEEN: Counter[str] = Counter()
"""How often the runs reached each interesting state (printed: a model that never gets there proves nothing)."""


@dataclass
class EReq:
    """What the composite and the children read of a request."""

    request_id: str
    num_computed_tokens: int = 0
    num_tokens: int = TOKENS


@dataclass(eq=False)
class Live:
    """One request of the engine (ids are reused: several may share one)."""

    req: EReq
    status: str = "waiting"  # waiting, loading, running, done, finished
    blocks: list[int] = field(default_factory=list)
    owed_receives: int = 0
    held: bool = False
    ran_load_step: bool = False
    stepped: bool = False
    """Its allocation's step was built: vLLM allocates and builds in one ``schedule()``, so nothing (abort,
    finish) comes between them."""
    aborted_in_flight: bool = False
    """Finished mid-load between a step's worker report and its output reaching the stack: the stack cannot
    know whether that step reported its receive, so its children are handed no blocks to save."""
    saving: int = 0
    """Saves of it that children accepted and have not reported."""
    saving_blocks: int = 0
    """Of those, saves handed a block that is not the null block."""


@dataclass(eq=False)
class KidLoad:
    live: Live
    first: int
    tokens: int
    fail_from: int | None  # the first failed block of the slice (index into the request's blocks), or None
    reported: bool = False

    def blocks(self) -> range:
        return range(self.first // BLOCK, (self.first + self.tokens) // BLOCK)


@dataclass(eq=False)
class Save:
    """A save a child accepted at a request's finish."""

    live: Live
    blocks: bool
    """It was handed a block that is not the null block."""


class Kid(HMA):
    """A child: loads its slice into the model's blocks (or fails to), saves at finish, reports as told."""

    def __init__(self, index: int, load_async: bool, world: Model) -> None:
        super().__init__(f"k{index}", slices=True, load_async=load_async)
        self.world = world
        self.end = 0  # it holds tokens [0, end) of every prompt: its hit is what lies beyond the asked position
        self.accept = False
        self.fail_from: int | None = None  # the next load fails from this block of its slice on
        self.asked: dict[str, int] = {}
        self.unshipped: list[KidLoad] = []
        self.in_flight: list[KidLoad] = []
        self.owed: list[KidLoad] = []  # asynchronous loads not reported yet (in flight or done)
        self.saves_planned: list[Save] = []
        self.saves: list[Save] = []
        self.saved: list[Save] = []
        """Saves complete, to report with the next ``get_finished``."""
        self.accepted: dict[str, int] = {}  # request id -> saves accepted and not reported
        self.recv_next: list[str] = []
        """Requests whose load completed, in order; an id twice (two loads of a reused id) is reported
        in two calls, as a connector reports a set of ids per call."""
        self.strays_next: set[str] = set()
        """Receives of loads the child does not owe (repeats, strays), shipped with the next ``get_finished``."""
        self.send_next: set[str] = set()
        self.errors_next: set[int] = set()
        self.ever: set[str] = set()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self.asked[request.request_id] = num_computed_tokens
        return max(0, self.end - num_computed_tokens), self.load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int, /) -> None:
        if num_external_tokens:
            live = self.world.live_of(request)
            self.unshipped.append(KidLoad(live, self.asked[request.request_id], num_external_tokens, self.fail_from))
            self.fail_from = None
            self.ever.add(request.request_id)

    def request_finished_all_groups(self, request: Any, block_ids: Any, /) -> tuple[bool, None]:
        self.world.check_finish_blocks(self, request, block_ids[0])
        if self.accept:
            # a stray send of this id not delivered yet would read as this save's completion (the undecidable
            # case, kept out): it is never delivered
            self.send_next.discard(request.request_id)
            save = Save(self.world.live_of(request), any(block != NULL for block in block_ids[0]))
            save.live.saving += 1
            save.live.saving_blocks += save.blocks
            self.saves_planned.append(save)
            self.accepted[request.request_id] = self.accepted.get(request.request_id, 0) + 1
            self.ever.add(request.request_id)
        return self.accept, None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        meta = (tuple(self.unshipped), tuple(self.saves_planned))
        self.unshipped, self.saves_planned = [], []
        return meta

    def bind_connector_metadata(self, connector_metadata: Any, /) -> None:
        loads, saves = connector_metadata
        self.saves.extend(saves)
        for load in loads:
            load.live.ran_load_step = True
            if self.load_async:
                self.in_flight.append(load)
                self.owed.append(load)
                # a stray not yet shipped would now read as this load's completion: the undecidable case
                self.strays_next.discard(load.live.req.request_id)
            else:
                self.world.land(load, self.errors_next)

    def complete_load(self, pick: int) -> None:
        load = self.in_flight[pick % len(self.in_flight)]
        # an id's loads complete in order: a report carries only the id, so a later load of a reused id
        # completing first would read as the earlier one's completion (the undecidable case, kept out)
        load = next(other for other in self.in_flight if other.live.req.request_id == load.live.req.request_id)
        self.in_flight.remove(load)
        self.world.land(load, self.errors_next)
        self.recv_next.append(load.live.req.request_id)
        load.reported = True

    def complete_save(self, pick: int) -> None:
        save = self.saves.pop(pick % len(self.saves))
        self.send_next.add(save.live.req.request_id)
        self.saved.append(save)

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        now = set(self.recv_next)
        later = list(self.recv_next)
        for request_id in now:
            later.remove(request_id)
        sending, recving = self.send_next, now | self.strays_next
        self.send_next, self.recv_next, self.strays_next = set(), later, set()
        for save in self.saved:
            self.accepted[save.live.req.request_id] -= 1
            save.live.saving -= 1
            save.live.saving_blocks -= save.blocks
        self.saved = []
        self.world.reported_sends[self.name] = self.world.reported_sends.get(self.name, set()) | sending
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> dict[int, set[int]]:
        errors, self.errors_next = self.errors_next, set()
        self.world.step_errors |= errors
        return {0: errors} if errors else {}


class Model(RuleBasedStateMachine):
    runs = 0

    @initialize(kinds=st.lists(st.booleans(), min_size=1, max_size=3), promote=st.booleans(),
                recompute=st.booleans(), ends=st.lists(st.integers(0, BLOCKS), min_size=3, max_size=3))
    def build(self, kinds: list[bool], promote: bool, recompute: bool, ends: list[int]) -> None:
        Model.runs += 1
        self.kids = [Kid(i, load_async, self) for i, load_async in enumerate(kinds)]
        for kid, end in zip(self.kids, ends):  # hits from the start, so short runs load too
            kid.end = end * BLOCK
        self.stack: Any = MultiConnector(*self.kids, promote=promote)
        self.stack.bind_kv_spec(spec(BLOCK))
        self.recompute = recompute
        self.lives: dict[str, list[Live]] = {}
        self.filled: dict[int, bool] = {}
        self.next_block = 1
        self.owed: dict[str, list[tuple[Live, list[KidLoad]]]] = {}  # request id -> receives owed, in order
        self.held: dict[str, list[Live]] = {}
        self.step_errors: set[int] = set()
        self.reported_sends: dict[str, set[str]] = {}
        self.failed_at: dict[int, Live] = {}
        self.skip_empty = False
        self.in_window = False
        self.violations: list[str] = []

    # ---- the model's helpers ---------------------------------------------------------------

    def live_of(self, request: Any) -> Live:
        return next(live for live in reversed(self.lives[request.request_id]) if live.req is request)

    def land(self, load: KidLoad, errors: set[int]) -> None:
        """A child's load of its slice ran: its blocks hold their KV, but those from a failed block on."""
        for position in load.blocks():
            block = load.live.blocks[position]
            if load.fail_from is not None and position >= load.blocks().start + load.fail_from:
                errors.add(block)
                SEEN["failed blocks"] += 1
                self.filled[block] = False
                self.failed_at[block] = load.live
            else:
                self.filled[block] = True

    def check_finish_blocks(self, kid: Kid, request: Any, block_ids: list[int]) -> None:
        computed = request.num_computed_tokens // BLOCK
        if NULL in block_ids[:computed]:
            SEEN["finishes handed the null block"] += 1
        for position, block in enumerate(block_ids[:computed]):
            if block != NULL and not self.filled.get(block):  # raised by the invariant: a child's error is contained
                self.violations.append(
                    f"{kid.name} is handed block {block} (position {position}) of {request.request_id} at finish, "
                    f"below its {request.num_computed_tokens} computed tokens, but it never held its KV"
                )

    def _latest(self, request_id: str) -> Live | None:
        lives = self.lives.get(request_id)
        return lives[-1] if lives else None

    def _release_if_done(self, live: Live) -> None:
        if live.status == "finished" and not live.owed_receives and not live.held:
            for block in live.blocks:
                self.filled[block] = False  # freed: the pool reuses it (ids are not, to keep the model simple)
            live.blocks = []

    def _finish(self, live: Live) -> None:
        awaited = live.status == "loading"  # vLLM keeps its blocks until its receive, then frees them
        # between a step's worker report and its output reaching the stack, that receive may be reported already
        live.aborted_in_flight = awaited and self.in_window
        delay_free, _ = self.stack.request_finished_all_groups(live.req, (list(live.blocks),))
        live.status = "finished"
        if awaited:
            SEEN["finishes while the engine waits for the receive"] += 1
        if delay_free and awaited:
            self.violations.append(
                f"{live.req.request_id} finished while the engine waits for its receive, and the stack answered "
                "delay_free=True: the engine frees its blocks at the first of the two reports, and the second "
                "names a request it no longer has (vLLM fails on it)"
            )
        if delay_free:
            live.held = True
            self.held.setdefault(live.req.request_id, []).append(live)
        self._release_if_done(live)

    # ---- what the engine does -------------------------------------------------------------

    @rule(pick=st.sampled_from(IDS))
    def a_request_arrives(self, pick: str) -> None:
        latest = self._latest(pick)
        # reused: the old one may still load, but no child saves it still (a child owing saves of two requests
        # of one id is the undecidable case: an engine reuses an id only once it let the old request go)
        if latest is None or (latest.status == "finished" and not latest.held and not latest.saving):
            if latest is not None and latest.owed_receives:
                SEEN["ids reused while the old request still loads"] += 1
            self.lives.setdefault(pick, []).append(Live(EReq(pick)))

    @rule(pick=st.sampled_from(IDS), cap=st.sampled_from([None, None, 0, 1, 2, 3]), fail_alloc=st.booleans(),
          local=st.sampled_from([0, 0, BLOCK]))
    def admit(self, pick: str, cap: int | None, fail_alloc: bool, local: int) -> None:
        self.a_request_arrives(pick)  # arrives first, when it has not (or its id is free for reuse)
        live = self._latest(pick)
        if live is None or live.status != "waiting":
            return
        offered, load_async = self.stack.get_num_new_matched_tokens(live.req, local)
        if offered is None or fail_alloc:
            return  # asked again later
        accepted = offered if cap is None else min(offered, cap * BLOCK)
        if accepted < offered:
            SEEN["hits capped"] += 1
        live.blocks = [self.next_block + i for i in range(BLOCKS)]
        self.next_block += BLOCKS
        for position, block in enumerate(live.blocks):
            self.filled[block] = position * BLOCK < local  # the local hit: the engine computed it
        before = [len(kid.unshipped) for kid in self.kids]
        self.stack.update_state_after_alloc(live.req, ([*live.blocks],), accepted)
        live.req.num_computed_tokens = local + accepted
        live.ran_load_step = live.stepped = False
        async_loads = [kid.unshipped[-1] for kid, n in zip(self.kids, before) if len(kid.unshipped) > n and kid.load_async]
        if accepted and load_async:
            live.status = "loading"
            live.owed_receives += 1
            self.owed.setdefault(pick, []).append((live, async_loads))
        else:
            live.status = "running"

    @rule(pick=st.sampled_from(IDS))
    def abort(self, pick: str) -> None:
        live = self._latest(pick)
        if live is not None and live.stepped and live.status in ("loading", "running", "done"):
            if live.status == "loading":
                SEEN["aborts mid-load"] += 1
            self._finish(live)

    @rule(pick=st.sampled_from(IDS))
    def finish(self, pick: str) -> None:
        live = self._latest(pick)
        if live is not None and live.status == "done":
            self._finish(live)

    @rule(pick=st.sampled_from(IDS))
    def preempt(self, pick: str) -> None:
        live = self._latest(pick)
        if live is not None and live.status in ("running", "done") and not live.owed_receives and live.ran_load_step:
            for block in live.blocks:
                self.filled[block] = False
            live.blocks, live.status, live.req.num_computed_tokens = [], "waiting", 0
            SEEN["preemptions"] += 1

    @rule(skip=st.booleans())
    def engine_skips_empty_outputs(self, skip: bool) -> None:
        self.skip_empty = skip

    @rule(abort_in_flight=st.sampled_from([None, None, *IDS]))
    def step(self, abort_in_flight: str | None = None) -> None:
        self.step_errors = set()
        scheduled = [live for lives in self.lives.values() for live in lives if live.status == "running"]
        for lives in self.lives.values():
            for live in lives:
                live.stepped = live.stepped or live.status != "waiting"
        metadata = self.stack.build_connector_meta(None)
        self.stack.bind_connector_metadata(metadata)
        self.stack.start_load_kv(None)
        self.stack.wait_for_save()
        sending, recving = self.stack.get_finished(set())
        errors = self.stack.get_block_ids_with_load_errors()
        worker_meta = self.stack.build_connector_worker_meta()
        self.stack.clear_connector_metadata()
        invalid = set(errors.get(0, ()))
        assert self.step_errors <= invalid, f"failed blocks {sorted(self.step_errors - invalid)} never reached the engine"
        self.in_window = True  # until the stack has the step's output
        in_flight = self._latest(abort_in_flight) if abort_in_flight is not None else None
        if in_flight is not None and in_flight.stepped and in_flight.status == "loading":
            SEEN["aborts mid-load with a step in flight"] += 1  # before the engine has the step's output
            self._finish(in_flight)
        # the forward pass: scheduled requests compute the rest of their prompt (on garbage past a failed block)
        failed_first: dict[int, int] = {}
        for block in invalid:
            live = self.failed_at[block]
            if block in live.blocks:
                position = live.blocks.index(block) * BLOCK
                failed_first[id(live)] = min(failed_first.get(id(live), position), position)
        for live in scheduled:
            live.ran_load_step = True
            first_bad = failed_first.get(id(live))
            for position in range(live.req.num_computed_tokens // BLOCK, BLOCKS):
                self.filled[live.blocks[position]] = first_bad is None or position * BLOCK < first_bad
        # the engine acts on the load errors first (vLLM's order)
        for lives in self.lives.values():
            for live in lives:
                first_bad = failed_first.get(id(live))
                if first_bad is None or live.status == "finished":
                    continue
                if self.recompute:
                    live.req.num_computed_tokens = min(live.req.num_computed_tokens, first_bad)
                    if live in scheduled:
                        for position in range(first_bad // BLOCK, BLOCKS):
                            self.filled[live.blocks[position]] = False
                else:
                    SEEN["requests failed by a failed load"] += 1
                    self._finish(live)
        for live in scheduled:
            if live.status == "running" and id(live) not in failed_first:
                live.req.num_computed_tokens = TOKENS
                live.status = "done"
        output = KVConnectorOutput(frozenset(sending or ()), frozenset(recving or ()), worker_meta,
                                   {0: frozenset(invalid)} if invalid else {})
        if not (self.skip_empty and not sending and not recving and not invalid and worker_meta is None):
            self.stack.update_connector_output(output)
        self.in_window = False
        for request_id in recving or ():
            owed = self.owed.get(request_id)
            assert owed, f"a receive of {request_id} that no load owes (doubled or stray)"
            live, loads = owed.pop(0)
            if owed:
                SEEN["receives reported with another load of the id owed"] += 1
            assert all(load.reported for load in loads), f"{request_id}'s receive before its loaders reported it"
            live.owed_receives -= 1
            if live.status == "loading":
                live.status = "running"
            elif live.status == "finished" and not live.owed_receives and not live.held:  # the engine frees it now
                saving = live.saving_blocks if live.aborted_in_flight else live.saving
                assert not saving, f"early free: {request_id}'s receive frees its blocks, {saving} of its saves still run"
            self._release_if_done(live)
        for request_id in sending or ():
            held = self.held.pop(request_id, None)
            assert held, f"a send of {request_id} that no held request owes (doubled or stray)"
            for kid in self.kids:
                assert not kid.accepted.get(request_id), f"early free: {kid.name} still saves {request_id}"
            for live in held:
                live.held = False
                self._release_if_done(live)

    # ---- what the children do --------------------------------------------------------------

    @rule(child=st.integers(0, 2), end=st.integers(0, BLOCKS), accept=st.booleans())
    def a_child_answers(self, child: int, end: int, accept: bool) -> None:
        kid = self.kids[child % len(self.kids)]
        kid.end, kid.accept = end * BLOCK, accept

    @rule(child=st.integers(0, 2), first=st.integers(0, BLOCKS - 1))
    def a_childs_next_load_fails(self, child: int, first: int) -> None:
        self.kids[child % len(self.kids)].fail_from = first

    @rule(child=st.integers(0, 2), pick=st.integers(0, 99))
    def a_load_completes(self, child: int, pick: int) -> None:
        kid = self.kids[child % len(self.kids)]
        if kid.in_flight:
            kid.complete_load(pick)

    @rule(child=st.integers(0, 2), pick=st.integers(0, 99))
    def a_save_completes(self, child: int, pick: int) -> None:
        kid = self.kids[child % len(self.kids)]
        if kid.saves:
            kid.complete_save(pick)

    @rule(child=st.integers(0, 2), pick=st.sampled_from(IDS), send=st.booleans())
    def a_child_repeats_or_strays(self, child: int, pick: str, send: bool) -> None:
        """A report of a request the child owes nothing of now: a repeat, or one it never had."""
        kid = self.kids[child % len(self.kids)]
        if send and not kid.accepted.get(pick):
            kid.send_next.add(pick)
        elif not send and not any(load.live.req.request_id == pick for load in kid.owed if not load.reported) \
                and not any(load.live.req.request_id == pick for load in kid.unshipped):
            kid.strays_next.add(pick)

    @invariant()
    def no_child_handed_an_unfilled_block(self) -> None:
        assert not getattr(self, "violations", None), self.violations

    @invariant()
    def failures_end_or_recompute(self) -> None:
        if not hasattr(self, "kids"):
            return
        for block, live in self.failed_at.items():
            if live.status != "finished" and block in live.blocks and not self.filled.get(block):
                assert live.req.num_computed_tokens <= live.blocks.index(block) * BLOCK or live.status == "loading", (
                    f"{live.req.request_id} computed past its failed block {block}"
                )

    # ---- the end: every load and save completes, nothing is lost ----------------------------

    def teardown(self) -> None:
        if not hasattr(self, "kids"):
            return
        for _ in range(4):
            for kid in self.kids:
                while kid.in_flight:
                    kid.complete_load(0)
                while kid.saves:
                    kid.complete_save(0)
            self.step()
        lost = {request_id: len(owed) for request_id, owed in self.owed.items() if owed}
        assert not lost, f"receives never reported: {lost}"
        unsent = sorted(request_id for request_id, held in self.held.items() if held)
        assert not unsent, f"sends never reported: {unsent}"


def test_the_composite_against_a_model_of_the_engine_and_its_kv() -> None:
    Model.runs = 0
    SEEN.clear()
    started = time.perf_counter()
    log = logging.getLogger("capkv.composite")
    level = log.level
    log.setLevel(logging.ERROR)  # stray reports are dropped by design here (setLevel: it clears the logger cache)
    try:
        run_state_machine_as_test(
            Model,
            settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
                              suppress_health_check=list(HealthCheck)),
        )
    finally:
        log.setLevel(level)
    print(f"\n{Model.runs} runs of up to {STEPS} steps in {time.perf_counter() - started:.1f} s; reached: {dict(SEEN)}")
    assert Model.runs >= EXAMPLES
