"""Tensor parallelism: each rank stores and loads its own shard, and a block is offered once every rank holds it.

vLLM builds the connector once for the scheduler (no KV cache, no shard of its
own) and once per worker rank; every rank gets the same metadata, and the
workers' reports reach the scheduler merged (``SaveReport.aggregate``, vLLM's
``KVOutputAggregator``). Here two ranks hold different bytes under the same
block ids, as two tensor-parallel ranks hold different KV heads.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from capkv import KVConnectorOutput, KVShard, KVSpec, MetadataError
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SaveReport
from capkv.connectors._block_file import PackRecord, RecordHeader, write_pack
from capkv.stores._keys import BlockKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import Req
from tests.paged import Group, empty_caches, make_spec

GROUPS = [Group(16), Group(16, window=32)]
PROMPT = tokens(11, 100)
BLOCKS = ([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 8, 9, 10])
"""The prompt's block ids per group at finish (the window dropped group 1's first four)."""


def _spec(rank: int, size: int = 2) -> KVSpec:
    return dataclasses.replace(make_spec(GROUPS, num_blocks=32), shard=KVShard(tp_rank=rank, tp_size=size))


class Rank:
    """One worker rank: its own connector and KV cache, filled with bytes of its own."""

    def __init__(self, connector: Any, spec: KVSpec, rank: int) -> None:
        self.connector = connector
        self.caches = empty_caches(spec)
        generator = torch.Generator().manual_seed(100 + rank)
        for tensor in self.caches.values():
            tensor.view(torch.int16).copy_(torch.randint(-30000, 30000, tensor.shape, generator=generator))
        self.original = {name: tensor.clone() for name, tensor in self.caches.items()}
        self.received: set[str] = set()
        """Requests this rank reported received (a file store loads asynchronously)."""
        connector.register_kv_caches(self.caches)

    def blocks(self, group: int, ids: Sequence[int], *, original: bool = False) -> list[torch.Tensor]:
        source = self.original if original else self.caches
        layers = [name for name in source if name.startswith(f"g{group}.")]
        return [source[name][:, list(ids)].view(torch.int16) for name in layers]  # bits (random bits hold NaNs)


def run_ranks(scheduler: Any, ranks: Sequence[Rank]) -> list[SaveReport | None]:
    """The workers' half of one engine step: the scheduler's metadata to every rank; each rank's report."""
    metadata = scheduler.build_connector_meta(None)
    reports: list[SaveReport | None] = []
    for rank in ranks:
        rank.connector.bind_connector_metadata(metadata)
        rank.connector.start_load_kv(None)
        rank.connector.wait_for_save()
        _, received = rank.connector.get_finished(set())
        rank.received |= received or set()
        reports.append(rank.connector.build_connector_worker_meta())
        rank.connector.clear_connector_metadata()
    return reports


def deliver(scheduler: Any, reports: Sequence[SaveReport | None]) -> None:
    """The reports back to the scheduler side, merged as vLLM merges its workers' (``aggregate``)."""
    present = [report for report in reports if report is not None]
    merged = functools.reduce(lambda a, b: a.aggregate(b), present) if present else None
    scheduler.update_connector_output(KVConnectorOutput(worker_meta=merged))


def step(scheduler: Any, ranks: Sequence[Rank]) -> None:
    deliver(scheduler, run_ranks(scheduler, ranks))


def finish_prompt(scheduler: Any) -> None:
    """The prompt computed and finished: the scheduler plans the save of its blocks."""
    request = Req("saved", list(PROMPT), 0)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    scheduler.update_state_after_alloc(request, BLOCKS, 0)
    request.num_computed_tokens = len(PROMPT)
    delay, _ = scheduler.request_finished_all_groups(request, BLOCKS)
    assert delay


def offered(scheduler: Any) -> int:
    hit, _ = scheduler.get_num_new_matched_tokens(Req(f"probe-{id(object())}", [*PROMPT, 1], 0), 0)
    return int(hit or 0)


def test_the_host_pool_offers_a_block_only_once_every_rank_reported_it() -> None:
    """Issue 15: ``SaveReport.aggregate`` counted a key stored when *any* worker stored it."""
    scheduler = CPUOffloadConnector(_spec(0), capacity_blocks=64)
    ranks = [Rank(CPUOffloadConnector(_spec(r), capacity_blocks=64), _spec(r), r) for r in range(2)]
    finish_prompt(scheduler)
    zero, one = run_ranks(scheduler, ranks)
    deliver(scheduler, [zero])  # rank 1's report arrives a step later
    assert offered(scheduler) == 0  # rank 0's part alone is not a block
    deliver(scheduler, [one])
    assert offered(scheduler) == 96
    assert len(scheduler.pool) == 8


