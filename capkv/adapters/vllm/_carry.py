"""vLLM's own objects, carried through a capkv stack to the vLLM children that want them.

The engine's originals carry what capkv's types cannot (block hashes, the null flag, statistics, events), so a
wrapped child passes them on instead of rebuilding them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Mapping as Mapping  # dev mode resolves the inherited fields' hints here
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

from typing_extensions import Self
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.outputs import KVConnectorOutput as VllmKVConnectorOutput

from capkv.composite._fanout import Failures
from capkv.composite._handshakes import Handshakes, child_share
from capkv.composite._native import NOT_CARRIED, IndexedCalls, NotCarried
from capkv.contracts._engine import BlockIds, KVConnectorOutput, LoadErrors
from capkv.contracts._engine import WorkerMetadata as WorkerMetadata  # as above
from capkv.errors import ContractError

__all__ = [
    "VLLM_NULL_BLOCK_ID",
    "PPHandshakes",
    "VllmBlockIds",
    "VllmOutputCarrier",
    "attribute_load_errors",
    "block_ids_from_vllm",
    "pass_output",
]

VLLM_NULL_BLOCK_ID: Final = 0
"""vLLM's block pool makes block 0 the null block (``is_null``)."""


class VllmBlockIds(tuple[list[int], ...]):
    """One list of block ids per group (capkv's :data:`~capkv.BlockIds`), with vLLM's ``KVCacheBlocks``."""

    kv_cache_blocks: KVCacheBlocks


class _ReadBlocks(KVCacheBlocks):
    """vLLM's blocks whose ids were read once already: ``get_block_ids()`` hands out fresh copies of them
    rather than reading every block again for each wrapped child (vLLM's composite has each child read them)."""

    def __init__(self, blocks: KVCacheBlocks, ids: tuple[list[int], ...]) -> None:
        super().__init__(blocks.blocks)
        self._ids = ids

    @overload
    def get_block_ids(
        self, allow_none: Literal[False] = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...]: ...
    @overload
    def get_block_ids(
        self, allow_none: Literal[True] = True, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None: ...
    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        ids = self._ids if group_ids is None else tuple(self._ids[group] for group in group_ids)
        if allow_none and all(not group for group in ids):
            return None
        return tuple([group.copy() for group in ids])


def block_ids_from_vllm(blocks: KVCacheBlocks) -> BlockIds:
    """vLLM's ``KVCacheBlocks`` as capkv's block ids, carrying the original blocks for wrapped vLLM children
    (whose ``get_block_ids()`` then copies these ids instead of reading the blocks again)."""
    read = blocks.get_block_ids()
    ids = VllmBlockIds(read)
    ids.kv_cache_blocks = _ReadBlocks(blocks, tuple(list(group) for group in read))
    return ids


@dataclass(frozen=True)
class VllmOutputCarrier(KVConnectorOutput):
    """capkv's ``KVConnectorOutput`` with vLLM's original: a wrapped vLLM child gets the original,
    its worker metadata set to the child's own for the call (as vLLM's MultiConnector does)."""

    vllm_output: VllmKVConnectorOutput | None = None


class PPHandshakes(Handshakes):
    """The workers' handshake metadata by tensor-parallel rank (capkv's contract), carrying vLLM's
    ``(pp_rank, tp_rank)``-keyed original for wrapped vLLM children (``set_xfer_handshake_metadata_pp_aware``).

    The rank view holds the first pipeline stage's workers, as vLLM's base class hands a connector
    that is not pipeline-aware. A stack's child gets its own share of both views (:meth:`for_child`).
    """

    by_pp_rank: dict[tuple[int, int], object]

    @classmethod
    def of(cls, metadata: Mapping[tuple[int, int], object]) -> Self:
        carried = cls({tp_rank: meta for (pp_rank, tp_rank), meta in metadata.items() if pp_rank == 0})
        carried.by_pp_rank = dict(metadata)
        return carried

    def for_child(self, index: int) -> Self:
        return self.of(child_share(self.by_pp_rank, index))


def attribute_load_errors(
    flat: Iterable[int], group_of: Callable[[int], int | None], *, owner: str, method: str
) -> LoadErrors:
    """vLLM's flat load-error set, per KV-cache group.

    A block id belongs to one group at a time, and ``group_of`` says which from the
    block tables of planned loads; an id no planned load holds is a ``ContractError``,
    never a guess.
    """
    errors: LoadErrors = {}
    for block_id in flat:
        group = group_of(block_id)
        if group is None:
            raise ContractError(
                f"{owner}.{method}: vLLM reported a load error for block {block_id!r}, which no request with a "
                "planned load holds; its KV-cache group cannot be told",
                connector=owner, method=method, value=block_id,
            )
        errors.setdefault(group, set()).add(block_id)
    return errors


def pass_output(
    calls: IndexedCalls, output: Any, shares: tuple[Any, ...] | None
) -> Failures | None | Literal[NotCarried.NOT_CARRIED]:
    """A stack's wrapped vLLM children take the vLLM output carried in ``output``, each its own member, with
    its share of the worker metadata in ``kv_connector_worker_meta`` for the call (as vLLM's MultiConnector
    sets it); the field holds what it held before once the calls are done, or one raised. Children are
    indexed, not zipped with their shares: a ``zip`` per call cost more than the loop's other work."""
    try:
        carried: VllmKVConnectorOutput | None = output.vllm_output
    except AttributeError:
        return NOT_CARRIED
    if carried is None:
        return NOT_CARRIED
    failures: Failures | None = None
    saved = carried.kv_connector_worker_meta
    if shares is None:
        if saved is None:  # nothing to set: vLLM's output as it is
            for index, call in calls:
                try:
                    call(carried)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
            return failures
        shares = (None,) * (calls[-1][0] + 1 if calls else 0)  # no share for any child: None for each call
    try:
        for index, call in calls:
            carried.kv_connector_worker_meta = shares[index]
            try:
                call(carried)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
    finally:
        carried.kv_connector_worker_meta = saved
    return failures
