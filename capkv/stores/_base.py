"""The shared connector of capkv's prefix-keyed stores (host pool, files).

One object plays both sides, as vLLM builds a connector once per role; the sides meet only in the metadata
(the per-step flow: docs/internals.md, "Stores").
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, cast

from typing_extensions import Self

from capkv._homes import publish
from capkv.stores._backend import reads_slowly
from capkv.stores._keys import PrefixHasher, RequestKeys
from capkv.stores._metadata import SaveReport, StoreMetadata
from capkv.stores._index_contract import StoreIndex
from capkv.stores._scheduler import StoreScheduler
from capkv.stores._worker import DRAIN_TIMEOUT_S, StoreWorker
from capkv.contracts._arguments import argument_error, is_finite_number, require_instance
from capkv.contracts._key_inputs import request_key_inputs
from capkv.contracts._base import KVConnectorBase
from capkv.contracts._class_level import class_level
from capkv.contracts._engine import (
    AttentionMetadata,
    BlockIds,
    ConnectorMetadata,
    ForwardContext,
    KVConnectorOutput,
    KVTransferParams,
    LoadErrors,
    SchedulerOutput,
    ComputedTokenRequest,
)
from capkv.contracts._spec import KVSpec
from capkv.errors import CapabilityError, ConfigError, MetadataError

if TYPE_CHECKING:
    import torch

__all__ = ["PrefixStoreConnector", "require_store_spec"]


def require_store_spec(spec: KVSpec, owner: str) -> KVSpec:
    """``spec``, when it says enough to key, size and copy every group's blocks."""
    require_instance(spec, KVSpec, owner, "spec", "a capkv.KVSpec", connector=owner, method="__init__")
    if len(spec.groups) != spec.num_groups:
        raise ConfigError(
            f"{owner}: the spec must describe each of its {spec.num_groups} KV-cache groups; it describes {len(spec.groups)}",
            connector=owner, method="__init__", value=len(spec.groups),
        )
    if spec.dtype is None:
        raise ConfigError(f"{owner}: the spec needs a dtype", connector=owner, method="__init__", value=None)
    for index, group in enumerate(spec.groups):
        problems = [
            what
            for what, bad in (
                ("layer_names", not group.layer_names),
                ("kv_shape", group.kv_shape is None),
                ("a positive block_size", group.block_size is None or group.block_size < 1),
                ("a positive sliding_window or None", group.sliding_window is not None and group.sliding_window < 1),
            )
            if bad
        ]
        if problems:
            raise ConfigError(
                f"{owner}: group {index} needs {', '.join(problems)}",
                connector=owner, method="__init__", group=index, value=group,
            )
    return spec


