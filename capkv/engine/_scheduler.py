"""The scheduler: which requests run each step, and the connector's scheduler side, in vLLM's order."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from capkv._homes import publish
from capkv.capabilities._hma import describe
from capkv.capabilities._serving import finish_request
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import KVConnectorOutput, KVTransferParams
from capkv.engine._block_tables import BlockTables
from capkv.engine._hit_counts import count_failed_load, count_hits
from capkv.engine._model import ModelShape
from capkv.engine._outputs import (
    CachedRequestData,
    LoadCheck,
    Mismatch,
    ModelRunnerOutput,
    NewRequestData,
    ScheduledRequest,
    SchedulerOutput,
)
from capkv.engine._request import Request, RequestStatus
from capkv.engine._stats import EngineStats
from capkv.engine._verify import VerificationError, Verifier
from capkv.errors import ConfigError, ContractError

__all__ = ["FinishedRequest", "Scheduler"]


@dataclass(frozen=True)
class FinishedRequest:
    request: Request
    kv_transfer_params: KVTransferParams | None


class Scheduler:
    """Admits, runs and finishes requests against one block pool and one connector.

    For a waiting request, in vLLM's order: find the local prefix hit, ask the connector how many more tokens
    it can load (``None``: ask again next step), allocate blocks, tell the connector
    (``update_state_after_alloc``). After scheduling, ``build_connector_meta`` packs the step for the worker
    side. When the worker reports back: roll back requests whose loads failed, append the sampled tokens,
    finish requests (through :func:`capkv.finish_request`), hand the connector its output, free the blocks of
    requests whose asynchronous saves completed, and collect events. Asynchronous loads park a request in
    ``WAITING_FOR_REMOTE_KVS`` until the worker reports it in ``finished_recving``; a request whose blocks a
    connector keeps (``delay_free``) holds them until it comes back in ``finished_sending``. Before a request
    is handed to the connector at finish, its whole KV is verified. Unlike vLLM there is no preemption and no
    chunked prefill: admission reserves a request's worst-case blocks, so whatever was admitted runs to the end.
    """

    def __init__(
        self,
        shape: ModelShape,
        connector: KVConnector[Request],
        tables: BlockTables,
        stats: EngineStats,
        verifier: Verifier | None,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.shape = shape
        self.connector = connector
        self.tables = tables
        self.stats = stats
        self.verifier = verifier
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[FinishedRequest] = []
        self._requests: dict[str, Request] = {}
        self._pending_checks: dict[str, LoadCheck] = {}
        """Loaded ranges not yet verified (async loads wait here until the request runs)."""
        self._received: set[str] = set()
        """Async loads the worker reported complete, not yet resumed."""
        self._delayed_free: dict[str, Request] = {}
        self._finished_since_last_step: set[str] = set()
        self._sent_lengths: dict[str, list[int]] = {}
        """Per running request, how much of each group's table the scheduler outputs have told."""
        self._step = 0

    # ---- queue ---------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise ConfigError(f"request id {request.request_id!r} is already in the engine", value=request.request_id)
        most = self._max_blocks(request)
        if most > self.tables.pool.num_blocks - 1:
            raise ConfigError(
                f"request {request.request_id!r} needs up to {most} blocks; the pool has "
                f"{self.tables.pool.num_blocks - 1} (raise num_blocks)",
                value=most,
            )
        self._requests[request.request_id] = request
        self.waiting.append(request)
        self.stats.prompt_tokens += request.num_prompt_tokens

    def _max_blocks(self, request: Request) -> int:
        """The most blocks ``request`` ever holds at once.

        A sliding-window group holds the whole prompt while computing it, and
        afterwards at most the blocks its window spans.
        """
        num_tokens = request.num_prompt_tokens + request.max_tokens
        total = 0
        for group in self.shape.groups:
            blocks = math.ceil(num_tokens / group.block_size)
            if group.sliding_window is not None:
                window_blocks = math.ceil((group.sliding_window - 1) / group.block_size) + 2
                blocks = max(math.ceil(request.num_prompt_tokens / group.block_size), min(blocks, window_blocks))
            total += blocks
        return total

    def _reserved(self) -> int:
        """Blocks the admitted requests may still take; new requests must leave them free.

        Reserving each request's worst case at admission is what lets this engine
        do without preemption: whatever was admitted can always run to the end.
        """
        growing = (RequestStatus.RUNNING, RequestStatus.WAITING_FOR_REMOTE_KVS)
        return sum(
            max(0, self._max_blocks(r) - self.tables.num_held(r))
            for r in self._requests.values()
            if r.status in growing
        )

    @property
    def has_unfinished(self) -> bool:
        """Requests still waiting or running, or holding blocks for a connector's save."""
        return bool(self.waiting or self.running or self._delayed_free)

    @property
    def held_for_connector(self) -> tuple[str, ...]:
        """Finished requests whose blocks the engine keeps until the connector reports them sent."""
        return tuple(self._delayed_free)

    @property
    def transfers_in_flight(self) -> bool:
        return bool(self._delayed_free) or any(r.status is RequestStatus.WAITING_FOR_REMOTE_KVS for r in self.waiting)

    # ---- schedule ------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then waiting ones while room remains."""
        scheduled: list[ScheduledRequest] = []
        budget = self.max_num_batched_tokens
        for request in self.running:
            if not self.tables.grow(request):
                continue
            scheduled.append(self._scheduled(request, request.num_computed_tokens))
            budget -= request.num_tokens - request.num_computed_tokens
        held_back: list[Request] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting.popleft()
            if request.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
                if request.request_id not in self._received:
                    held_back.append(request)
                    continue
                self._received.discard(request.request_id)
                self.tables.cache_computed(request)
            else:
                if scheduled and request.num_tokens > budget:
                    held_back.append(request)
                    break
                outcome = self._allocate(request)
                if outcome != "ok":
                    held_back.append(request)
                    if outcome == "full":
                        break  # first come, first served: nobody overtakes a request waiting for room
                    continue
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            start = min(request.num_computed_tokens, request.num_tokens - 1)
            scheduled.append(self._scheduled(request, start))
            budget -= request.num_tokens - start
        self.waiting.extendleft(reversed(held_back))
        self._step += 1
        output = SchedulerOutput(
            self._step, scheduled, self._finished_since_last_step, self.tables.take_fresh_blocks()
        )
        output.scheduled_new_reqs, output.scheduled_cached_reqs = self._request_data(scheduled)
        self._finished_since_last_step = set()
        output.kv_connector_metadata = self.connector.build_connector_meta(output)
        return output

    def _request_data(self, scheduled: list[ScheduledRequest]) -> tuple[list[NewRequestData], CachedRequestData]:
        """What vLLM's scheduler output says of the step's requests: new ones with their tables,
        the others with the ids appended since they were last scheduled."""
        new: list[NewRequestData] = []
        cached = CachedRequestData([], set(), [], [])
        for item in scheduled:
            request_id = item.request_id
            lengths = [len(ids) for ids in item.block_ids]
            sent = self._sent_lengths.get(request_id)
            self._sent_lengths[request_id] = lengths
            if sent is None:
                new.append(NewRequestData(request_id, item.block_ids, item.start))
                continue
            appended = tuple(ids[n:] for ids, n in zip(item.block_ids, sent, strict=True))
            cached.req_ids.append(request_id)
            cached.new_block_ids.append(appended if any(appended) else None)
            cached.num_computed_tokens.append(item.start)
        return new, cached

    def _allocate(self, request: Request) -> Literal["ok", "loading", "retry", "full"]:
        """Find hits and allocate blocks for a new request.

        ``"ok"``: it runs this step; ``"loading"``: it waits for an async load;
        ``"retry"``: the connector is still looking; ``"full"``: no room yet.
        """
        if self._max_blocks(request) > self.tables.pool.num_free - self._reserved():
            return "full"
        hit = self.tables.find_local_hit(request)
        external, load_async = self.connector.get_num_new_matched_tokens(request, hit.num_tokens)
        if external is None:
            return "retry"
        external = min(external, request.num_tokens - hit.num_tokens)
        if not self.tables.admit(request, hit, external):
            return "full"
        self.connector.update_state_after_alloc(request, self.tables.block_ids(request), external)
        request.num_computed_tokens = hit.num_tokens + external
        count_hits(self.stats, self.shape, self.tables, request, hit, external)
        if external == 0:
            return "ok"
        self._pending_checks[request.request_id] = LoadCheck(hit.num_tokens, hit.num_tokens + external)
        if load_async:
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            return "loading"
        return "ok"

    def _scheduled(self, request: Request, start: int) -> ScheduledRequest:
        return ScheduledRequest(
            request, start, request.num_tokens, self.tables.block_ids(request),
            self._pending_checks.pop(request.request_id, None),
        )

    # ---- results -------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, result: ModelRunnerOutput) -> list[FinishedRequest]:
        """Apply one step's results; returns the requests that finished."""
        kv_output = result.kv_connector_output
        rollback = self._roll_back_failed_loads(output, kv_output)
        self._check_loads(result.load_mismatches, rollback)
        finished: list[FinishedRequest] = []
        for item in output.scheduled:
            request = item.request
            self.stats.computed_tokens += item.stop - item.start
            if request.request_id in rollback:
                continue
            request.num_computed_tokens = item.stop
            request.append_output_token(result.sampled_token_ids[request.request_id])
            self.tables.cache_computed(request)
            if request.is_done:
                finished.append(self._finish(request))
        self.connector.update_connector_output(kv_output)
        for request_id in kv_output.finished_recving:
            self._on_received(request_id)
        for request_id in kv_output.finished_sending:
            self._on_sent(request_id)
        self.stats.kv_events += sum(1 for _ in self.connector.take_events())
        self.stats.steps += 1
        self.finished.extend(finished)
        return finished

    def _roll_back_failed_loads(self, output: SchedulerOutput, kv_output: KVConnectorOutput) -> dict[str, int]:
        """Requests whose loaded blocks failed recompute from the first failed block on.

        Returns, per rolled-back request, the position it resumes from.
        """
        invalid = kv_output.invalid_block_ids
        if not any(invalid.values()):
            return {}
        self.stats.load_error_blocks += sum(len(ids) for ids in invalid.values())
        for group, ids in invalid.items():
            if 0 <= group < len(self.stats.groups):
                self.stats.groups[group].load_error_blocks += len(ids)
        loading = [(s.request, s.load_check) for s in output.scheduled if s.load_check is not None]
        loading += [(r, self._pending_checks[r.request_id]) for r in self.waiting if r.request_id in self._pending_checks]
        self._check_load_errors(invalid, loading)
        rollback: dict[str, int] = {}
        for request, check in loading:
            first = self._first_invalid_position(request, check, invalid)
            if first is None:
                continue
            rollback[request.request_id] = first
            count_failed_load(self.stats, self.shape, self.tables, request, check, first)
            request.num_computed_tokens = min(request.num_computed_tokens, first)
            if request.request_id in self._pending_checks:
                self._pending_checks[request.request_id] = LoadCheck(check.start, first)
        return rollback

    def _check_load_errors(self, invalid: Mapping[int, frozenset[int]], loading: list[tuple[Request, LoadCheck]]) -> None:
        """Refuse a failed block that no request was loading into: the engine could not tell whom to roll back."""
        for group, table_of in ((g, [self.tables.block_ids(r)[g.index] for r, _ in loading]) for g in self.shape.groups):
            loaded: set[int] = set()
            for table, (_, check) in zip(table_of, loading, strict=True):
                first, stop = check.start // group.block_size, -(-check.stop // group.block_size)
                loaded.update(table[first:stop])
            stray = sorted(invalid.get(group.index, frozenset()) - loaded)
            if stray:
                name = describe(self.connector)
                raise ContractError(
                    f'"{name}".get_block_ids_with_load_errors reported block(s) {stray} of group {group.index} as '
                    f"failed, but no request is loading into them in that group (blocks being loaded: {sorted(loaded)}); "
                    "report each failed block under the group whose table holds it",
                    connector=name, method="get_block_ids_with_load_errors", group=group.index, value=stray,
                )

    def _first_invalid_position(
        self, request: Request, check: LoadCheck, invalid: Mapping[int, frozenset[int]]
    ) -> int | None:
        first: int | None = None
        for group, table in zip(self.shape.groups, self.tables.block_ids(request), strict=True):
            bad = invalid.get(group.index, frozenset())
            for index, block in enumerate(table):
                position = index * group.block_size
                if block in bad and position + group.block_size > check.start and position < check.stop:
                    start = max(position, check.start)
                    first = start if first is None else min(first, start)
                    break
        return first

    def _check_loads(self, mismatches: list[Mismatch], rollback: dict[str, int]) -> None:
        """Raise on a loaded block that differs from recomputation, unless its load was reported failed."""
        for mismatch in mismatches:
            resume = rollback.get(mismatch.request_id)
            if resume is not None and mismatch.position >= resume:
                continue
            raise VerificationError(mismatch)

    def _finish(self, request: Request) -> FinishedRequest:
        self.running.remove(request)
        request.status = RequestStatus.FINISHED
        self.tables.remove_skipped(request)
        if self.verifier is not None:
            mismatch = self.verifier.check_request(request, self.tables.block_ids(request))
            if mismatch is not None:
                raise VerificationError(mismatch)
        with self.stats.transferring():
            delay_free, params = finish_request(self.connector, request, self.tables.computed_block_ids(request))
        self.stats.requests_finished += 1
        self._finished_since_last_step.add(request.request_id)
        if delay_free:
            self._delayed_free[request.request_id] = request
        else:
            self._release(request)
        return FinishedRequest(request, params)

    def _release(self, request: Request) -> None:
        self.tables.free(request)
        self._sent_lengths.pop(request.request_id, None)
        del self._requests[request.request_id]

    def _on_received(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is None or request.status is not RequestStatus.WAITING_FOR_REMOTE_KVS or request_id in self._received:
            raise self._stray("finished_recving", request_id, "that is not waiting for an asynchronous load")
        self._received.add(request_id)

    def _on_sent(self, request_id: str) -> None:
        request = self._delayed_free.pop(request_id, None)
        if request is None:
            raise self._stray("finished_sending", request_id, "whose blocks it did not keep (delay_free)")
        self._release(request)

    def _stray(self, field: str, request_id: str, why: str) -> ContractError:
        name = describe(self.connector)
        return ContractError(
            f'"{name}".get_finished reported {field} for request {request_id!r} {why}; '
            "acting on it would free or reuse blocks twice",
            connector=name,
            method="get_finished",
            value=request_id,
        )


publish(__name__)
