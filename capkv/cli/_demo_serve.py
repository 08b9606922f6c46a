"""``capkv demo``'s scenario: the cold run, then the warm one after the engine forgets its prefix cache.

The verdict counts what landed: a load the stack offered that failed (the engine
recomputed it) is no pass, whatever the bytes; with ``--tiered`` neither is a warm
run whose hits fall short of what one store holding every block would offer.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, runtime_checkable

from capkv.capabilities._hma import StackNode, describe
from capkv.cli._demo_report import RunSummary, Tiered, print_summary
from capkv.cli._progress import Progress, TextStream
from capkv.engine import Engine, VerificationError, Workload
from capkv.engine._diagnosis import LoggedCauses, explain, failed_loads, short_hits

__all__ = ["NOT_VERIFIED", "VERIFIED", "serve"]

VERIFIED = 0
NOT_VERIFIED = 3
"""Exit status of a run whose KV was bit-exact but whose stack did not serve what it offered."""


@runtime_checkable
class Flushable(Protocol):
    """A store that finishes writes in the background, and can wait for them (``FileStoreConnector``)."""

    def flush(self) -> None: ...


def _flush(node: object, raised: list[str]) -> None:
    """Wait until every store in the stack holds what it was asked to save; what a store's ``flush`` raises
    (the failures it kept) goes to ``raised``.

    Between the runs only: the demo measures reuse, not how fast a disk catches up
    (a block still being written is, rightly, not a hit).
    """
    if isinstance(node, StackNode):
        for child in node.children:
            _flush(child, raised)
    elif isinstance(node, Flushable):
        try:
            node.flush()
        except Exception as error:  # noqa: BLE001 - reported after the summary
            raised.append(f"flushing {describe(node)} between the runs raised {explain(error)}")


def serve(out: TextStream, engine: Engine, workload: Workload, stack: object, *, tiered: bool = False) -> int:
    """Serve the cold and the warm run, print the summary and the verdict; the exit status. What flushing or
    shutting the stack down raised is a line on stderr each, and exit status 2."""
    runs: list[RunSummary] = []
    raised: list[str] = []
    out.write("serving\n")
    with LoggedCauses() as causes:
        try:
            mismatch = _runs(out, engine, workload, stack, runs, causes, raised)
        except BaseException:
            _shut_down_quietly(engine)
            raise
        try:
            engine.shutdown()
        except Exception as error:  # noqa: BLE001 - reported after the summary
            raised.append(f"shutting the stack down raised {explain(error)}")
    out.write("\n")
    print_summary(out, engine, runs)
    if mismatch is not None:
        out.write(f"verified: MISMATCH: {mismatch.mismatch.describe()}\n")
        status = 1
    else:
        findings = _findings(runs, tiered=tiered)
        for finding in findings:
            out.write(f"not verified: {finding}\n")
        if not findings:
            out.write("verified: bit-exact (every loaded block, and every request's KV at finish, against recomputation)\n")
        status = NOT_VERIFIED if findings else VERIFIED
    out.flush()
    for line in raised:
        print(f"capkv demo: {' '.join(line.split())}", file=sys.stderr)
    return 2 if raised and status != 1 else status


def _runs(
    out: TextStream, engine: Engine, workload: Workload, stack: object, runs: list[RunSummary], causes: LoggedCauses,
    raised: list[str],
) -> VerificationError | None:
    try:
        for label in ("cold", "warm"):
            if runs:
                _flush(stack, raised)
                engine.reset_prefix_cache()
            engine.stats.reset()
            progress = Progress(label, workload.num_requests, out)
            tiers = engine.connector if isinstance(engine.connector, Tiered) else None
            before = (tiers.landed_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            started, logged = time.perf_counter(), len(causes.messages)
            finished = engine.run(workload.requests(label), progress)
            progress.close(len(finished))
            loaded, promoted = (tiers.landed_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            runs.append(RunSummary(
                label, time.perf_counter() - started, engine.stats.snapshot(),
                tuple(b - a for a, b in zip(before[0], loaded, strict=True)),
                tuple(b - a for a, b in zip(before[1], promoted, strict=True)),
                causes.first(logged),
            ))
    except VerificationError as error:
        return error
    return None


def _findings(runs: list[RunSummary], *, tiered: bool) -> list[str]:
    """Why the runs are not a pass though their KV was bit-exact: loads that failed; with ``--tiered``, a
    warm run whose hits fell short of one large store's."""
    findings: list[str] = []
    for run in runs:
        failed = failed_loads(run.stats)
        if failed is not None:
            findings.append(
                f"the {run.label} run: {failed.replace('the connector', 'the stack')}; first cause: {run.first_cause}"
            )
    warm = runs[-1] if len(runs) == 2 else None
    short = short_hits(warm.stats) if warm is not None and tiered else None
    if short is not None:
        findings.append(
            f"the warm run's {short.replace('the connector', 'the stack')}: with --tiered the tiers behind the front "
            "one hold what it cannot, so every block the cold run saved must come back; some did not (a tier whose "
            "put claims values it did not keep, or that evicts them)"
        )
    return findings


def _shut_down_quietly(engine: Engine) -> None:
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001 - the failure being raised is the first one
        return

