"""The file store's lookup miss at 3,000 packs, on the scheduler's path.

A store directory holds ``--packs`` packs (4 records of 32 KiB each, written
without fsync to save setup time; the bytes and format are the real ones). One
catalog (the scheduler's view) has listed it; another (a worker process) keeps
writing. The figure is the latency of ``PackCatalog.find`` for a key that is not
stored, in two cases:

- quiet: nothing changed since the previous lookup;
- busy: the other process wrote one pack since the previous lookup (the case
  where a catalog that follows the directory by its mtime lists it all again).

Median and worst of ``--lookups`` misses each (the box is shared: medians are
the figure; worst cases show what one unlucky scheduler step pays).

Run: python -m benchmarks.file_store_lookup [--packs 3000] [--lookups 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from capkv.connectors._block_file import PackRecord, write_pack
from capkv.connectors._pack_catalog import PackCatalog
from capkv.stores._checksum import block_identity, checksum
from capkv.stores._keys import BlockKey
from capkv.stores._value import row_memory

FINGERPRINT = b"f" * 16
RECORDS, NBYTES = 4, 32 << 10


def _pack(root: Path, serial: int, payload: memoryview) -> tuple[str, list[object]]:
    records = []
    for index in range(RECORDS):
        key = BlockKey(0, (serial * RECORDS + index).to_bytes(16, "little"))
        records.append(PackRecord(key, FINGERPRINT, payload, checksum(payload, block_identity(key, FINGERPRINT))))
    with mock.patch.object(os, "fsync", lambda descriptor: None):
        name, headers = write_pack(root, records)
    return name, list(headers)


def _miss(catalog: PackCatalog, serial: int) -> float:
    key = BlockKey(0, (10**9 + serial).to_bytes(16, "little"))
    started = time.perf_counter()
    found = catalog.find(key, FINGERPRINT)
    elapsed = time.perf_counter() - started
    if found is not None:
        raise SystemExit("a key never stored was found")
    return elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.file_store_lookup")
    parser.add_argument("--packs", type=int, default=3000)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    payload = row_memory(torch.randint(0, 256, (NBYTES,), dtype=torch.uint8))
    with tempfile.TemporaryDirectory(prefix="capkv-lookup-", dir=args.dir) as directory:
        root = Path(directory)
        for serial in range(args.packs):
            _pack(root, serial, payload)
        capacity = 1 << 40
        scheduler, worker = PackCatalog(root, capacity), PackCatalog(root, capacity)
        quiet = [_miss(scheduler, i) for i in range(args.lookups)]
        busy: list[float] = []
        for i in range(args.lookups):
            name, headers = _pack(root, args.packs + i, payload)
            worker.add(name, headers)  # type: ignore[arg-type]
            busy.append(_miss(scheduler, args.lookups + i))
        listed = len(scheduler)
    print(f"file store lookup miss, {args.packs} packs ({listed} records listed at the end), {args.lookups} misses each")
    for label, times in (("quiet", quiet), ("busy (a pack written before each miss)", busy)):
        print(f"  {label:<40} median {statistics.median(times) * 1e6:8.1f} us   worst {max(times) * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
