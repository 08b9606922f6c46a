"""How a store raises the failures it kept: background writes and reads, raised once from ``flush``/``close``."""

from __future__ import annotations

from capkv.engine._diagnosis import explain

__all__ = ["raise_failures"]


def raise_failures(owner: str, failures: list[BaseException], dropped: int, *, reads: int = 0) -> None:
    """Raise kept failures (the first ``reads`` of them from loads, the rest background writes): one as
    it is, several as an ``ExceptionGroup`` whose message names the first (a backend's fault names its member)."""
    if not failures:
        return
    if len(failures) == 1 and not dropped:
        raise failures[0]
    writes = len(failures) - reads + dropped
    what = " and ".join(
        part for part in (f"{reads} reads" if reads else "", f"{writes} background writes" if writes else "") if part
    )
    raise ExceptionGroup(
        f"{owner}: {what} failed" + (f" ({dropped} more not kept)" if dropped else "") + f"; the first: {explain(failures[0])}",
        [e if isinstance(e, Exception) else RuntimeError(repr(e)) for e in failures],
    )
