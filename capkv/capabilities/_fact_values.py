"""What each of the contract's facts may answer.

A wrong answer (``5`` for a layout) is a connector bug an engine would misread, so it is refused, named.
"""

from __future__ import annotations

from capkv.capabilities._facts import LAYOUT, PIECEWISE, StaticFact

__all__ = ["fact_problem"]


def fact_problem(fact: StaticFact, answer: object) -> str | None:
    """Why ``answer`` is not a valid answer to ``fact``, in words; ``None`` when it is.

    ``get_required_kvcache_layout`` answers ``None`` (any layout) or a layout name (``"NHD"``, ``"HND"``: a
    non-empty ``str``); ``requires_piecewise_for_cudagraph`` a ``bool``; ``get_finished_count`` ``None`` (the
    engine's default) or an ``int >= 1``. Anything else is refused by ``capkv check`` and ``capkv demo``,
    naming the connector, the fact and the value.
    """
    if fact == LAYOUT:
        if answer is None or (isinstance(answer, str) and answer):
            return None
        return "expected None or a layout name such as 'NHD' or 'HND'"
    if fact == PIECEWISE:
        return None if type(answer) is bool else "expected True or False"
    if answer is None or (type(answer) is int and answer >= 1):  # FINISHED_COUNT
        return None
    return "expected None or an int >= 1"
