"""An engine model for the stores' property test: vLLM's request lifecycle around one connector.

Requests are admitted (a lookup, an allocation, maybe a load), computed, finished, aborted at any
point (mid-load included) and preempted; request ids may be reused once their request finished, even
while an aborted load of it still runs. Each step runs the connector protocol in vLLM's order, with a
scheduler output, and checks as it goes:

- every asynchronous load is reported received exactly once, in order per request id (the engine
  keeps a queue of the loads it waits for, per id, as vLLM keeps the request);
- every block a load wrote is bit-exact, or was reported failed by the time the load was reported;
- a request aborted while its load runs is not held for a save (vLLM would free its blocks twice);
- a finished send is reported only for a request the engine holds, once.

The KV cache, its allocator and the model's KV are :class:`tests.connectors.engine.MiniEngine`'s.
Violations are collected in ``violations`` (the test asserts there are none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from capkv import KVConnectorOutput, KVSpec, finish_request
from tests.connectors.engine import MiniEngine, Req


@dataclass
class Load:
    """One load the engine started: its request's incarnation, the blocks and tokens it fills."""

    request: Request
    blocks: tuple[list[int], ...]
    end: int
    asynchronous: bool


@dataclass
class Request:
    """One incarnation of a request id, as the engine holds it."""

    req: Req
    prompt: list[int]
    blocks: tuple[list[int], ...] = ()
    state: str = "new"
    """``waiting`` (for its asynchronous load), ``scheduled`` (to compute), ``running`` (computed),
    ``preempted``, ``finished``."""
    load: Load | None = None
    """The load started with its last allocation, until it is checked."""
    fresh: bool = True
    """Scheduled next as a new (or resumed) request: the scheduler output carries its whole block table."""
    aborted_mid_load: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id


