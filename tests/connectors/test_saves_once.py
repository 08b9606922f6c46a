"""A block is saved once however requests overlap, loaded only once stored, and saved again if its save failed.

The file store's background writer is paused and released by the test (no
sleeping, no races), so "finished before the first write landed" is a state the
test holds, not a timing it hopes for.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from capkv import KVConnectorOutput, KVSpec, MultiWorkerMetadata
from capkv.cli._main import main
from capkv.connectors import BlockKey, CPUOffloadConnector, FileStoreConnector, PrefixHasher
from capkv.stores._metadata import SaveReport
from capkv.connectors import _block_file as block_file
from capkv.connectors._block_file import PackRecord, RecordHeader, write_pack
from capkv.connectors._host_pool import HostPoolIndex
from capkv.stores._keys import RequestKeys
from capkv.errors import MetadataError
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req, Run
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PREFIX = tokens(40, 64)  # four full blocks shared by the requests below
ONE = PREFIX + tokens(41, 20)
OTHER = PREFIX + tokens(42, 20)
WHOLE = 80  # the prompts' full blocks: what a hit can cover


class HeldWriter:
    """Stands in for the file store's ``write_pack``: each pack waits until the test lets it through."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._allowed: int | None = 0
        """Packs that may still be written; ``None``: every pack may."""
        self.failing = False
        """Packs let through now raise a disk error instead of being written."""
        self.attempts: list[BlockKey] = []
        self.written: list[BlockKey] = []

    def __call__(self, root: Path, records: Sequence[PackRecord]) -> tuple[str, list[RecordHeader]]:
        keys = [record.key for record in records]
        with self._turn:
            if not self._turn.wait_for(lambda: self._allowed is None or self._allowed > 0, timeout=60):
                raise AssertionError(f"the test never let the pack of {len(keys)} blocks through")
            if self._allowed is not None:
                self._allowed -= 1
            self.attempts += keys
            failing = self.failing
        if failing:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        written = write_pack(root, records)
        with self._turn:
            self.written += keys
            self._turn.notify_all()
        return written

    def let_through(self, count: int) -> None:
        with self._turn:
            self._allowed = (self._allowed or 0) + count
            self._turn.notify_all()

    def wait_written(self, count: int) -> None:
        with self._turn:
            if not self._turn.wait_for(lambda: len(self.written) >= count, timeout=60):
                raise AssertionError(f"{len(self.written)} of {count} writes landed")

    def open(self) -> None:
        with self._turn:
            self._allowed = None
            self._turn.notify_all()


@pytest.fixture
def writer() -> HeldWriter:
    return HeldWriter()


@pytest.fixture
def engine(tmp_path: Path, writer: HeldWriter) -> Iterator[MiniEngine]:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=tmp_path, write=writer)  # this connector's writes only
    yield MiniEngine(spec, connector)
    writer.open()
    connector.shutdown()


