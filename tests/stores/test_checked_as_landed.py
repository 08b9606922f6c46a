"""A file-store load checks each value as it lands in the engine's block, and the read's final answer
still decides: a value told landed and then lost by a later fault, or a backend that never tells, is
judged by what the read answered, never by the early check alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capkv.connectors import FileStoreConnector
from capkv.stores._backend import ReadsIntoParts
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

GROUPS = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)  # six full blocks in group 0; the window needs two of group 1's
HIT = 96
LOADED = 6 + 2


def _stored(root: Path) -> None:
    spec = make_spec(GROUPS, num_blocks=64)
    connector = FileStoreConnector(spec, root=root)
    MiniEngine(spec, connector).run("first", PROMPT)
    connector.shutdown()


def _load(root: Path, read: Callable[..., Any] | None = None) -> tuple[Any, list[tuple[int, int]], FileStoreConnector]:
    """Load the stored prompt once, ``read`` standing in for the backend's ``get_into_parts``; the run,
    what the backend told as landed, the connector."""
    spec = make_spec(GROUPS, num_blocks=64)
    connector = FileStoreConnector(spec, root=root)
    files = connector.files
    if not isinstance(files, ReadsIntoParts):  # the in-place path is what this file is about
        raise AssertionError("the file store no longer reads into parts")
    original = files.get_into_parts
    told: list[tuple[int, int]] = []

    def reading(keys: Any, parts: Any, /, *, landed: Any = None) -> Any:
        def heard(index: int, count: int) -> None:
            told.append((index, count))
            if landed is not None:
                landed(index, count)

        if read is None:
            return original(keys, parts, landed=heard)
        return read(original, keys, parts, heard)

    files.get_into_parts = reading  # type: ignore[method-assign]
    run = MiniEngine(spec, connector).run("again", [*PROMPT, 1])
    return run, told, connector


def test_every_value_is_told_as_it_lands_and_loads(tmp_path: Path) -> None:
    _stored(tmp_path)
    run, told, connector = _load(tmp_path)
    connector.shutdown()
    assert run.hit_tokens == HIT and not run.load_errors
    assert len(told) == LOADED and {count for _, count in told} != {0}


def test_a_fault_after_values_landed_fails_them_all(tmp_path: Path) -> None:
    """The read raised after telling every value landed (and checked good): the read's answer is a
    fault, so every block is a load error — the early verdicts are not trusted over it."""
    _stored(tmp_path)

    def then_raise(original: Any, keys: Any, parts: Any, landed: Any) -> Any:
        original(keys, parts, landed=landed)
        raise OSError("the disk went away after the reads")

    run, told, connector = _load(tmp_path, then_raise)
    with pytest.raises(OSError, match="went away"):  # kept, and raised where the engine shuts the store down
        connector.shutdown()
    assert [index for index, _ in told] == list(range(LOADED))  # one read for the load, both groups
    assert sum(len(ids) for ids in run.load_errors.values()) == LOADED


def test_a_backend_that_never_tells_is_still_checked(tmp_path: Path) -> None:
    """Values read without a word of landing are checked after the read: the good ones load, a damaged
    one is a load error (the read's first value, group 0's, and its last, group 1's)."""
    _stored(tmp_path)

    def silent_and_damaging(original: Any, keys: Any, parts: Any, landed: Any) -> Any:
        del landed
        counts = original(keys, parts)
        for value in (parts[0], parts[-1]):
            last = value[-1]
            last[len(last) - 1] ^= 0x5A  # the value's last payload byte
        return counts

    run, told, connector = _load(tmp_path, silent_and_damaging)
    connector.shutdown()
    assert not told
    assert {group: len(ids) for group, ids in run.load_errors.items()} == {0: 1, 1: 1}


@pytest.mark.parametrize("shortened", [0, 1])
def test_an_answer_other_than_what_landed_is_judged_by_the_answer(tmp_path: Path, shortened: int) -> None:
    """Told a whole value landed, answered short (or a miss): that value is judged by the answer."""
    _stored(tmp_path)

    def answer_short(original: Any, keys: Any, parts: Any, landed: Any) -> Any:
        counts = list(original(keys, parts, landed=landed))
        for index in (shortened, len(counts) - 1 - shortened):  # one of group 0's values, one of group 1's
            counts[index] = None if shortened else counts[index] - 1
        return counts

    run, _, connector = _load(tmp_path, answer_short)
    connector.shutdown()
    assert {group: len(ids) for group, ids in run.load_errors.items()} == {0: 1, 1: 1}


def test_a_load_is_one_backend_call_whatever_its_groups(tmp_path: Path) -> None:
    """Both groups' values come in one ``get_into_parts``: a backend call is a round trip on a disk or a
    network, and a load that paid one per group or per chunk stalled its step (or its receive) that often."""
    _stored(tmp_path)
    calls: list[int] = []

    def counted(original: Any, keys: Any, parts: Any, landed: Any) -> Any:
        calls.append(len(keys))
        return original(keys, parts, landed=landed)

    run, told, connector = _load(tmp_path, counted)
    connector.shutdown()
    assert run.hit_tokens == HIT and not run.load_errors
    assert calls == [LOADED] and len(told) == LOADED
