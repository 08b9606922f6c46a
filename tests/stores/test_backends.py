"""The backend contract: any backend under StoreConnector serves; what a backend is unsure of is a miss."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

import pytest
import torch

from capkv import CapkvError, KVSpec
from capkv.stores import Backend, MemoryBackend, StoreConnector, StoreKey
from capkv.stores._staging import StagingRing
from capkv.testing import assert_conformant
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)


def test_the_memory_backend_conforms() -> None:
    report = assert_conformant(lambda spec: StoreConnector(spec, MemoryBackend()), before_warm=StoreConnector.flush)
    assert all(min(r.warm_loaded_tokens) > 0 for r in report.results)


def test_the_memory_backend_is_a_backend() -> None:
    assert isinstance(MemoryBackend(), Backend)


class Liar(MemoryBackend):
    """Says it holds values it does not (or returns another key's value)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.lying = False

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        return [True] * len(keys) if self.lying else super().contains(keys)

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        if self.lying and self.mode == "other key":
            anything = next(iter(self.values.values()))
            return [anything] * len(keys)
        return super().get(keys)


@pytest.mark.parametrize("mode", ["absent", "other key"])
def test_a_backend_that_claims_what_it_lacks_gives_load_errors_never_wrong_kv(mode: str) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    backend = Liar(mode)
    engine = MiniEngine(spec, StoreConnector(spec, backend))  # the engine checks every loaded block bit for bit
    engine.run("seed", tokens(7, 40))
    engine.connector.flush()
    backend.lying = True
    run = engine.run("lied-to", PROMPT)
    assert run.hit_tokens == 96 and run.loaded == {}
    assert sum(len(ids) for ids in run.load_errors.values()) == 8
    if mode == "other key":
        assert engine.connector._store.damaged_values == 8


def test_a_backend_whose_reads_raise_gives_load_errors_and_flush_raises_once() -> None:
    spec = make_spec(WINDOWED, num_blocks=64)

    class Broken(MemoryBackend):
        broken = False

        def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
            if self.broken:
                raise ConnectionError("backend down")
            return super().get(keys)

    backend = Broken()
    engine = MiniEngine(spec, StoreConnector(spec, backend))
    engine.run("first", PROMPT)
    engine.connector.flush()
    backend.broken = True
    run = engine.run("second", PROMPT + [1])
    assert run.hit_tokens == 96 and sum(len(ids) for ids in run.load_errors.values()) == 8
    with pytest.raises(ConnectionError):
        engine.connector.flush()
    engine.connector.flush()


@pytest.mark.parametrize("backend", [object(), {"contains": 1}, MemoryBackend], ids=["object", "dict", "the class"])
def test_what_is_not_a_backend_is_refused_by_name(backend: object) -> None:
    spec: KVSpec = make_spec(WINDOWED, num_blocks=64)
    with pytest.raises(CapkvError, match="backend") as caught:  # production: ArgumentError; dev mode: the type contract
        StoreConnector(spec, backend)  # type: ignore[arg-type]
    assert "StoreConnector" in str(caught.value)


def test_a_damaged_value_from_a_get_only_backend_never_reaches_the_engines_block() -> None:
    """On a CPU KV cache a ``get`` backend's values are checked where it returned them and only those
    that pass are copied into blocks: the damaged value's block keeps what it held (the engine's compute
    is switched off here, so nothing else writes it), its neighbours hold the stored KV."""
    spec = make_spec(WINDOWED, num_blocks=64)
    backend = MemoryBackend()
    writer = MiniEngine(spec, StoreConnector(spec, backend))
    writer.run("seed", PROMPT)
    writer.connector.flush()
    damaged_key = sorted(backend.values, key=repr)[3]
    value = bytearray(backend.values[damaged_key])
    value[-1] ^= 0x01
    backend.values[damaged_key] = bytes(value)
    reader = MiniEngine(spec, StoreConnector(spec, backend), seed=1)
    reader.compute = lambda *args, **kwargs: None  # type: ignore[method-assign]
    before = {name: tensor.clone() for name, tensor in reader._ints.items()}  # the engine scribbled every block
    run = reader.run("again", [*PROMPT, 1], finish=False)
    (group, failed), = run.load_errors.items()
    (block_id,) = failed
    layers = spec.groups[group].layer_names
    assert all(torch.equal(reader._block(name, block_id), before[name].select(1, block_id)) for name in layers), (
        "the damaged value was copied in"
    )
    assert sum(map(len, run.loaded.values())) == 7  # checked bit for bit by the engine


class _Tracked(bytearray):
    """A value whose life a test can watch (a ``bytes`` cannot be weakly referenced)."""


class _ChunkedGets(MemoryBackend):
    """Records each ``get``'s size and how many values of earlier ``get``s were still held when it came;
    ``fail_after`` gets, every later one raises."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.held: list[int] = []
        self.fail_after = fail_after
        self._given: list[weakref.ref[_Tracked]] = []

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        gc.collect()
        self.held.append(sum(ref() is not None for ref in self._given))
        self.sizes.append(len(keys))
        if self.fail_after is not None and len(self.sizes) > self.fail_after:
            raise ConnectionError("backend down")
        values = [None if value is None else _Tracked(value) for value in super().get(keys)]
        self._given += [weakref.ref(value) for value in values if value is not None]
        return values  # type: ignore[return-value]  # bytearrays: bytes-like, as the contract allows


def _two_blocks_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StagingRing, "rows_per_chunk", lambda self, row_nbytes: 2)


def _seeded_in_chunks(monkeypatch: pytest.MonkeyPatch) -> tuple[KVSpec, _ChunkedGets]:
    """A get-only backend holding the prompt's blocks, read back two blocks a chunk from here on."""
    spec = make_spec(WINDOWED, num_blocks=64)
    backend = _ChunkedGets()
    writer = MiniEngine(spec, StoreConnector(spec, backend))
    writer.run("seed", PROMPT)
    writer.connector.flush()
    _two_blocks_a_chunk(monkeypatch)
    return spec, backend


def test_a_get_only_backend_is_asked_chunk_by_chunk_and_a_chunks_values_go_before_the_next_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's values are never all held at once (an 8B-shaped step is hundreds of MiB, page-faulted afresh
    on every load when they are): one ``get`` per chunk, and at most one earlier value still held."""
    spec, backend = _seeded_in_chunks(monkeypatch)
    backend.sizes.clear()
    backend.held.clear()
    run = MiniEngine(spec, StoreConnector(spec, backend), seed=1).run("again", [*PROMPT, 1])
    assert sum(map(len, run.loaded.values())) == 8 and not run.load_errors  # checked bit for bit by the engine
    assert backend.sizes == [2, 2, 2, 2], backend.sizes
    assert max(backend.held) <= 1, backend.held


def test_a_get_that_raises_mid_step_fails_the_blocks_not_read_yet_and_keeps_those_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec, backend = _seeded_in_chunks(monkeypatch)
    backend.fail_after = len(backend.sizes) + 1  # the step's first chunk is read, the others raise
    reader = MiniEngine(spec, StoreConnector(spec, backend), seed=1)
    run = reader.run("again", [*PROMPT, 1])
    assert sum(map(len, run.loaded.values())) == 2 and sum(map(len, run.load_errors.values())) == 6
    assert backend.sizes[-1] == 2 and len(backend.sizes) == backend.fail_after + 1  # no get after the one that raised
    with pytest.raises(ConnectionError):
        reader.connector.flush()