def saved_keys(spec: KVSpec, run: Run) -> set[BlockKey]:
    """The keys of the blocks a finished request hands over: its computed full blocks the engine still holds."""
    keys = RequestKeys(PrefixHasher(spec, owner="test"), run.request.all_token_ids)
    return {
        keys.key(group, index, method="test")
        for group, described in enumerate(spec.groups)
        for index in range(run.request.num_computed_tokens // (described.block_size or 1))
        if run.blocks[group][index] != spec.null_block_id
    }


def test_requests_sharing_a_prefix_and_finishing_in_one_step_save_each_block_once(
    engine: MiniEngine, writer: HeldWriter
) -> None:
    one = engine.run("one", ONE, finish=False)
    other = engine.run("other", OTHER, finish=False)
    assert engine.finish(one) and engine.finish(other)
    engine.step()
    assert not engine.held  # the blocks were gathered and freed; nothing is on disk yet
    assert writer.attempts == []
    writer.open()
    engine.connector.flush()
    expected = saved_keys(engine.spec, one) | saved_keys(engine.spec, other)
    assert len(expected) < len(saved_keys(engine.spec, one)) + len(saved_keys(engine.spec, other))  # they share
    assert sorted(writer.attempts) == sorted(expected)  # each key once
    stats = engine.connector.get_kv_connector_stats()
    assert stats is not None and stats["saved_blocks"] == len(expected)


def test_a_request_finishing_before_the_first_ones_write_landed_saves_only_its_own_blocks(
    engine: MiniEngine, writer: HeldWriter
) -> None:
    one = engine.run("one", ONE)  # finished, blocks freed, its writes held
    assert not engine.held and writer.attempts == []
    other = engine.run("other", OTHER)
    assert other.hit_tokens == 0  # nothing of the shared prefix is on disk yet: nothing is offered
    own = saved_keys(engine.spec, other) - saved_keys(engine.spec, one)
    assert own  # it has blocks of its own, and the shared ones are not saved again
    writer.open()
    engine.connector.flush()
    assert sorted(writer.attempts) == sorted(saved_keys(engine.spec, one) | own)
    # The landed blocks serve both prompts.
    assert engine.run("one again", ONE + [1]).hit_tokens == WHOLE
    assert engine.run("other again", OTHER + [1]).hit_tokens == WHOLE


def test_a_prefix_is_offered_only_once_its_pack_has_landed(engine: MiniEngine, writer: HeldWriter) -> None:
    one = engine.run("one", ONE)
    assert engine.connector.get_num_new_matched_tokens(Req("peek", list(ONE)), 0) == (0, False)
    assert not list(engine.connector.root.glob("*.kvpack"))
    writer.open()
    engine.connector.flush()
    assert sorted(writer.written) == sorted(saved_keys(engine.spec, one))
    # Everything landed: the whole prompt is offered and loaded bit for bit (the engine checks it).
    again = engine.run("again", ONE + [1])
    assert again.hit_tokens == WHOLE and again.load_errors == {}


class _RenameHeld:
    """``os`` as :mod:`capkv.connectors._block_file` sees it, whose atomic rename waits for the test."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.proceed = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def replace(self, source: Path, target: Path) -> None:
        self.arrived.set()
        if not self.proceed.wait(timeout=60):
            raise AssertionError("the test never let the rename through")
        os.replace(source, target)


def test_a_block_file_being_written_is_never_offered(
    engine: MiniEngine, writer: HeldWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    renames = _RenameHeld()
    monkeypatch.setattr(block_file, "os", renames)
    writer.open()
    engine.run("one", ONE)
    try:
        if not renames.arrived.wait(timeout=60):
            raise AssertionError("no write reached its rename")
        # A block's bytes are all in its temporary file; its final name does not exist yet.
        assert list(engine.connector.root.glob(".*.tmp")) and not list(engine.connector.root.glob("*.kvpack"))
        assert engine.connector.get_num_new_matched_tokens(Req("peek", list(ONE)), 0) == (0, False)
    finally:
        renames.proceed.set()
    engine.connector.flush()
    assert engine.run("again", ONE + [1]).hit_tokens == WHOLE


def test_a_failed_write_makes_its_block_saveable_again(engine: MiniEngine, writer: HeldWriter) -> None:
    writer.failing = True
    writer.open()
    one = engine.run("one", ONE)
    with pytest.raises((OSError, ExceptionGroup)) as caught:
        engine.connector.flush()
    raised = caught.value.exceptions if isinstance(caught.value, ExceptionGroup) else (caught.value,)
    assert raised and all("No space left" in str(error) for error in raised)
    failed = saved_keys(engine.spec, one)
    assert sorted(writer.attempts) == sorted(failed) and writer.written == []
    engine.step()  # carries the worker's report of the failed writes to the scheduler side
    stats = engine.connector.get_kv_connector_stats()
    assert stats is not None and stats["failed_save_blocks"] == len(failed)
    writer.failing = False
    writer.attempts.clear()
    again = engine.run("again", ONE)
    assert again.hit_tokens == 0
    engine.connector.flush()  # the old failure was raised once; these writes succeed
    assert sorted(writer.attempts) == sorted(failed)  # saved again, once each
    assert engine.run("third", ONE + [1]).hit_tokens == WHOLE


def test_a_planned_save_is_held_until_the_worker_reports_it_over() -> None:
    """The scheduler side learns how a save went only from the worker metadata (here: the host pool)."""
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=8)
    request = Req("r", tokens(43, 33), num_computed_tokens=33)
    assert connector.request_finished_all_groups(request, ([1, 2, 3],)) == (True, None)
    metadata = connector.build_connector_meta(None)
    planned = {key for move in metadata.saves for key in move.keys}
    assert len(planned) == 2
    # Planned but not reported over: held, so a second finish saves nothing.
    assert connector.request_finished_all_groups(Req("s", request.all_token_ids, 33), ([4, 5, 6],)) == (False, None)
    connector.update_connector_output(KVConnectorOutput(worker_meta=SaveReport(failed=frozenset(planned))))
    assert connector.pool.capacity - len(connector.pool) == 8  # the slots are free again
    assert connector.request_finished_all_groups(Req("t", request.all_token_ids, 33), ([7, 8, 9],)) == (True, None)
    with pytest.raises(MetadataError, match=r"CPUOffloadConnector\.update_connector_output: expected SaveReport"):
        connector.update_connector_output(KVConnectorOutput(worker_meta=MultiWorkerMetadata(())))


def test_a_host_pool_slot_whose_save_failed_is_free_again() -> None:
    pool = HostPoolIndex(2)
    a, b, c = (BlockKey(0, bytes([i]) * 16) for i in range(3))
    assert (pool.reserve(a), pool.reserve(b)) == (0, 1)
    assert pool.reserve(c) is None  # both slots pending
    pool.release(a)
    assert not pool.holds(a) and not pool.loadable(a)
    assert pool.reserve(c) == 0
    pool.commit(a)  # a report for a key no longer pending changes nothing
    assert not pool.loadable(a) and len(pool) == 2


def test_reports_of_several_workers_merge_and_a_failure_wins() -> None:
    a, b, c = (BlockKey(0, bytes([i]) * 16) for i in range(3))
    merged = SaveReport(frozenset({a, b})).aggregate(SaveReport(frozenset({a}), frozenset({b, c})))
    assert merged == SaveReport(frozenset({a}), frozenset({b, c}))
    with pytest.raises(MetadataError, match="SaveReport.aggregate"):
        SaveReport().aggregate(object())


SMALL_DEMO = ["--requests", "8", "--prefixes", "2", "--prefix-len", "64", "--suffix-len", "17", "--max-tokens", "3",
              "--window", "32", "--kv-heads", "1", "--head-dim", "8", "--num-blocks", "512"]


def _cold_bytes_saved(stack: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["demo", *SMALL_DEMO, "--stack", stack]) == 0
    row = re.search(r"^  bytes saved +(\S+ \S+) +(\S+ \S+)$", capsys.readouterr().out, re.MULTILINE)
    assert row is not None
    return row.group(1)


def test_the_demos_cold_bytes_saved_is_the_same_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    figures = [_cold_bytes_saved("cpu,file", capsys) for _ in range(3)]
    assert len(set(figures)) == 1, figures


class BehindStore(FileStoreConnector):
    """A file store whose writer is :data:`BEHIND`: ``capkv demo --stack tests.connectors.test_saves_once:BehindStore``."""

    def __init__(self, spec: KVSpec, *, root: str | os.PathLike[str], namespace: str = "") -> None:
        super().__init__(spec, root=root, namespace=namespace, write=BEHIND[0])

    def flush(self) -> None:
        BEHIND[0].open()
        super().flush()


BEHIND: list[HeldWriter] = []


def test_the_demos_file_store_saves_each_block_once_however_far_its_writer_falls_behind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer holds every write of the cold run until the demo flushes the store before the
    # warm run: later requests with the same prefixes finish while the first ones' writes wait.
    behind = HeldWriter()
    monkeypatch.setattr(sys.modules[__name__], "BEHIND", [behind])
    held = _cold_bytes_saved(f"{__name__}:BehindStore", capsys)
    assert behind.attempts and len(behind.attempts) == len(set(behind.attempts))
    # The host pool has no background writer; both stores save each distinct block once.
    assert held == _cold_bytes_saved("cpu", capsys)