def test_reports_of_two_shards_merge_per_shard_and_a_failure_anywhere_fails_the_key() -> None:
    a, b = BlockKey(0, b"a" * 16), BlockKey(0, b"b" * 16)
    zero = SaveReport(frozenset({a, b}), loaded_through=4, layout=(b"0",), shard=0)
    one = SaveReport(frozenset({a}), frozenset({b}), loaded_through=3, layout=(b"1",), shard=1)
    merged = zero.aggregate(one)
    assert [(p.shard, p.stored, p.failed, p.layout) for p in merged.parts()] == [
        (0, frozenset({a, b}), frozenset(), (b"0",)), (1, frozenset({a}), frozenset({b}), (b"1",))
    ]
    assert merged.loaded_through == 3 and one.aggregate(zero).parts() == merged.parts()
    assert merged.aggregate(SaveReport(frozenset({b}), shard=1)).parts()[1].stored == frozenset({a})  # failed stays failed
    with pytest.raises(MetadataError, match="aggregate"):
        merged.aggregate(object())


class HeldWriter:
    """Holds one rank's pack writes until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, root: Path, records: Sequence[PackRecord]) -> tuple[str, list[RecordHeader]]:
        if not self.release.wait(60):
            raise TimeoutError("never released")
        return write_pack(root, records)


def test_two_ranks_share_a_file_store_each_loads_its_own_bytes_and_a_block_waits_for_both(tmp_path: Path) -> None:
    """Issue 15: both ranks wrote and read the same keys, so a rank could load the other's KV heads."""
    held = HeldWriter()
    try:
        _two_ranks(tmp_path, held)
    finally:
        held.release.set()


def _two_ranks(tmp_path: Path, held: HeldWriter) -> None:
    scheduler = FileStoreConnector(_spec(0), root=tmp_path)  # never registers a KV cache: learns layouts from reports
    ranks = [
        Rank(FileStoreConnector(_spec(0), root=tmp_path), _spec(0), 0),
        Rank(FileStoreConnector(_spec(1), root=tmp_path, write=held), _spec(1), 1),
    ]
    step(scheduler, ranks)  # the ranks' first reports: their layouts
    finish_prompt(scheduler)
    step(scheduler, ranks)
    ranks[0].connector.flush()
    for _ in range(3):
        step(scheduler, ranks)
    assert offered(scheduler) == 0  # rank 1's values are not written yet
    held.release.set()
    ranks[1].connector.flush()
    step(scheduler, ranks)
    assert offered(scheduler) == 96

    # A fresh request with the prompt loads it into other blocks, each rank its own bytes.
    for rank in ranks:
        for tensor in rank.caches.values():
            tensor.zero_()
    request = Req("loader", [*PROMPT, 1], 0)
    hit, _ = scheduler.get_num_new_matched_tokens(request, 0)
    assert hit == 96
    targets = ([11, 12, 13, 14, 15, 16, 17], [0, 0, 0, 0, 18, 19, 20])
    scheduler.update_state_after_alloc(request, targets, 96)
    deadline = time.monotonic() + 30
    step(scheduler, ranks)
    while not all("loader" in rank.received for rank in ranks):  # the file store's loads are asynchronous
        assert time.monotonic() < deadline, "the load was never reported received"
        time.sleep(0.01)
        step(scheduler, ranks)
    for rank in ranks:
        assert rank.connector.get_block_ids_with_load_errors() == {}
        for group in (0, 1):
            source = [b for b in BLOCKS[group][:6] if b]
            loaded = [b for b in targets[group][:6] if b]
            for got, want in zip(rank.blocks(group, loaded), rank.blocks(group, source, original=True), strict=True):
                assert torch.equal(got, want)
    assert not torch.equal(ranks[0].original["g0.layer0"][:, 1], ranks[1].original["g0.layer0"][:, 1])
    scheduler.close()
    for rank in ranks:
        rank.connector.close()


def test_a_report_from_a_shard_the_spec_does_not_have_is_refused() -> None:
    scheduler = CPUOffloadConnector(_spec(0), capacity_blocks=8)
    with pytest.raises(MetadataError, match="shard 2"):
        scheduler.update_connector_output(KVConnectorOutput(worker_meta=SaveReport(shard=2)))


@pytest.mark.parametrize(
    "fields", [{"tp_rank": 2, "tp_size": 2}, {"pp_rank": 1}, {"tp_size": 0}, {"tp_rank": -1}, {"tp_rank": True}]
)
def test_a_rank_that_does_not_fit_its_size_is_an_argument_error(fields: dict[str, object]) -> None:
    from capkv import CapkvError

    with pytest.raises(CapkvError, match=next(iter(fields)).split("_")[0]):
        KVShard(**fields)  # type: ignore[arg-type]
