"""Which tier's loaded tokens the engine kept: a failed block takes its own tokens and every later one of its load.

An engine never computes on loaded KV past a load's first failed block: it recomputes from there or ends the
request (vLLM's two ``kv_load_failure_policy`` values). So the tokens a tier *served* are its slice up to
that point, and a failed block in one tier's slice also costs the tiers that loaded after it. The scheduler
side learns of failed blocks from the engine's output (``invalid_block_ids``), by block id: each load keeps
its blocks until it settles, to place them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set as AbstractSet
from typing import Any

from capkv.composite._settling import LoadSettling
from capkv.contracts._engine import KVConnectorOutput
from capkv.contracts._spec import KVSpec

__all__ = ["Landing"]


class _Load:
    __slots__ = ("request_id", "blocks", "parts", "kept")

    def __init__(self, request_id: str, blocks: Sequence[Sequence[int]], parts: tuple[tuple[int, int, int], ...]) -> None:
        self.request_id = request_id
        self.blocks = blocks
        self.parts = parts
        """(child, first token, tokens) of each slice, in token order."""
        self.kept = parts[-1][1] + parts[-1][2]
        """The engine keeps the load's tokens before this one."""


class Landing:
    """Per child, the tokens of its slices of composed hits that the engine kept (:attr:`landed`)."""

    __slots__ = ("landed", "loads")

    def __init__(self, children: int) -> None:
        self.landed = [0] * children
        self.loads: dict[int, _Load] = {}
        """Load number -> the load, until it settles."""

    def started(
        self, request_id: str, number: int, blocks: Sequence[Sequence[int]] | None,
        parts: Sequence[tuple[int, int, int]],
    ) -> None:
        """Load ``number`` started: ``parts`` are the children's slices, in token order."""
        for index, _, tokens in parts:
            self.landed[index] += tokens
        if blocks is not None and parts:
            self.loads[number] = _Load(request_id, blocks, tuple(parts))

    def failed(self, invalid: Mapping[int, AbstractSet[int]], spec: KVSpec) -> None:
        """The engine's output names failed blocks: each load they fall in keeps its tokens before the first."""
        sizes = [group.block_size or 1 for group in spec.groups] or [1]
        null = spec.null_block_id
        for load in self.loads.values():
            blocks, parts, kept = load.blocks, load.parts, load.kept
            start = parts[0][1]
            first = kept
            for group, ids in invalid.items():
                if not ids or not 0 <= group < len(blocks):
                    continue
                size = sizes[group] if group < len(sizes) else sizes[0]
                row = blocks[group]
                for position in range(start // size, min(-(-kept // size), len(row))):
                    if row[position] != null and row[position] in ids:
                        first = min(first, max(position * size, start))
                        break
            if first < kept:
                for index, slice_first, tokens in parts:
                    lost = min(slice_first + tokens, kept) - max(slice_first, first)
                    if lost > 0:
                        self.landed[index] -= lost
                load.kept = first

    def settle(self, settling: LoadSettling, output: KVConnectorOutput, spec: KVSpec | None) -> None:
        """A step's output came back: its failed blocks cost the loads still unsettled, then the loads it
        ends settle (``settling``), and are forgotten here."""
        if self.loads and output.invalid_block_ids and spec is not None:
            self.failed(output.invalid_block_ids, spec)
        settling.output(output.finished_recving)
        if self.loads:
            self.settled(settling.pending)

    def state(self) -> dict[str, object]:
        loads = {number: (load.request_id, load.blocks, load.parts, load.kept) for number, load in self.loads.items()}
        return {"landed": list(self.landed), "loads": loads}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.landed = list(state["landed"])
        self.loads = {}
        for number, (request_id, blocks, parts, kept) in state["loads"].items():
            load = self.loads[number] = _Load(request_id, blocks, parts)
            load.kept = kept

    def settled(self, pending: Mapping[str, Sequence[Sequence[int]]]) -> None:
        """Forget the loads no longer pending (``LoadSettling.pending``): no failure can come for them now."""
        gone = [
            number for number, load in self.loads.items()
            if not any(entry[0] == number for entry in pending.get(load.request_id, ()))
        ]
        for number in gone:
            del self.loads[number]
