"""The kit's verdict on a scenario that was served: judged by what landed, each finding with its cause.

A connector passes only when every hit it offered loaded, when what the cold run
asked it to save came back in the warm run, and when it shut down cleanly; a
failure names the run, the group, the count and the first cause the connector
gave (the warning it logged, or what it raised, with where).
"""

from __future__ import annotations

from dataclasses import dataclass

from capkv.engine._diagnosis import explain, failed_loads, short_hits
from capkv.engine._stats import EngineStats

__all__ = ["Served", "explain", "judge"]

ALONE = "alone"
FIRST = "first in Multi(yours, CPUOffload)"
SECOND = "second in Multi(CPUOffload, yours)"
BEHIND = "behind a front tier: Multi(CPUOffload's first part, yours)"
_LOADS_FIRST = (ALONE, FIRST)


@dataclass(frozen=True)
class Served:
    """What a scenario's two runs did: the engine's counts, the tokens yours loaded in a stack, the causes
    logged, and what ``before_warm`` and shutting down raised."""

    cold: EngineStats
    warm: EngineStats
    yours: int
    causes: tuple[str, str]
    """The first warning logged in the cold run, and in the warm run."""
    raised: tuple[str, ...]
    """``before_warm raised ...``, ``shutdown raised ...``: findings too, judged with the runs."""


def judge(served: Served, placement: str, *, require_loads: bool, head: int) -> str | None:
    """Why the scenario failed (its findings, the first one leading), or ``None``."""
    findings: list[str] = []
    for label, stats, cause in (("the cold run", served.cold, served.causes[0]), ("the warm run", served.warm, served.causes[1])):
        failed = failed_loads(stats)
        if failed is not None:
            findings.append(
                f"{label}: {failed}: a hit the connector offers must load (a load error makes the engine recompute "
                f"it); first cause: {cause}"
            )
    before_specific = len(findings)
    loaded = [group.loaded_tokens for group in served.warm.groups]
    empty = [index for index, tokens in enumerate(loaded) if tokens == 0]
    if require_loads and placement == FIRST and empty:
        findings.append(
            f"the warm run loaded nothing through the connector in group(s) {empty} (tokens loaded per group: "
            f"{loaded}), though it is the stack's first tier and the cold run offered it every prompt"
        )
    if require_loads and placement == BEHIND and not served.yours:
        findings.append(
            "the warm run loaded nothing through the connector behind a front tier that offers only the first "
            f"{head} tokens of each prefix, though the connector says it loads slices (loads_slices() is True): "
            "asked get_num_new_matched_tokens(request, n) beyond the engine's local hit, it must offer what it "
            "holds from token n on (the tokens before n are loaded by the tier in front)"
        )
    short = short_hits(served.warm) if require_loads and len(findings) == before_specific else None
    if short is not None:
        findings.append(
            f"the warm run's {short}: what the cold run asked the connector to save did not all come back. Likely "
            "causes: saves the connector claimed but did not keep (a put that answers True for a value it dropped, "
            "an eviction); saves still in flight when the warm run began (pass before_warm=, e.g. "
            "FileStoreConnector.flush); a sliding-window group's hit of L tokens needs the blocks holding tokens "
            "L-window+1 .. L-1, which a store that saves only when a request finishes no longer has (save blocks "
            "as they fill)"
        )
    findings += served.raised
    return "; and ".join(findings) if findings else None
