"""The value every backend stores: it reads back only when key, layout, length and checksum all match."""

from __future__ import annotations

import os
import struct

import pytest
import torch

from capkv.stores import StoreKey
from capkv.stores._checksum import CHECKSUM_SIZE, block_identity, checksum, payload_checksums
from capkv.stores._keys import BlockKey
from capkv.stores._value import (
    HEADER_SIZE,
    ValueCheck,
    check_value,
    check_values,
    pack_header,
    row_memory,
    seal_values,
    why_damaged,
)

KEY = BlockKey(1, bytes(range(16)))
LAYOUT = b"L" * 16
PAYLOAD = os.urandom(4096)
STORE_KEY = StoreKey(KEY, LAYOUT, HEADER_SIZE + len(PAYLOAD))


def value(key: BlockKey = KEY, layout: bytes = LAYOUT, payload: bytes = PAYLOAD) -> bytes:
    (checksum,) = payload_checksums(
        torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(1, -1), [block_identity(key, layout)]
    )
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


@pytest.mark.parametrize("offset", [*range(HEADER_SIZE), HEADER_SIZE, HEADER_SIZE + 1000, HEADER_SIZE + 4095])
def test_any_flipped_byte_is_damage(offset: int) -> None:
    """Every header field too: the layout and format version are in the key, so a value read under this
    key that claims another is damaged, never someone else's (it is deleted at its first failed load)."""
    damaged = bytearray(value())
    damaged[offset] ^= 0x01
    assert check(bytes(damaged)) is ValueCheck.DAMAGED


@pytest.mark.parametrize("cut", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, HEADER_SIZE + 4095])
def test_a_truncated_value_is_damage(cut: int) -> None:
    assert check(value()[:cut]) is ValueCheck.DAMAGED


def test_a_padded_value_is_damage() -> None:
    assert check(value() + b"\0") is ValueCheck.DAMAGED


def test_another_keys_value_is_damage() -> None:
    assert check(value(key=BlockKey(1, bytes(16)))) is ValueCheck.DAMAGED
    assert check(value(key=BlockKey(0, KEY.digest))) is ValueCheck.DAMAGED


def test_a_value_claiming_another_layout_or_format_version_is_damage() -> None:
    assert check(value(layout=b"M" * 16)) is ValueCheck.DAMAGED
    for version in (1, 3):  # 1: a position-weighted sum, never misread as this one
        other = bytearray(value())
        struct.pack_into("<H", other, 4, version)
        assert check(bytes(other)) is ValueCheck.DAMAGED


def _sums(rows: torch.Tensor, identity: bytes = b"i") -> list[bytes]:
    return payload_checksums(rows, [identity] * rows.shape[0])


def test_the_checksum_sees_every_damage_pattern() -> None:
    generator = torch.Generator().manual_seed(1)
    block = torch.randint(0, 256, (1, 32 << 10), dtype=torch.uint8, generator=generator)
    (base,) = _sums(block)
    assert len(base) == CHECKSUM_SIZE and checksum(row_memory(block[0]), b"i") == base
    for bit in range(0, block.numel() * 8, 61):  # single bits across the block
        flipped = block.clone()
        flipped[0, bit // 8] ^= 1 << (bit % 8)
        assert _sums(flipped)[0] != base
    for i, j in ((0, 1), (3, 17), (0, 4095), (100, 101)):  # two top bits: what a weighted sum mod 2**64 misses
        flipped = block.clone()
        flipped[0, i * 8 + 7] ^= 0x80
        flipped[0, j * 8 + 7] ^= 0x80
        assert _sums(flipped)[0] != base
    words = block.view(torch.int64)
    for i, j in ((0, 1), (0, 64), (3, 200), (100, 101), (5, 69)):
        swapped = words.clone()
        swapped[0, i], swapped[0, j] = words[0, j].item(), words[0, i].item()
        assert _sums(swapped.view(torch.uint8))[0] != base
    assert _sums(torch.zeros_like(block))[0] != base
    assert _sums(torch.roll(block, 4096, dims=1))[0] != base  # a shifted sector
    odd = torch.randint(0, 256, (2, 1001), dtype=torch.uint8, generator=generator)  # not whole words
    assert len(set(_sums(odd))) == 2


def test_the_checksum_is_bound_to_the_key_and_layout() -> None:
    """The same bytes under another key or layout have another checksum: a payload that arrives whole,
    with its own checksum, under another block's header is damage."""
    payload = torch.frombuffer(bytearray(PAYLOAD), dtype=torch.uint8).view(1, -1)
    identities = [
        block_identity(KEY, LAYOUT), block_identity(BlockKey(0, KEY.digest), LAYOUT),
        block_identity(BlockKey(1, bytes(16)), LAYOUT), block_identity(KEY, b"M" * 16),
    ]
    assert len({payload_checksums(payload, [identity])[0] for identity in identities}) == len(identities)
    other = value(key=BlockKey(1, bytes(16)), payload=bytes(reversed(PAYLOAD)))
    checksum_at = HEADER_SIZE - CHECKSUM_SIZE
    spliced = value()[:checksum_at] + other[checksum_at:]  # this key's header, another value's checksum and bytes
    assert check(spliced) is ValueCheck.DAMAGED


def test_checksums_of_rows_inside_wider_rows_are_the_payloads_own() -> None:
    """The store checksums ``rows[:, HEADER_SIZE:]`` in place: a strided view must give the same answer."""
    generator = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 256, (3, HEADER_SIZE + 2048), dtype=torch.uint8, generator=generator)
    assert _sums(rows[:, HEADER_SIZE:]) == _sums(rows[:, HEADER_SIZE:].contiguous())


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        (None, "absent"),
        (value(BlockKey(2, b"o" * 16)), "another block's value: its header names group 2, digest 6f6f6f6f6f6f; "
                                        "the key is group 1, digest 000102030405"),
        (value(BlockKey(0, b"o" * 16), payload=PAYLOAD[:100]), "another block's value: its header names group 0"),
        (value()[:-1], f"{STORE_KEY.nbytes - 1} bytes long, not the {STORE_KEY.nbytes} of its value (cut short or padded)"),
        (b"\0" * STORE_KEY.nbytes, "not a capkv value of this format"),
        (value(layout=b"M" * 16), "a value of another layout or shard"),
        (value()[:HEADER_SIZE] + bytes(4096), "its payload is not the one saved (the checksum does not match)"),
    ],
)
def test_why_a_value_is_damaged_is_said_in_words(stored: bytes | None, why: str) -> None:
    """The first field that does not match, for the warning a failed load logs (another key's value first:
    it has another length when it is another group's)."""
    length = None if stored is None else len(stored)
    assert why_damaged(STORE_KEY, length, stored or b"").startswith(why)
    assert check(stored) is not ValueCheck.OK
