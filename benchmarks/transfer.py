"""Block copy throughput per model shape: gather/scatter against a contiguous copy of the same bytes.

``capkv bench transfer --model all`` unless ``--model`` (or a shape: ``--layers``, ...) is given: for 16- to
256-token blocks of each preset's group, the throughput of ``BlockCopier.gather`` (paged KV -> host rows) and
``BlockCopier.scatter`` (host rows -> paged KV) and their ratio to a plain contiguous copy of the same bytes on
the same devices (goal >= 0.9). Run: python -m benchmarks.transfer [--model llama-8b] [--device cuda] [--threads 1]
``benchmarks/copy_probe.c`` measures the machine's own limit for such a gather (the same runs copied by a C loop).
"""

from __future__ import annotations

import sys

from capkv.cli._main import main

_SHAPE_FLAGS = ("--model", "--layers", "--kv-heads", "--head-dim", "--dtype")

if __name__ == "__main__":
    given = sys.argv[1:]
    chosen = any(arg.split("=")[0] in _SHAPE_FLAGS for arg in given)
    sys.exit(main(["bench", "transfer", *given, *([] if chosen else ["--model", "all"])]))
