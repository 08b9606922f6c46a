"""The value every backend stores: it reads back only when key, layout, length and checksum all match."""

from __future__ import annotations

import os
import struct

import pytest
import torch

from capkv.stores import StoreKey
from capkv.stores._checksum import payload_checksums
from capkv.stores._keys import BlockKey
from capkv.stores._value import HEADER_SIZE, ValueCheck, check_value, check_values, pack_header, seal_values

KEY = BlockKey(1, bytes(range(16)))
LAYOUT = b"L" * 16
PAYLOAD = os.urandom(4096)
STORE_KEY = StoreKey(KEY, LAYOUT, HEADER_SIZE + len(PAYLOAD))


def value(key: BlockKey = KEY, layout: bytes = LAYOUT, payload: bytes = PAYLOAD) -> bytes:
    (checksum,) = payload_checksums(torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(1, -1))
    return pack_header(key, layout, len(payload), checksum) + payload


def check(stored: bytes | None, key: StoreKey = STORE_KEY) -> ValueCheck:
    """What the store's load makes of ``stored`` read back under ``key`` (as a backend's ``get`` returns it)."""
    return check_value(stored, key)


def test_the_header_is_64_bytes_and_a_value_reads_back() -> None:
    assert HEADER_SIZE == 64
    assert check(value()) is ValueCheck.OK


def test_seal_writes_the_header_the_check_expects() -> None:
    rows = torch.zeros((2, STORE_KEY.nbytes), dtype=torch.uint8)
    rows[:, HEADER_SIZE:] = torch.frombuffer(bytearray(PAYLOAD * 2), dtype=torch.uint8).view(2, -1)
    other = StoreKey(BlockKey(0, b"x" * 16), LAYOUT, STORE_KEY.nbytes)
    values = seal_values(rows, [STORE_KEY, other])
    assert bytes(values[0]) == value()
    assert check_values(rows, [STORE_KEY, other], [STORE_KEY.nbytes] * 2) == [ValueCheck.OK, ValueCheck.OK]
    assert check_values(rows, [other, STORE_KEY], [STORE_KEY.nbytes] * 2) == [ValueCheck.DAMAGED] * 2  # swapped


def test_absent_is_absent() -> None:
    assert check(None) is ValueCheck.ABSENT


@pytest.mark.parametrize("offset", [0, 5, 6, 8, 12, 20, 40, 47, 50, 63, HEADER_SIZE, HEADER_SIZE + 1000, HEADER_SIZE + 4095])
def test_any_flipped_byte_is_a_miss_and_damage_outside_the_layout_field(offset: int) -> None:
    damaged = bytearray(value())
    damaged[offset] ^= 0x01
    found = check(bytes(damaged))
    assert found is not ValueCheck.OK
    if not 32 <= offset < 48 and offset not in (4, 5):  # all but the layout fingerprint and the version
        assert found is ValueCheck.DAMAGED


@pytest.mark.parametrize("cut", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, HEADER_SIZE + 4095])
def test_a_truncated_value_is_damage(cut: int) -> None:
    assert check(value()[:cut]) is ValueCheck.DAMAGED


def test_a_padded_value_is_damage() -> None:
    assert check(value() + b"\0") is ValueCheck.DAMAGED


def test_another_keys_value_is_damage() -> None:
    assert check(value(key=BlockKey(1, bytes(16)))) is ValueCheck.DAMAGED
    assert check(value(key=BlockKey(0, KEY.digest))) is ValueCheck.DAMAGED


def test_another_layouts_value_is_foreign_never_loaded() -> None:
    assert check(value(layout=b"M" * 16)) is ValueCheck.FOREIGN


def test_another_format_version_is_foreign() -> None:
    newer = bytearray(value())
    struct.pack_into("<H", newer, 4, 2)
    assert check(bytes(newer)) is ValueCheck.FOREIGN


def test_the_checksum_sees_every_bit_flip_and_moved_words() -> None:
    generator = torch.Generator().manual_seed(1)
    block = torch.randint(0, 256, (1, 4096), dtype=torch.uint8, generator=generator)
    (base,) = payload_checksums(block)
    for bit in range(0, 4096 * 8, 97):
        flipped = block.clone()
        flipped[0, bit // 8] ^= 1 << (bit % 8)
        assert payload_checksums(flipped)[0] != base
    words = block.view(torch.int64)
    for i, j in ((0, 1), (0, 64), (3, 200), (100, 101), (5, 69)):
        swapped = words.clone()
        swapped[0, i], swapped[0, j] = words[0, j].item(), words[0, i].item()
        assert payload_checksums(swapped.view(torch.uint8))[0] != base
    assert payload_checksums(torch.zeros_like(block))[0] != base
    odd = torch.randint(0, 256, (2, 1001), dtype=torch.uint8, generator=generator)  # not whole words
    assert len(set(payload_checksums(odd))) == 2


def test_checksums_of_rows_inside_wider_rows_are_the_payloads_own() -> None:
    """The store checksums ``rows[:, HEADER_SIZE:]`` in place: a strided view must give the same answer."""
    generator = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 256, (3, HEADER_SIZE + 2048), dtype=torch.uint8, generator=generator)
    assert payload_checksums(rows[:, HEADER_SIZE:]) == payload_checksums(rows[:, HEADER_SIZE:].contiguous())
