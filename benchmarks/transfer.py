"""Block copy throughput: gather/scatter against a contiguous copy of the same bytes.

Prints, for 16- to 256-token blocks, the throughput of
``BlockCopier.gather`` (paged KV -> host rows) and ``BlockCopier.scatter``
(host rows -> paged KV) and their ratio to a plain contiguous copy of the same
number of bytes on the same devices. Same as ``capkv bench transfer``.

Run: python -m benchmarks.transfer [--device cuda] [--mib 256] ...
"""

from __future__ import annotations

import sys

from capkv.cli._main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "transfer", *sys.argv[1:]]))
