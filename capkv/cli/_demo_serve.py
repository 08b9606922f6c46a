"""``capkv demo``'s scenario: the cold run, then the warm one after the engine forgets its prefix cache."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from capkv.capabilities._hma import StackNode
from capkv.cli._demo_report import RunSummary, Tiered, print_summary
from capkv.cli._progress import Progress, TextStream
from capkv.engine import Engine, VerificationError, Workload

__all__ = ["serve"]


@runtime_checkable
class Flushable(Protocol):
    """A store that finishes writes in the background, and can wait for them (``FileStoreConnector``)."""

    def flush(self) -> None: ...


def _flush(node: object) -> None:
    """Wait until every store in the stack holds what it was asked to save.

    Between the runs only: the demo measures reuse, not how fast a disk catches up
    (a block still being written is, rightly, not a hit).
    """
    if isinstance(node, StackNode):
        for child in node.children:
            _flush(child)
    elif isinstance(node, Flushable):
        node.flush()


def serve(out: TextStream, engine: Engine, workload: Workload, stack: object) -> int:
    runs: list[RunSummary] = []
    out.write("serving\n")
    try:
        for label in ("cold", "warm"):
            if runs:
                _flush(stack)
                engine.reset_prefix_cache()
            engine.stats.reset()
            progress = Progress(label, workload.num_requests, out)
            tiers = engine.connector if isinstance(engine.connector, Tiered) else None
            before = (tiers.loaded_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            started = time.perf_counter()
            finished = engine.run(workload.requests(label), progress)
            progress.close(len(finished))
            loaded, promoted = (tiers.loaded_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            runs.append(RunSummary(
                label, time.perf_counter() - started, engine.stats.snapshot(),
                tuple(b - a for a, b in zip(before[0], loaded, strict=True)),
                tuple(b - a for a, b in zip(before[1], promoted, strict=True)),
            ))
    except VerificationError as error:
        out.write("\n")
        print_summary(out, engine, runs)
        out.write(f"verified: MISMATCH: {error.mismatch.describe()}\n")
        return 1
    finally:
        engine.shutdown()
    out.write("\n")
    print_summary(out, engine, runs)
    out.write("verified: bit-exact (every loaded block, and every request's KV at finish, against recomputation)\n")
    return 0
