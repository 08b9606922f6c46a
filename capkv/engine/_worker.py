"""The worker: runs one step's forward pass and the connector's worker side around it.

In vLLM's order; a step with nothing to compute still runs the connector calls, so transfers make progress.
"""

from __future__ import annotations

from collections.abc import Mapping, Set as AbstractSet
from dataclasses import dataclass
from typing import cast

import torch

from capkv.capabilities._hma import describe

from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import KVConnectorOutput
from capkv.engine._compute import KVFunction
from capkv.engine._kv_cache import PagedKVCache, Slots
from capkv.engine._model import GroupLayout
from capkv.engine._outputs import ForwardContext, Mismatch, ModelRunnerOutput, SchedulerOutput
from capkv.engine._request import Request
from capkv.engine._stats import EngineStats
from capkv.engine._verify import Verifier
from capkv.errors import ContractError

__all__ = ["LayerAttentionMetadata", "Worker"]


@dataclass(frozen=True)
class LayerAttentionMetadata:
    """What ``save_kv_layer`` receives: where this step wrote the layer's KV."""

    group: int
    slots: Slots


class Worker:
    """Owns the paged cache; computes KV and drives the connector's worker side.

    Per step: bind the step's connector metadata, ``start_load_kv``; then per layer ``wait_for_layer_load``,
    check what was loaded, compute and write this step's KV, ``save_kv_layer``; then ``wait_for_save``,
    ``get_finished``, the load errors, the worker metadata, and ``clear_connector_metadata``.
    """

    def __init__(
        self,
        connector: KVConnector[Request],
        cache: PagedKVCache,
        kv_function: KVFunction,
        verifier: Verifier | None,
        stats: EngineStats,
    ) -> None:
        self.connector = connector
        self.cache = cache
        self.kv_function = kv_function
        self.verifier = verifier
        self.stats = stats
        self.layer_names: tuple[str, ...] = cache.shape.layer_names

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        connector = self.connector
        for group in self.cache.shape.groups:
            self.cache.poison_blocks(group, output.fresh_blocks.get(group.index, []))
        connector.bind_connector_metadata(output.kv_connector_metadata)
        with self.stats.transferring():
            connector.start_load_kv(ForwardContext(output, self.layer_names))
        mismatches: list[Mismatch] = []
        if output.scheduled:
            self._forward(output, mismatches)
        self._check_null_block()
        with self.stats.transferring():
            connector.wait_for_save()
            sending, recving = connector.get_finished(output.finished_req_ids)
        invalid = self._load_errors()
        stats = connector.get_kv_connector_stats()
        if stats is not None:
            self.stats.connector_stats.append(stats)
        worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        sampled = {
            s.request_id: self.kv_function.sample(s.request.prefix_hash(s.stop - 1)) for s in output.scheduled
        }
        return ModelRunnerOutput(
            sampled,
            KVConnectorOutput(
                finished_sending=frozenset(sending or ()),
                finished_recving=frozenset(recving or ()),
                worker_meta=worker_meta,
                invalid_block_ids={g: frozenset(ids) for g, ids in invalid.items()},
            ),
            mismatches,
        )

    def _check_null_block(self) -> None:
        """Refuse a load into the null block: the engine holds it in every sliding-window place outside the
        window (also where a front tier's slice of a composed hit lies), and it is no block of any request."""
        written = self.cache.null_block_written()
        if written is None:
            return
        group, layer = written
        name = describe(self.connector)
        raise ContractError(
            f'"{name}" wrote into the null block (block {self.cache.null_block_id}, group {group.index}, layer '
            f"{layer}): the engine holds it in place of the blocks a sliding window no longer reads; a load must "
            "skip null ids (the engine did not allocate that block for the request)",
            connector=name, method="start_load_kv", group=group.index, value=self.cache.null_block_id,
        )

    def _load_errors(self) -> dict[int, set[int]]:
        """The connector's failed loads, refused unless shaped ``{group index: {block id, ...}}``."""
        errors = cast("object", self.connector.get_block_ids_with_load_errors())  # judged here, not trusted
        num_groups = len(self.cache.shape.groups)
        name = describe(self.connector)

        def refuse(why: str, group: int | None, value: object) -> ContractError:
            return ContractError(
                f'"{name}".get_block_ids_with_load_errors returned {why}; expected a dict '
                f"{{group index: set of block ids}} over groups 0..{num_groups - 1}",
                connector=name, method="get_block_ids_with_load_errors", group=group, value=value,
            )

        if not isinstance(errors, Mapping):
            raise refuse(f"a {type(errors).__name__} ({errors!r})", None, errors)
        checked: dict[int, set[int]] = {}
        entries: list[tuple[object, object]] = list(cast("Mapping[object, object]", errors).items())
        for group, ids in entries:
            if type(group) is not int or not 0 <= group < num_groups:
                raise refuse(f"the key {group!r}, which is not a group index", None, group)
            members = _as_set(ids)
            if members is None or not all(type(i) is int for i in members):
                raise refuse(f"{ids!r} for group {group}, which is not a set of int block ids", group, ids)
            checked[group] = set(cast("AbstractSet[int]", members))
        return checked

    def _forward(self, output: SchedulerOutput, mismatches: list[Mismatch]) -> None:
        """Every layer: wait for its load, check loaded KV, write this step's KV, hand it to the connector."""
        connector = self.connector
        shape = self.cache.shape
        hashes = [h for s in output.scheduled for h in s.request.prefix_hashes(s.start, s.stop)]
        seeds = self.kv_function.seeds(hashes)
        # A position in a null block has no slot: after a failed load the engine recomputes from the
        # failed block, and a sliding-window group may hold the null block there (it was outside the
        # window of the whole hit). Its KV is not stored — the null block is no block of the request.
        placed = {group.index: self._slots(output, group) for group in shape.groups}
        slots = {index: where for index, (where, _) in placed.items()}
        kept = {index: keep for index, (_, keep) in placed.items()}
        for layer in self.layer_names:
            group = self.cache.group_of_layer[layer]
            with self.stats.transferring():
                connector.wait_for_layer_load(layer)
            if self.verifier is not None:
                for s in output.scheduled:
                    if s.load_check is not None:
                        mismatches += self.verifier.check_range(
                            s.request, group, layer, s.block_ids[group.index],
                            s.load_check.start, s.load_check.stop, when="after load",
                        )
            kv = self.kv_function.kv(layer, seeds)
            keep = kept[group.index]
            self.cache.write(layer, slots[group.index], kv if keep is None else kv.index_select(1, keep))
            with self.stats.transferring():
                connector.save_kv_layer(
                    layer, self.cache.tensors[layer], LayerAttentionMetadata(group.index, slots[group.index])
                )


    def _slots(self, output: SchedulerOutput, group: GroupLayout) -> tuple[Slots, torch.Tensor | None]:
        """Where the step's positions go in ``group``, null blocks left out; and which of the step's
        positions (in scheduling order) that keeps (``None``: all of them)."""
        parts: list[Slots] = []
        kept: list[int] = []
        offset = 0
        for s in output.scheduled:
            part = self.cache.slots(group, s.block_ids[group.index], range(s.start, s.stop), skip_null=True)
            parts.append(part)
            kept += [offset + position - s.start for position in part.positions]
            offset += s.stop - s.start
        if len(kept) == offset:
            return Slots.concat(parts), None
        return Slots.concat(parts), torch.tensor(kept, dtype=torch.int64, device=self.cache.device)


def _as_set(value: object) -> AbstractSet[object] | None:
    return cast("AbstractSet[object]", value) if isinstance(value, AbstractSet) else None
