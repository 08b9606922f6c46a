"""The store directory's journal: every line reaches every reader, across rotations, or the reader is told."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from capkv.connectors import _pack_journal
from capkv.connectors._pack_journal import PackJournal, latest_generation


def _reader(root: Path) -> PackJournal:
    journal = PackJournal(root)
    journal.start(latest_generation([p.name for p in root.iterdir()]))
    return journal


def test_lines_reach_a_reader_in_order_and_once(tmp_path: Path) -> None:
    writer, reader = PackJournal(tmp_path), _reader(tmp_path)
    assert reader.read() == []
    for index in range(5):
        writer.append(f"+p{index}.kvpack")
    assert reader.read() == [f"+p{index}.kvpack" for index in range(5)]
    assert reader.read() == []


def test_no_line_is_lost_across_rotations_with_two_writers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pack_journal, "ROTATE_BYTES", 200)  # a generation every few lines
    writers = [PackJournal(tmp_path), PackJournal(tmp_path)]
    reader = _reader(tmp_path)
    rng = random.Random(0)
    written: list[str] = []
    seen: list[str] = []
    for index in range(400):
        line = f"+{index:05d}.kvpack"
        rng.choice(writers).append(line)
        written.append(line)
        if rng.random() < 0.3:
            got = reader.read()
            assert got is not None
            seen += got
    got = reader.read()
    assert got is not None
    seen += got
    assert sorted(set(seen)) == written  # every line (a line may come twice, around a rotation)
    generations = [p.name for p in tmp_path.iterdir()]
    assert latest_generation(generations) > 10 and len(generations) <= 3  # old generations are removed


def test_a_reader_left_behind_is_told_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pack_journal, "ROTATE_BYTES", 100)
    writer, reader = PackJournal(tmp_path), _reader(tmp_path)
    for index in range(100):  # many generations go by without the reader
        writer.append(f"+{index:05d}.kvpack")
    assert reader.read() is None


def test_a_removed_directory_is_told_and_a_new_one_followed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    writer, reader = PackJournal(root), _reader(root)
    writer.append("+a.kvpack")
    assert reader.read() == ["+a.kvpack"]
    shutil.rmtree(root)
    assert reader.read() is None
    root.mkdir()
    reader.start(0)
    writer.append("+b.kvpack")  # the writer finds its generation gone and starts the new directory's
    assert reader.read() == ["+b.kvpack"]
