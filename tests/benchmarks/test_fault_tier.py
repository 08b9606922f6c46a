"""The fault campaign's faults (benchmarks/_fault_tier.py): each damage kind is damage capkv's value check
sees, at the header offsets capkv writes; the backend wrapper damages and raises only while armed."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from benchmarks import _fault_tier as faults
from capkv.stores import MemoryBackend, StoreKey
from capkv.stores._checksum import block_identity, checksum
from capkv.stores._keys import BlockKey
from capkv.stores._value import HEADER_SIZE, ValueCheck, check_value, pack_header

PAYLOAD = 256
LAYOUT = b"\x07" * 16


def key(n: int) -> StoreKey:
    return StoreKey(BlockKey(n % 2, bytes([n]) * 16), LAYOUT, HEADER_SIZE + PAYLOAD)


def value(k: StoreKey, fill: int) -> bytes:
    payload = bytes((fill + i) % 251 for i in range(PAYLOAD))
    return pack_header(k.block, k.layout, PAYLOAD, checksum(payload, block_identity(k.block, k.layout))) + payload


@pytest.fixture(autouse=True)
def _forget() -> None:
    faults.forget()


def test_the_offsets_are_capkvs_header_fields() -> None:
    """Each offset is where its field starts in the header capkv packs (a bit flipped there changes that
    field alone)."""
    k = key(3)
    header = value(k, 1)[:HEADER_SIZE]
    fields = struct.unpack("<4sHHII16s16s16s", header)
    for index, (name, offset) in enumerate(faults.HEADER_FIELDS.items()):
        flipped = struct.unpack("<4sHHII16s16s16s", faults.damage(f"header:{name}", header))
        changed = [i for i, (a, b) in enumerate(zip(fields, flipped, strict=True)) if a != b]
        assert changed == [index], f"{name} at {offset} changed fields {changed}"


@pytest.mark.parametrize("kind", faults.DAMAGES)
def test_every_damage_kind_is_found_by_the_value_check(kind: str) -> None:
    k, other = key(3), key(5)  # the same group: a swap is a value of the same length
    original = value(k, 1)
    assert check_value(original, k) is ValueCheck.OK
    damaged = faults.damage(kind, original, value(other, 2))
    assert damaged != original
    assert check_value(damaged, k) is ValueCheck.DAMAGED, kind


def test_swapped_values_are_other_keys_values() -> None:
    a, b, c = value(key(1), 1), value(key(3), 2), value(key(5), 3)
    assert faults.swapped([a, None, b, c], {}) == [b, None, c, a]
    alone = faults.swapped([a], {len(a): b})
    assert alone == [b]
    assert faults.swapped([a], {})[0] not in (a, None)  # no other value known: still not this key's value


def test_the_wrapper_passes_through_until_armed() -> None:
    inner = MemoryBackend()
    wrapped = faults.Faults(inner)
    k = key(1)
    original = value(k, 1)
    assert wrapped.put([(k, memoryview(original))]) == [True]
    assert list(wrapped.get([k])) == [original] and list(wrapped.contains([k])) == [True]
    faults.arm(damage_kind="payload")
    (got,) = wrapped.get([k])
    assert got is not None and check_value(got, k) is ValueCheck.DAMAGED
    buffer = bytearray(len(original) + 32)
    faults.arm(damage_kind="extend")
    assert wrapped.get_into([k], [memoryview(buffer)]) == [len(original) + 16]
    faults.arm(raising=["get", "contains", "put"])
    for call in (lambda: wrapped.get([k]), lambda: wrapped.contains([k]), lambda: wrapped.put([(k, memoryview(original))])):
        with pytest.raises(faults.InjectedIOError):
            call()
    faults.disarm()
    assert list(wrapped.get([k])) == [original]
    assert faults.fired() == 1 + 1 + 3 and faults.puts() == (2, 0)


def test_thread_faults_arm_only_the_wrappers_of_slow_backends() -> None:
    """A ``BaseException`` or a stuck read belongs on a store's reader or writer thread; a fast backend is called
    in the engine's step, where a ``BaseException`` rightly ends the engine."""

    class Slow(MemoryBackend):
        slow = True

    slow, fast = faults.Faults(Slow()), faults.Faults(MemoryBackend())
    k = key(1)
    faults.arm(base_raising=["get", "put"], stuck=["contains"])
    with pytest.raises(faults.InjectedBaseException):
        slow.get([k])
    with pytest.raises(faults.InjectedBaseException):
        slow.put([(k, memoryview(value(k, 1)))])
    assert not isinstance(faults.InjectedBaseException("x"), Exception)
    assert list(fast.get([k])) == [None]  # untouched
    faults.STUCK_S, stuck_for = 0.05, faults.STUCK_S
    try:
        began = time.monotonic()
        assert list(slow.contains([k])) == [False]
        assert time.monotonic() - began >= 0.05
    finally:
        faults.STUCK_S = stuck_for


def test_damage_written_to_the_medium_is_found_by_the_store(tmp_path: Any) -> None:
    """Each kind of :mod:`benchmarks._stored_damage`, written into the file store's packs and the host pool's
    memory, makes the loads of what they hold fail (load errors), never load wrong bytes."""
    from benchmarks._stored_damage import STORED_DAMAGES, damage_files, damage_pools
    from capkv.connectors import FileStoreConnector
    from tests.connectors.conftest import tokens
    from tests.connectors.engine import MiniEngine
    from tests.paged import Group, make_spec

    spec = make_spec([Group(16)], num_blocks=64)
    prompt = tokens(40, 100)
    for kind in STORED_DAMAGES:
        root = tmp_path / kind.replace(":", "-")
        file_engine = MiniEngine(spec, FileStoreConnector(spec, root=root))
        pool_engine = MiniEngine(spec, faults.FaultCPUOffloadConnector(spec, capacity_blocks=64))
        for engine in (file_engine, pool_engine):
            engine.run("seed", prompt)
            engine.connector.flush()
        assert damage_files(root, kind) > 0 and damage_pools(faults.POOLS, kind) > 0, kind
        for engine in (file_engine, pool_engine):
            run = engine.run(f"again-{kind}", prompt + [1])  # the engine checks every block it loads bit for bit
            assert run.load_errors or run.hit_tokens == 0, (kind, run)
            _close_quietly(engine.connector)
        faults.forget()


def _close_quietly(connector: Any) -> None:
    try:
        connector.close()
    except Exception:  # noqa: BLE001 - the damage found is raised again at close, by design
        return
