"""The fault campaign's faults (benchmarks/_fault_tier.py): each damage kind is damage capkv's value check
sees, at the header offsets capkv writes; the backend wrapper damages and raises only while armed."""

from __future__ import annotations

import struct

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
