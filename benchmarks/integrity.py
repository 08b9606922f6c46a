"""The stores' integrity check against a plain memcpy of the same bytes, one thread.

For block sizes the stores move — the demo model's 16-token block (2 layers a group, 4 KV heads x 64,
bfloat16: 32 KiB per group) and a Llama-3-8B-shaped group (32 layers, 8 KV heads x 128, bfloat16)
at 16, 32 and 128 tokens (2, 4 and 16 MiB) — it checksums ``--mib`` MiB of random blocks one block
at a time (:func:`capkv.stores._checksum.checksum`, as the stores call it) and copies the same
blocks one at a time (``ctypes.memmove`` into a second buffer, as large: no cache holds either).
Figures are GB/s per core, the median of ``--repeats`` rounds (the box is shared: medians, not
bests). For comparison it also times ``zlib.crc32`` (Redis values' old check) and, when the
``crc32c`` package is installed, hardware CRC32C (the alternative the choice was measured against).

Run: python -m benchmarks.integrity [--mib 256] [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import statistics
import sys
import time
import zlib
from collections.abc import Callable

import torch

from capkv.stores._checksum import block_identity, checksum
from capkv.stores._keys import BlockKey
from capkv.stores._value import row_memory

SIZES = [
    ("demo, 16 tokens", 2 * 2 * 16 * 4 * 64 * 2),
    ("llama-8B, 16 tokens", 32 * 2 * 16 * 8 * 128 * 2),
    ("llama-8B, 32 tokens", 32 * 2 * 32 * 8 * 128 * 2),
    ("llama-8B, 128 tokens", 32 * 2 * 128 * 8 * 128 * 2),
]


def _rate(nbytes: int, run: Callable[[], object], repeats: int) -> float:
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.integrity")
    parser.add_argument("--mib", type=int, default=256, help="bytes checksummed per round")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        crc32c: Callable[[memoryview], int] | None = importlib.import_module("crc32c").crc32c
    except ImportError:
        crc32c = None
    identity = block_identity(BlockKey(0, bytes(16)), bytes(16))
    print(f"checksum throughput, one thread, GB/s per core: median of {args.repeats} rounds of {args.mib} MiB")
    print(f"  {'block':<22}{'size':>9}{'memcpy':>9}{'XXH3-128':>10}{'ratio':>7}{'crc32':>8}{'crc32c':>8}")
    for label, size in SIZES:
        count = max(1, (args.mib << 20) // size)
        source = torch.randint(0, 256, (count, size), dtype=torch.uint8)
        target = torch.empty_like(source)
        blocks = [row_memory(source[i]) for i in range(count)]
        nbytes = count * size
        to, of = target.data_ptr(), source.data_ptr()

        def copy() -> None:
            for index in range(count):
                ctypes.memmove(to + index * size, of + index * size, size)

        memcpy = _rate(nbytes, copy, args.repeats)
        xxh3 = _rate(nbytes, lambda: [checksum(block, identity) for block in blocks], args.repeats)
        crc = _rate(nbytes, lambda: [zlib.crc32(block) for block in blocks], max(1, args.repeats // 2))
        castagnoli = "-" if crc32c is None else f"{_rate(nbytes, lambda: [crc32c(b) for b in blocks], args.repeats):.1f}"
        print(f"  {label:<22}{size / 1024:>7.0f}Ki{memcpy:>9.1f}{xxh3:>10.1f}{xxh3 / memcpy:>6.1f}x{crc:>8.1f}{castagnoli:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
