"""Random schedules against a stack whose children fail at random points and report sloppily.

An engine drives ``MultiConnector`` (flat, or with a nested stack) step by step (finish, build, bind, report,
update) while hypothesis picks which child raises where, which saves complete,
and which children repeat a report, report a save they did not accept, or
report a load they are not doing. After every step:

- no early free: a request comes back in ``finished_sending`` only when every
  child that accepted its save has reported it, and only if the engine kept it;
- no duplicate: a request (ids are never reused here) is reported once;
- a receive is reported once, after its loader reported it, and only for a load
  the engine waits for;
and at the end, once the faults stop and every child completes its work, no
completion is lost: every request the engine kept is reported.

A child that raises does so before touching its own state (it reports again
later); what its *siblings* handed over is the stack's to keep.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from capkv import BlockIds, CapkvError, FinishError, KVConnectorBase, KVConnectorOutput, MultiConnector, Request
from tests.fakes import Req

SCHEDULES = int(__import__("os").environ.get("CAPKV_SCHEDULES", "2000"))
STEPS = 20
FAULTY = ("request_finished_all_groups", "build_connector_meta", "bind_connector_metadata", "get_finished",
          "update_connector_output", "get_num_new_matched_tokens", "update_state_after_alloc")


class Child(KVConnectorBase[Request]):
    """A child with real per-step state: plans saves at finish, ships them in its metadata, reports later."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.fail: set[str] = set()
        self.accept = True
        self.hit: tuple[int, bool] = (0, False)
        self.planned: list[str] = []
        self.in_flight: set[str] = set()
        self.done: set[str] = set()
        self.accepted: set[str] = set()
        self.reported: set[str] = set()
        self.loading: set[str] = set()
        self.loaded: set[str] = set()
        self.recv_reported: set[str] = set()
        self.extra_sends: set[str] = set()
        self.extra_recvs: set[str] = set()

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail:
            self.fail.discard(method)
            raise RuntimeError(f"child {self.index} fails in {method}")

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self._maybe_fail("get_num_new_matched_tokens")
        return self.hit

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._maybe_fail("update_state_after_alloc")
        if num_external_tokens:
            self.loading.add(request.request_id)

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, None]:
        self._maybe_fail("request_finished_all_groups")
        if self.accept:
            self.planned.append(request.request_id)
            self.accepted.add(request.request_id)
        return self.accept, None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        self._maybe_fail("build_connector_meta")
        planned, self.planned = tuple(self.planned), []
        return planned

    def bind_connector_metadata(self, connector_metadata: Any, /) -> None:
        self.in_flight.update(connector_metadata)
        self._maybe_fail("bind_connector_metadata")

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        self._maybe_fail("update_connector_output")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        self._maybe_fail("get_finished")
        sending = self.done | self.extra_sends
        recving = self.loaded | self.extra_recvs
        self.reported |= sending  # a sloppy report counts as the child's word, as the stack must take it
        self.recv_reported |= recving
        self.done, self.extra_sends, self.loaded, self.extra_recvs = set(), set(), set(), set()
        return sending or None, recving or None


