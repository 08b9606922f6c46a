"""How a composite's capabilities follow from its children's: one table, read by every user.

Adding a capability is a row here, so the composite, ``capkv check``, the mypy plugin and the vLLM hosts
cannot disagree.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from capkv.errors import ConflictError

__all__ = [
    "ACCESS",
    "CAPABILITIES",
    "DELIVERY",
    "DIVERGENT_HITS",
    "HMA_METHOD",
    "LOOKAHEAD",
    "MAY_LOAD_ASYNC",
    "SLEEP_MODE",
    "Capability",
    "Rule",
    "capability",
    "combine",
    "fold",
    "union",
]

HMA_METHOD: Final = "request_finished_all_groups"
SLEEP_MODE: Final = "supports_sleep_mode"
DIVERGENT_HITS: Final = "supports_divergent_local_hybrid_hits"
DELIVERY: Final = "requires_kv_delivery"
ACCESS: Final = "kv_cache_access"
LOOKAHEAD: Final = "supports_lookahead_block_hashes"
MAY_LOAD_ASYNC: Final = "may_load_async"

_T = TypeVar("_T")
Labelled = Sequence[tuple[str, _T]]
"""Children's answers, each with its label (``#2 FileStoreConnector``), in stack order."""


class Rule(enum.Enum):
    """How the children's answers make the composite's."""

    ALL = "every child"
    """A capability every child must have (``True`` from each; no child: ``True``)."""
    ALL_OF_SOME = "every child, and at least one"
    """A capability every child must have, and that no child at all does not have."""
    ANY = "any child"
    """A need any one child imposes."""
    UNION = "the children's flags together"
    """Flags (an ``IntFlag``): every flag any child needs (no child: none)."""
    AGREE = "the children agree"
    """One value all children give; any difference, ``None`` included, conflicts."""
    AGREE_OR_NONE = "the children that state one agree"
    """One value the children that state one give (``None``: no preference, no vote)."""


@dataclass(frozen=True)
class Capability:
    """One row: the member, its rule, and who applies it.

    Who applies a row: capkv's composite (:class:`~capkv.MultiConnector`, ``capkv check`` on a configured
    stack, the ``capkv.mypy`` plugin for HMA), or a host forwarding vLLM's own members to the vLLM connectors
    in a stack, as vLLM's ``MultiConnector`` does. :func:`combine` and :func:`fold` apply it.
    """

    member: str
    rule: Rule
    decided_by: Literal["capkv", "vllm"]
    """``"capkv"``: capkv's composite and tools; ``"vllm"``: a host, for the vLLM connectors in its stack."""


CAPABILITIES: tuple[Capability, ...] = (
    Capability(HMA_METHOD, Rule.ALL, "capkv"),
    Capability("get_required_kvcache_layout", Rule.AGREE_OR_NONE, "capkv"),
    Capability("requires_piecewise_for_cudagraph", Rule.ANY, "capkv"),
    Capability("get_finished_count", Rule.AGREE, "capkv"),
    Capability(SLEEP_MODE, Rule.ALL, "capkv"),
    Capability(DIVERGENT_HITS, Rule.ALL, "vllm"),
    Capability(DELIVERY, Rule.ANY, "vllm"),
    Capability(ACCESS, Rule.UNION, "capkv"),
    Capability(LOOKAHEAD, Rule.ALL_OF_SOME, "capkv"),
    Capability(MAY_LOAD_ASYNC, Rule.ANY, "capkv"),
)
"""Every capability a composite derives from its children."""

_BY_MEMBER = {row.member: row for row in CAPABILITIES}


def capability(member: str) -> Capability:
    """The row for ``member``; :class:`KeyError` for a member that is not a capability."""
    return _BY_MEMBER[member]


def fold(member: str, answers: Iterable[bool]) -> bool:
    """A yes/no capability of the composite from its children's answers, by ``member``'s rule."""
    rule = capability(member).rule
    if rule is Rule.ALL:
        return all(answers)
    if rule is Rule.ALL_OF_SOME:
        seen = False
        for answer in answers:
            if not answer:
                return False
            seen = True
        return seen
    if rule is Rule.ANY:
        return any(answers)
    raise TypeError(f"{member} is combined by agreement ({rule.value}), not folded as yes/no")


def union(flags: Iterable[Any]) -> Any:
    """Every flag of ``flags`` together (``IntFlag`` values of one class); ``0`` for none."""
    def either(a: Any, b: Any) -> Any:
        return a | b

    return functools.reduce(either, flags, 0)


def combine(composite: str, member: str, answers: Labelled[Any]) -> object:
    """The composite's answer to ``member`` from its labelled children's, by the row's rule; children that
    disagree raise :class:`~capkv.ConflictError` naming each of them and their answers."""
    rule = capability(member).rule
    if rule in (Rule.ALL, Rule.ALL_OF_SOME, Rule.ANY):
        return fold(member, (bool(answer) for _, answer in answers))
    if rule is Rule.UNION:
        return union(answer for _, answer in answers)
    considered = [(label, a) for label, a in answers if not (rule is Rule.AGREE_OR_NONE and a is None)]
    distinct = {answer for _, answer in considered}
    if len(distinct) > 1:
        detail = ", ".join(f"{label} -> {answer!r}" for label, answer in considered)
        raise ConflictError(
            f"{composite}.{member}: sub-connectors disagree ({detail})",
            connector=", ".join(label for label, _ in considered),
            method=member,
            value=sorted(map(repr, distinct)),
        )
    return considered[0][1] if considered else None
