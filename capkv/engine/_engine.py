"""The engine: a scheduler and a worker around one connector, checked before it serves.

Start-up follows vLLM's, so a stack that cannot serve is refused here, not when the first request finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from capkv._homes import publish
from capkv.capabilities._hma import describe
from capkv.capabilities._serving import check_stack
from capkv.contracts._arguments import argument_error, is_finite_number, require_instance, require_int
from capkv.contracts._connector import KVConnector
from capkv.devmode._instrument import instrument
from capkv.engine._block_pool import BlockPool
from capkv.engine._block_tables import BlockTables
from capkv.engine._compute import KVFunction
from capkv.engine._kv_cache import PagedKVCache
from capkv.engine._model import KV_LAYOUT, GroupLayout, ModelShape
from capkv.engine._request import Request, RequestStatus
from capkv.engine._scheduler import FinishedRequest, Scheduler
from capkv.engine._stats import EngineStats
from capkv.engine._verify import Verifier
from capkv.engine._worker import Worker
from capkv.errors import CapabilityError, ConfigError, ContractError

__all__ = ["Engine"]

Progress = Callable[[int, int], None]
"""Called after each step with (requests finished, requests added)."""


class Engine:
    """A small, faithful serving loop over a paged, hybrid KV cache.

    What it checks, so a connector cannot get a wrong byte past it:

    * before serving, :func:`capkv.check_stack` (a stack that cannot serve every
      KV-cache group is a :class:`~capkv.CapabilityError` here) and the stack's
      required KV-cache layout;
    * in dev mode (``CAPKV_DEV=1``, ``python -X dev`` or
      :func:`capkv.devmode.dev_mode`), :func:`capkv.devmode.instrument` wraps the stack, so
      every block id and KV tensor the connectors are handed is checked;
    * with ``verify`` (the default), every block a connector loaded is compared
      bit for bit with recomputation before any layer uses it, and every
      request's KV when it finishes (:class:`~capkv.engine.VerificationError`
      names request, group, layer, block and position);
    * the completion protocol: a ``finished_recving`` or ``finished_sending`` the
      engine did not wait for, or a second report, is a :class:`~capkv.ContractError`;
      so is a delayed free never reported within ``transfer_timeout_s``, and load
      errors that are not ``{group: block ids}`` over blocks being loaded;
    * with ``scrub_released_blocks``, every block nobody holds any more is
      poisoned and dropped from the prefix cache the moment it is released, so a
      connector that reads blocks after letting the engine free them (an early
      free) stores the poison, and the next load of it fails verification.

    Speed: the engine runs many small tensor ops, and torch's default intra-op
    thread count (one per core) makes each of them pay thread hand-offs. Call
    ``torch.set_num_threads(1)`` before serving (``capkv demo`` and
    :func:`capkv.testing.check_connector` do): ``python -m
    benchmarks.engine_threads`` measured the default demo workload, on a shared
    2-core machine (load average 9-12), at 1.1-1.9 s with one thread and 6.2-27 s
    with torch's default of 2: 6x to 15x slower (issue 12 saw ~20x).

    Start-up follows vLLM: the stack is checked against the KV-cache groups, wrapped in dev-mode contracts (a
    no-op unless dev mode is on), asked for a memory pool, handed the paged tensors, and introduced to its
    peers. Each :meth:`step` is one schedule → forward → update round; :meth:`run` steps until every request
    finished and every block a connector held was released.
    """

    def __init__(
        self,
        shape: ModelShape,
        connector: KVConnector[Request],
        *,
        verify: bool = True,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 8192,
        transfer_timeout_s: float = 60.0,
        scrub_released_blocks: bool = False,
    ) -> None:
        require_instance(shape, ModelShape, "Engine", "shape", "a capkv.engine.ModelShape")
        require_int(max_num_seqs, "Engine", "max_num_seqs", minimum=1)
        require_int(max_num_batched_tokens, "Engine", "max_num_batched_tokens", minimum=1)
        if not is_finite_number(transfer_timeout_s) or transfer_timeout_s <= 0:
            raise argument_error("Engine", "transfer_timeout_s", transfer_timeout_s, "a finite number of seconds > 0")
        spec = shape.kv_spec()
        check_stack(connector, spec)
        layout = connector.get_required_kvcache_layout()
        if layout is not None and layout != KV_LAYOUT:
            raise CapabilityError(
                f'"{describe(connector)}" needs KV-cache layout {layout!r}; this engine lays KV out as {KV_LAYOUT!r}',
                connector=describe(connector),
                method="get_required_kvcache_layout",
                value=layout,
            )
        connector = instrument(connector, spec)  # identity unless dev mode is on
        self.shape = shape
        self.spec = spec
        self.connector = connector
        self.transfer_timeout_s = transfer_timeout_s
        self.stats: EngineStats = EngineStats(len(shape.groups))
        self.cache: PagedKVCache = PagedKVCache(shape, mem_pool=connector.get_mem_pool_context())
        connector.register_kv_caches(dict(self.cache.tensors))
        handshake = connector.get_handshake_metadata()
        if handshake is not None:
            connector.set_xfer_handshake_metadata({0: handshake})
        self.pool: BlockPool = BlockPool(shape.num_blocks, spec.null_block_id)
        self.kv_function: KVFunction = KVFunction(shape)
        verifier = Verifier(self.cache, self.kv_function) if verify else None
        tables = BlockTables(shape.groups, self.pool, on_released=self._scrub if scrub_released_blocks else None)
        self.scheduler: Scheduler = Scheduler(
            shape, connector, tables, self.stats, verifier,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        )
        self.worker: Worker = Worker(connector, self.cache, self.kv_function, verifier, self.stats)

    def _scrub(self, group: GroupLayout, blocks: list[int]) -> None:
        """Released blocks: forget their prefix-cache entries, then overwrite their KV."""
        self.pool.forget(blocks)
        self.cache.poison_blocks(group, blocks)

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def step(self) -> tuple[int, list[FinishedRequest]]:
        """One round: schedule, run the forward pass, apply its results.

        Returns the number of tokens computed and the requests that finished.
        """
        output = self.scheduler.schedule()
        result = self.worker.execute(output)
        return output.total_num_scheduled_tokens, self.scheduler.update_from_output(output, result)

    def run(self, requests: Iterable[Request], progress: Progress | None = None) -> list[FinishedRequest]:
        """Serve ``requests`` to completion, and wait until connectors released every block."""
        added = 0
        for request in requests:
            self.add_request(request)
            added += 1
        finished: list[FinishedRequest] = []
        idle_since: float | None = None
        while self.scheduler.has_unfinished:
            computed, step_finished = self.step()
            finished += step_finished
            if progress is not None:
                progress(len(finished), added)
            idle_since = None if computed else self._wait_idle(idle_since)
        return finished

    def _wait_idle(self, idle_since: float | None) -> float:
        """Nothing was computed: give background transfers time, but not forever.

        Admission reserves every request's worst case, so running requests always
        have room; the first check guards that promise rather than spin.
        """
        now = time.monotonic()
        if self.scheduler.running and not self.scheduler.transfers_in_flight:
            raise ConfigError(
                f"the KV-cache pool ({self.shape.num_blocks} blocks) is too small for the running requests; "
                "raise num_blocks or lower max_num_seqs",
                value=self.shape.num_blocks,
            )
        if idle_since is None:
            return now
        if now - idle_since > self.transfer_timeout_s:
            name = describe(self.connector)
            held = self.scheduler.held_for_connector
            waiting = [r.request_id for r in self.scheduler.waiting if r.status is RequestStatus.WAITING_FOR_REMOTE_KVS]
            what = (
                f"requests {list(held)} finished with delay_free=True were never reported in finished_sending"
                if held
                else f"asynchronous loads of requests {waiting} were never reported in finished_recving"
                if waiting
                else "get_num_new_matched_tokens kept answering None"
            )
            raise ContractError(
                f'"{name}" made no progress for {self.transfer_timeout_s:g} s: {what}',
                connector=name,
                method="get_finished",
                value=self.transfer_timeout_s,
            )
        time.sleep(0.001)
        return idle_since

    def reset_prefix_cache(self) -> None:
        """Forget the local prefix cache and poison the paged KV, so the next run must load or recompute."""
        if self.scheduler.has_unfinished:
            raise ConfigError("reset_prefix_cache: requests are still being served", method="reset_prefix_cache")
        self.pool.reset_prefix_cache()
        self.cache.poison()

    def shutdown(self) -> None:
        self.connector.shutdown()


publish(__name__)