class StackSchedules(RuleBasedStateMachine):
    schedules = 0

    @initialize(n=st.integers(1, 4), nested=st.booleans())
    def build(self, n: int, nested: bool) -> None:
        StackSchedules.schedules += 1
        self.kids = [Child(i) for i in range(n)]
        if nested and n >= 3:  # the last children in a stack of their own: #1, #2, #3.1, #3.2
            self.stack: Any = MultiConnector(*self.kids[:2], MultiConnector(*self.kids[2:]))
        else:
            self.stack = MultiConnector(*self.kids)
        self.next_id = 0
        self.kept: set[str] = set()          # finished requests whose blocks the engine keeps
        self.released: set[str] = set()      # ... and that came back in finished_sending
        self.waiting_load: dict[str, int] = {}   # async loads the engine waits for -> loader
        self.received: set[str] = set()

    # ---- what the engine does -------------------------------------------------------

    @rule(accepts=st.lists(st.booleans(), min_size=4, max_size=4))
    def finish_a_request(self, accepts: list[bool]) -> None:
        request_id = f"r{self.next_id}"
        self.next_id += 1
        for kid, accept in zip(self.kids, accepts):
            kid.accept = accept
        try:
            delay_free, _ = self.stack.request_finished_all_groups(Req(request_id), ([1],))
        except FinishError as error:
            delay_free = error.delay_free
        assert delay_free == any(request_id in kid.accepted for kid in self.kids), "delay_free is the truth"
        if delay_free:
            self.kept.add(request_id)

    @rule(loader=st.integers(0, 3), async_load=st.booleans())
    def start_a_load(self, loader: int, async_load: bool) -> None:
        request_id = f"r{self.next_id}"
        self.next_id += 1
        for kid in self.kids:
            kid.hit = (16, async_load) if kid.index >= loader % len(self.kids) else (0, False)
        try:
            tokens, load_async = self.stack.get_num_new_matched_tokens(Req(request_id), 0)
        except CapkvError:
            return  # asked again later; this one is abandoned
        if not tokens:
            return
        try:
            self.stack.update_state_after_alloc(Req(request_id), ([1],), tokens)
        except CapkvError as error:
            if not getattr(error, "partial"):
                return  # the loader failed to take the allocation: the engine gives the load up
        if load_async:
            self.waiting_load[request_id] = loader % len(self.kids)

    @rule()
    def engine_step(self) -> None:
        try:
            metadata = self.stack.build_connector_meta(None)
        except CapkvError as error:
            metadata = getattr(error, "partial")
        try:
            self.stack.bind_connector_metadata(metadata)
        except CapkvError:
            pass
        try:
            sending, recving = self.stack.get_finished(set())
        except CapkvError:
            sending = recving = None
        self.stack.clear_connector_metadata()
        for request_id in sending or ():
            assert request_id in self.kept, f"{request_id} reported sent, but no child was saving it"
            assert request_id not in self.released, f"{request_id} reported sent twice"
            owed = [kid.index for kid in self.kids if request_id in kid.accepted and request_id not in kid.reported]
            assert not owed, f"early free: {request_id} reported while children {owed} still copy it"
            self.released.add(request_id)
        for request_id in recving or ():
            assert request_id in self.waiting_load, f"receive of {request_id} that nobody waits for"
            assert request_id not in self.received, f"receive of {request_id} reported twice"
            loader = self.kids[self.waiting_load[request_id]]
            assert request_id in loader.recv_reported, f"receive of {request_id} before its loader reported it"
            self.received.add(request_id)
        try:
            self.stack.update_connector_output(KVConnectorOutput())
        except CapkvError:
            pass

    # ---- what the children do --------------------------------------------------------

    @rule(child=st.integers(0, 3), method=st.sampled_from(FAULTY))
    def a_child_will_fail(self, child: int, method: str) -> None:
        self.kids[child % len(self.kids)].fail.add(method)

    @rule(child=st.integers(0, 3), pick=st.integers(0, 1000))
    def a_save_completes(self, child: int, pick: int) -> None:
        kid = self.kids[child % len(self.kids)]
        if kid.in_flight:
            request_id = sorted(kid.in_flight)[pick % len(kid.in_flight)]
            kid.in_flight.discard(request_id)
            kid.done.add(request_id)

    @rule(child=st.integers(0, 3), pick=st.integers(0, 1000))
    def a_load_completes(self, child: int, pick: int) -> None:
        kid = self.kids[child % len(self.kids)]
        if kid.loading:
            request_id = sorted(kid.loading)[pick % len(kid.loading)]
            kid.loading.discard(request_id)
            kid.loaded.add(request_id)

    @precondition(lambda self: self.next_id > 0)
    @rule(child=st.integers(0, 3), pick=st.integers(0, 1000), send=st.booleans())
    def a_child_reports_sloppily(self, child: int, pick: int, send: bool) -> None:
        """A repeat, a report of a save it did not accept, or of a load it is not doing."""
        kid = self.kids[child % len(self.kids)]
        request_id = f"r{pick % self.next_id}"
        (kid.extra_sends if send else kid.extra_recvs).add(request_id)

    # ---- the end: faults stop, work completes, nothing is lost -------------------------

    def teardown(self) -> None:
        if not hasattr(self, "kids"):
            return
        for kid in self.kids:
            kid.fail.clear()
        for _ in range(3):
            for kid in self.kids:
                kid.done |= kid.in_flight
                kid.in_flight.clear()
                kid.loaded |= kid.loading
                kid.loading.clear()
            self.engine_step()
        lost = self.kept - self.released
        assert not lost, f"completions lost: {sorted(lost)} kept by the engine, never reported"
        unreceived = set(self.waiting_load) - self.received
        assert not unreceived, f"receives lost: {sorted(unreceived)}"


def test_random_schedules_with_faulty_children_never_free_early_lose_or_repeat() -> None:
    StackSchedules.schedules = 0
    started = time.perf_counter()
    log = logging.getLogger("capkv.composite")
    level = log.level
    log.setLevel(logging.ERROR)  # sloppy reports are dropped by design here (setLevel: it clears the logger cache)
    try:
        run_state_machine_as_test(
            StackSchedules,
            settings=settings(
                max_examples=SCHEDULES,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        log.setLevel(level)
    elapsed = time.perf_counter() - started
    print(f"\n{StackSchedules.schedules} schedules of up to {STEPS} steps in {elapsed:.1f} s")
    assert StackSchedules.schedules >= SCHEDULES