class PrefixStoreConnector(KVConnectorBase[ComputedTokenRequest]):
    """Prefix-keyed block store for every KV-cache group; subclasses choose where blocks live."""

    default_loads_async: ClassVar[bool | None] = None
    """Whether this class's hits load asynchronously when it is built as configured (its backend's ``slow``),
    for ``capkv check`` to say before anything is built; ``None``: the backend it is given decides. A built
    store answers :attr:`loads_async`."""

    def __init__(self, spec: KVSpec, index: StoreIndex, worker: StoreWorker, *, namespace: str) -> None:
        self.spec = spec
        hasher = PrefixHasher(spec, namespace, owner=self._name)
        self._scheduler = StoreScheduler(
            spec, index, hasher, owner=self._name, load_async=reads_slowly(worker.backend, self._name)
        )
        full = [i for i, group in enumerate(spec.groups) if group.sliding_window is None]
        self._first_block: tuple[PrefixHasher, StoreIndex, int] | None = (hasher, index, full[0]) if full else None
        """What tells whether a request's first block is here: a full-attention group's (every hit holds it)
        key, asked of the index; ``None`` with no such group (every request may then load)."""
        self._worker = worker

    @property
    def loads_async(self) -> bool:
        """Whether hits load asynchronously: the backend declares ``slow = True``, so hits are answered
        ``load_async=True`` and read on the store's reader thread (``capkv check`` and ``capkv demo`` show it)."""
        return self._scheduler.load_async

    @property
    def _name(self) -> str:
        return type(self).__name__

    # ---- scheduler side ------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: ComputedTokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        """Tokens every group can load beyond ``num_computed_tokens``; asynchronous (``True``) when the
        backend declares its reads slow and there is a hit."""
        tokens = self._scheduler.matched_tokens(request, num_computed_tokens)
        return tokens, self._scheduler.load_async and tokens > 0

    def may_load_async(self, request: ComputedTokenRequest, /) -> bool:
        """Whether a hit for ``request`` may load asynchronously (vLLM 0.34 asks each time the request enters
        a waiting queue): a slow backend's store that holds the request's first block — one key asked of the
        index (a shared backend's: one ``contains`` of it, until the step's metadata is built)."""
        if not self._scheduler.load_async:
            return False
        first = self._first_block
        if first is None:
            return True
        hasher, index, group = first
        size = hasher.block_size(group)
        tokens = request.all_token_ids
        if len(tokens) <= size:
            return False  # the last token is always computed: no whole block to load
        inputs = request_key_inputs(request, connector=self._name, method="may_load_async")
        return index.loadable(RequestKeys(hasher, tokens[:size], inputs).key(group, 0, method="may_load_async"))

    def update_state_after_alloc(self, request: ComputedTokenRequest, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._scheduler.allocated(request, blocks, num_external_tokens)

    @class_level
    def loads_slices(cls) -> bool:
        """Yes: a hit is offered from ``num_computed_tokens`` on, and loaded from there into the
        blocks the engine holds (never the null block), so stores' hits add up in a stack."""
        return True

    def loaded_elsewhere(self, request: ComputedTokenRequest, start: int, end: int, save: bool, /) -> None:
        """Another child of the stack loaded ``[start, end)``: not saved here unless the stack promotes."""
        self._scheduler.loaded_elsewhere(request.request_id, start, end, save)

    def loads_failed(self, request_ids: AbstractSet[str], /) -> None:
        """A load of these requests failed this step (in another child, maybe): save nothing of them this step."""
        self._worker.loads_failed(request_ids)

    def reset_cache(self) -> bool:
        """Drop every block this store offers (vLLM's ``reset_prefix_cache(reset_connector=True)``): from
        now on no key equals one from before, so nothing saved before is offered or loaded again, and
        requests running now save nothing more. What the backend holds stays until evicted (a shared
        directory or Redis may serve other engines). Always ``True``."""
        self._scheduler.reset()
        return True

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> StoreMetadata:
        return self._scheduler.build(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        self._scheduler.output(connector_output)

    def request_finished(self, request: ComputedTokenRequest, block_ids: list[int], /) -> tuple[bool, KVTransferParams | None]:
        """Single-group finish: only meaningful when the spec has one group."""
        if self.spec.num_groups != 1:
            raise CapabilityError(
                f"{self._name}.request_finished got one group's blocks; the KV cache has "
                f"{self.spec.num_groups} groups, so the engine must call request_finished_all_groups",
                connector=self._name, method="request_finished", value=self.spec.num_groups,
            )
        return self._finish(request, (block_ids,), "request_finished")

    def _finish(self, request: ComputedTokenRequest, block_ids: BlockIds, method: str) -> tuple[bool, KVTransferParams | None]:
        return self._scheduler.finished(request, block_ids, method), None

    # ---- worker side ---------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        self._worker.register(kv_caches)

    def unregister_kv_caches(self) -> None:
        """The engine is about to give up its KV cache's memory (vLLM's sleep mode): finish every copy
        out of it and drop the views of it. The engine's host registers the same cache again on wake."""
        self._worker.release()

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        if not isinstance(connector_metadata, StoreMetadata):
            raise MetadataError(
                f"{self._name}.bind_connector_metadata: expected StoreMetadata, got {connector_metadata!r}",
                connector=self._name, method="bind_connector_metadata", value=connector_metadata,
            )
        super().bind_connector_metadata(connector_metadata)
        self._worker.receive(connector_metadata, "bind_connector_metadata")  # before the forward pass

    def _bound(self) -> StoreMetadata:
        metadata = self.connector_metadata
        if not isinstance(metadata, StoreMetadata):  # bind_connector_metadata checked it
            raise MetadataError(
                f"{self._name}: bound metadata is not StoreMetadata", connector=self._name, value=metadata
            )
        return metadata

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Load this step's blocks (ordered before the forward pass), then start its saves."""
        metadata = self._bound()
        self._worker.load(metadata)
        self._worker.save(metadata)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        """Nothing to wait for: ``start_load_kv`` ordered the engine after every synchronous load, and
        asynchronous ones are for requests the engine does not compute until they are received."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        """Nothing per layer: ``wait_for_save`` saves each filled block whole, every layer in one copy."""

    def wait_for_save(self) -> None:
        """Start saving the blocks this step filled (never waited for: ``build_connector_worker_meta``
        reports when they land); the engine's stream is ordered after their copies."""
        metadata = self.connector_metadata
        if isinstance(metadata, StoreMetadata):
            self._worker.save_computed(metadata)

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.finished(), self._worker.received()

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        return self._worker.take_load_errors()

    def build_connector_worker_meta(self) -> SaveReport | None:
        """The saves that ended since the last step, stored or failed; the scheduler side needs it
        to make stored blocks loadable and failed ones saveable again."""
        return self._worker.report()

    def get_kv_connector_stats(self) -> dict[str, int] | None:
        """Counters since the last call (``None`` when all are zero): ``hit_tokens``,
        ``loaded_blocks``/``loaded_bytes``, ``saved_blocks``/``saved_bytes`` (saves started),
        ``failed_blocks`` (loads that failed), ``failed_save_blocks`` (saves that failed),
        ``dropped_save_blocks`` (saves not started: the background writer was full)."""
        counts = self._worker.take_counts()
        hit_tokens = self._scheduler.take_hit_tokens()
        if hit_tokens:
            counts["hit_tokens"] = hit_tokens
        return counts or None

    def flush(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Wait until every started save and load is over (a save stored, or failed and counted), for at
        most ``timeout_s`` seconds — then the loads still running are given up and reported failed at the
        next ``get_finished``, and a ``TimeoutError`` says so; raise the background failures not raised
        yet, each once."""
        self._worker.flush(self._seconds(timeout_s, "flush"))

    def shutdown(self) -> None:
        self._worker.shutdown()

    # ---- a resource --------------------------------------------------------------------

    def close(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Let every started save complete and every load end, for at most ``timeout_s`` seconds (then
        loads still running are reported failed and saves not written fail), and release what the store
        holds (threads, files, connections), raising the background failures not raised yet; the same as
        ``shutdown``, by the name resources use."""
        self._worker.shutdown(self._seconds(timeout_s, "close"))

    def _seconds(self, timeout_s: object, method: str) -> float:
        if not is_finite_number(timeout_s) or cast("float", timeout_s) < 0:
            raise argument_error(
                self._name, "timeout_s", timeout_s, "a finite number >= 0 (seconds)", connector=self._name, method=method
            )
        return float(cast("float", timeout_s))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


publish(__name__, "capkv.connectors")
