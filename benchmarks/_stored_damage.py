"""Damage written to where a store keeps its values — the file store's packs on disk, the Redis server's
values, the host pool's memory — not only to what a read returns.

The campaign's read-path damage (``benchmarks/_fault_tier.py``) shows what the store's checks make of a bad
value; this shows what the store's own state makes of it: an index that still points at records whose bytes
changed under it, a pack cut short, a slot rewritten, a Redis value replaced. Each kind is applied to every
value the medium holds:

- ``stored:flip``: one bit of each value's payload and one of its header's digest;
- ``stored:truncate``: each pack cut by 100 bytes (its last record), each Redis value by 16 bytes, each pool
  slot's recorded length by 16 bytes;
- ``stored:swap``: the values of one size rotated among their places, so each key holds another key's value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from capkv.connectors._block_file import PACK_SUFFIX, scan_pack
from capkv.stores._value import HEADER_SIZE

__all__ = ["STORED_DAMAGES", "damage_files", "damage_pools", "damage_redis"]

STORED_DAMAGES = ("stored:flip", "stored:truncate", "stored:swap")

_DIGEST = 16
"""Offset of the header's digest (``capkv/stores/_value.py``)."""


def _flip(value: bytearray) -> None:
    value[_DIGEST] ^= 0x01
    if len(value) > HEADER_SIZE:
        value[HEADER_SIZE + (len(value) - HEADER_SIZE) // 2] ^= 0x10


def _rotate(values: list[bytes]) -> list[bytes]:
    """Each value replaced by the next one of the same length (a value alone keeps its own)."""
    out = list(values)
    by_length: dict[int, list[int]] = {}
    for index, value in enumerate(values):
        by_length.setdefault(len(value), []).append(index)
    for indexes in by_length.values():
        for position, index in enumerate(indexes):
            out[index] = values[indexes[(position + 1) % len(indexes)]]
    return out


def damage_files(root: Path, kind: str) -> int:
    """Damage every pack under ``root`` in place (its inode kept: open descriptors read the damage); the
    number of values damaged."""
    damaged = 0
    for pack in sorted(root.rglob(f"*{PACK_SUFFIX}")):
        records = list(scan_pack(pack))
        if not records:
            continue
        with open(pack, "r+b") as file:
            if kind == "stored:truncate":
                file.truncate(max(0, os.fstat(file.fileno()).st_size - 100))
                damaged += 1
                continue
            values = []
            for record in records:
                file.seek(record.offset)
                values.append(file.read(HEADER_SIZE + record.length))
            if kind == "stored:flip":
                changed = [bytearray(value) for value in values]
                for value in changed:
                    _flip(value)
                values_out = [bytes(value) for value in changed]
            elif kind == "stored:swap":
                values_out = _rotate(values)
            else:
                raise ValueError(f"damage_files: unknown kind {kind!r}")
            for record, before, after in zip(records, values, values_out, strict=True):
                if after != before:
                    file.seek(record.offset)
                    file.write(after)
                    damaged += 1
            file.flush()
            os.fsync(file.fileno())
    return damaged


def damage_redis(url: str, kind: str) -> int:
    """Damage every value the Redis server at ``url`` holds; the number damaged."""
    import redis

    client: Any = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(count=1000))
        values: list[bytes] = [client.get(key) for key in keys]
        present = [(key, value) for key, value in zip(keys, values, strict=True) if value is not None]
        if kind == "stored:swap":
            after = _rotate([value for _, value in present])
        elif kind == "stored:truncate":
            after = [value[:-16] for _, value in present]
        elif kind == "stored:flip":
            after = []
            for _, value in present:
                changed = bytearray(value)
                _flip(changed)
                after.append(bytes(changed))
        else:
            raise ValueError(f"damage_redis: unknown kind {kind!r}")
        damaged = 0
        for (key, before), value in zip(present, after, strict=True):
            if value != before:
                client.set(key, value)
                damaged += 1
        return damaged
    finally:
        client.close()


def damage_pools(pools: Iterable[Any], kind: str) -> int:
    """Damage every value held by the host pools (``capkv.connectors._cpu_offload.HostPool``) ``pools``;
    the number damaged."""
    damaged = 0
    for pool in pools:
        with pool._lock:  # noqa: SLF001 (the campaign reaches into the pool it damages)
            slots: dict[Any, int] = dict(pool._slots)  # noqa: SLF001
            lengths: dict[Any, int] = pool._lengths  # noqa: SLF001
            memory: memoryview = pool._memory  # noqa: SLF001
            stride: int = pool._stride  # noqa: SLF001
            held = [(key, slot) for key, slot in slots.items() if lengths.get(key)]
            if kind == "stored:truncate":
                for key, _ in held:
                    lengths[key] -= 16
                damaged += len(held)
                continue
            values = [bytes(memory[slot * stride : slot * stride + lengths[key]]) for key, slot in held]
            if kind == "stored:flip":
                after = []
                for value in values:
                    changed = bytearray(value)
                    _flip(changed)
                    after.append(bytes(changed))
            elif kind == "stored:swap":
                after = _rotate(values)
            else:
                raise ValueError(f"damage_pools: unknown kind {kind!r}")
            for (key, slot), before, value in zip(held, values, after, strict=True):
                if value != before:
                    memory[slot * stride : slot * stride + len(value)] = value
                    lengths[key] = len(value)
                    damaged += 1
    return damaged
