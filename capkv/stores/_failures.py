"""How a store raises the failures it kept: background writes and reads, raised once from ``flush``/``close``."""

from __future__ import annotations

from capkv.engine._diagnosis import explain, notes_of

__all__ = ["raise_failures"]


def raise_failures(owner: str, failures: list[BaseException], dropped: int, *, reads: int = 0) -> None:
    """Raise kept failures (the first ``reads`` of them from loads, the rest background writes): one as
    it is, several as an ``ExceptionGroup`` whose message names the first (a backend's fault names its member)."""
    if not failures:
        return
    raised = [_as_exception(owner, failure) for failure in failures]
    if len(raised) == 1 and not dropped:
        raise raised[0]
    writes = len(raised) - reads + dropped
    what = " and ".join(
        part for part in (f"{reads} reads" if reads else "", f"{writes} background writes" if writes else "") if part
    )
    raise ExceptionGroup(
        f"{owner}: {what} failed" + (f" ({dropped} more not kept)" if dropped else "") + f"; the first: {explain(raised[0])}",
        raised,
    )


def _as_exception(owner: str, failure: BaseException) -> Exception:
    """``failure``, or — one that is not an ``Exception`` (a ``SystemExit``, a ``KeyboardInterrupt`` a
    background thread met) — a ``RuntimeError`` naming it, caused by it, with its notes (where it was
    raised): it ended that thread's work, not the caller's."""
    if isinstance(failure, Exception):
        return failure
    error = RuntimeError(f"{owner}: a background thread met {failure!r}")
    error.__cause__ = failure
    for note in notes_of(failure):
        error.add_note(note)
    return error