@dataclass
class Reach:
    """What a run got to, for the test's report."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, count: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + count


class ModelEngine:
    """vLLM's scheduler and worker around ``connector``, over a :class:`MiniEngine`'s KV cache."""

    def __init__(self, spec: KVSpec, connector: Any, reach: Reach, settle: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self.settle = settle
        """Called before the engine asks what finished (the test waits for the store's threads there)."""
        self.connector = connector
        self.mini = MiniEngine(spec, connector)
        self.reach = reach
        self.live: dict[str, Request] = {}
        """Requests holding an id now (not finished)."""
        self.waiting: dict[str, list[Load]] = {}
        """Per request id, the asynchronous loads the engine waits for, oldest first."""
        self.held: dict[str, list[Request]] = {}
        """Finished requests whose blocks the engine keeps for a save (``delay_free``), per id."""
        self.failed: set[tuple[int, int]] = set()
        """``(group, block id)`` reported failed since the block was allocated."""
        self.sync_loads: list[Load] = []
        """Synchronous loads shipped in the step being run."""
        self.unbuilt: set[str] = set()
        """Requests admitted since the last step's metadata was built: vLLM allocates and builds in one
        ``schedule()``, so nothing aborts or preempts them in between."""
        self.violations: list[str] = []
        self.steps = 0

    # ---- the scheduler ---------------------------------------------------------------------

    def free_blocks(self) -> int:
        return min(len(free) for free in self.mini.free)

    def admit(self, request_id: str, prompt: list[int]) -> None:
        """A new request (or a preempted one again): lookup, allocation, the load it is offered."""
        request = self.live.get(request_id) or Request(Req(request_id, list(prompt)), list(prompt))
        if request_id in self.waiting and request_id not in self.live:
            self.reach.add("reused ids while an earlier load of the id ran")
        self.live[request_id] = request
        self.unbuilt.add(request_id)
        request.req.num_computed_tokens = 0
        offered, load_async = self.connector.get_num_new_matched_tokens(request.req, 0)
        offered = offered or 0
        blocks = self.mini._allocate(len(prompt), offered)
        request.blocks = blocks
        self.connector.update_state_after_alloc(request.req, blocks, offered)
        request.fresh = True
        request.load = None
        if not offered:
            request.state = "scheduled"
            return
        load = Load(request, blocks, offered, bool(load_async))
        request.load = load
        request.req.num_computed_tokens = offered
        if load_async:
            request.state = "waiting"
            self.waiting.setdefault(request_id, []).append(load)
            self.reach.add("asynchronous loads")
        else:
            request.state = "scheduled"
            self.sync_loads.append(load)
            self.reach.add("synchronous loads")

    def finish(self, request_id: str, *, abort: bool) -> None:
        """The request ends (``abort``: at any point past its scheduling; else once computed). While its
        load runs, ``num_computed_tokens`` counts the tokens it loads, as vLLM's does."""
        request = self.live.pop(request_id)
        mid_load = request.state == "waiting"
        blocks = request.blocks if request.state != "preempted" else tuple([] for _ in self.spec.groups)
        delay_free, _ = finish_request(self.connector, request.req, blocks)
        request.state = "finished"
        if mid_load:
            request.aborted_mid_load = True
            self.reach.add("aborts mid-load")
            if delay_free:
                self.violations.append(f"{request_id}: held for a save while its load runs (vLLM frees it twice)")
            return  # its blocks are the load's until it is reported received
        if delay_free:
            self.held.setdefault(request_id, []).append(request)
        else:
            self._free(request.blocks)
        if abort:
            self.reach.add("aborts")

    def preempt(self, request_id: str) -> None:
        """A running request loses its blocks; it is admitted again later (a lookup, maybe a load)."""
        request = self.live[request_id]
        self._free(request.blocks)
        request.blocks = ()
        request.state = "preempted"
        request.req.num_computed_tokens = 0
        self.reach.add("preemptions")

    def _free(self, blocks: tuple[list[int], ...]) -> None:
        for group, ids in enumerate(blocks):
            for block_id in ids:
                self.failed.discard((group, block_id))
        self.mini._free(blocks)

    # ---- a step ------------------------------------------------------------------------------

    def step(self) -> None:
        """Schedule, build, load, compute, save, report; then the engine takes the outputs in."""
        connector = self.connector
        self.steps += 1
        scheduled = [r for r in self.live.values() if r.state == "scheduled"]
        output = _scheduler_output(scheduled)
        metadata = connector.build_connector_meta(output)
        self.unbuilt.clear()
        connector.bind_connector_metadata(metadata)
        connector.start_load_kv(None)
        for request in scheduled:
            self.mini.compute(request.req, request.blocks, request.req.num_computed_tokens, len(request.prompt))
        connector.wait_for_save()
        self.settle()
        sending, recving = connector.get_finished(set())
        errors = connector.get_block_ids_with_load_errors()
        worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        connector.update_connector_output(KVConnectorOutput(
            finished_sending=frozenset(sending or ()), finished_recving=frozenset(recving or ()),
            worker_meta=worker_meta,
        ))
        self._failed(errors)
        shipped, self.sync_loads = self.sync_loads, []
        loading = {id(load.request) for load in shipped}
        for request in scheduled:
            if id(request) not in loading:
                request.state = "running"
                request.req.num_computed_tokens = len(request.prompt)
        for load in shipped:
            self._loaded(load)
        self._finished(sending, recving)

    def drain_after_close(self, calls: int = 5) -> None:
        """The connector closed: take in what it still reports (loads over, or given up and failed)."""
        for _ in range(calls):
            self.settle()
            sending, recving = self.connector.get_finished(set())
            self._failed(self.connector.get_block_ids_with_load_errors())
            self._finished(sending, recving)

    def _failed(self, errors: dict[int, set[int]]) -> None:
        for group, ids in errors.items():
            self.failed.update((group, block_id) for block_id in ids)

    def _finished(self, sending: set[str] | None, recving: set[str] | None) -> None:
        for request_id in recving or ():
            self._received(request_id)
        for request_id in sending or ():
            holders = self.held.get(request_id)
            if not holders:
                self.violations.append(f"{request_id}: reported sent, but the engine holds no blocks for it")
                continue
            self._free(holders.pop(0).blocks)
            if not holders:
                del self.held[request_id]

    def _received(self, request_id: str) -> None:
        loads = self.waiting.get(request_id)
        if not loads:
            self.violations.append(f"{request_id}: reported received, but the engine waits for no load of it")
            return
        load = loads.pop(0)
        if not loads:
            del self.waiting[request_id]
        self.reach.add("asynchronous loads reported")
        request = load.request
        if request.aborted_mid_load:
            self._check(load)
            self._free(load.blocks)
            return
        self._loaded(load)

    def _loaded(self, load: Load) -> None:
        """A load is over and its errors are in: check its blocks, and roll the request back to its first
        failed block (vLLM's recompute policy)."""
        restart = self._check(load)
        request = load.request
        request.load = None
        if restart < load.end:
            self.reach.add("loads with failed blocks")
        if load.asynchronous:  # scheduled now, from its first failed block (or the load's end)
            request.state, request.fresh = "scheduled", True
            request.req.num_computed_tokens = restart
        elif restart < load.end:  # computed this step past blocks that failed: again from the first
            request.state = "scheduled"
            request.req.num_computed_tokens = restart
        else:
            request.state = "running"
            request.req.num_computed_tokens = len(request.prompt)

    def _check(self, load: Load) -> int:
        """Every block ``load`` filled is the model's bit for bit, or reported failed; the first failed token."""
        restart = load.end
        request = load.request
        for group, described in enumerate(self.spec.groups):
            size = described.block_size or 1
            for index in range(load.end // size):
                block_id = load.blocks[group][index]
                if block_id == self.spec.null_block_id:
                    continue
                if (group, block_id) in self.failed:
                    restart = min(restart, index * size)
                    continue
                wrong = self.mini.wrong_positions(request.req, group, index, block_id)
                if wrong:
                    self.violations.append(
                        f"{request.request_id}: group {group} block {index} loaded wrong KV (positions {wrong[:3]}...) "
                        "and was not reported failed"
                    )
        return restart


def _scheduler_output(scheduled: list[Request]) -> SimpleNamespace:
    """vLLM's ``SchedulerOutput`` as a store reads it: new (or resumed) requests with their whole block
    tables, the others by id; every scheduled request computes the rest of its prompt."""
    new = [
        SimpleNamespace(req_id=r.request_id, block_ids=r.blocks, num_computed_tokens=r.req.num_computed_tokens)
        for r in scheduled if r.fresh
    ]
    cached = [r for r in scheduled if not r.fresh]
    for request in scheduled:
        request.fresh = False
    return SimpleNamespace(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r.request_id for r in cached], new_block_ids=[None] * len(cached),
            num_computed_tokens=[r.req.num_computed_tokens for r in cached], resumed_req_ids=set(),
        ),
        num_scheduled_tokens={r.request_id: len(r.prompt) - r.req.num_computed_tokens for r in scheduled},
    )
