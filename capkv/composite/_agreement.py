"""How a composite's facts follow from its children's answers: one rule, two users.

:class:`~capkv.MultiConnector` applies it to its children's answers at run
time; ``capkv check`` applies it to a configured stack's answers before the
stack is built (from the children's classes where they can answer). Both get
the same answer and, for a conflict, the same :class:`~capkv.ConflictError` text.

- Layouts must agree; a child with no preference (``None``) does not vote.
- Finished counts must agree; ``None`` (the world size) is an answer like any other.
- Piecewise CUDA graphs are needed when any child needs them.

Children are labelled ``#position ClassName`` (:func:`child_label`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

from capkv.capabilities._facts import FINISHED_COUNT, LAYOUT, StaticFact
from capkv.errors import ConflictError

__all__ = ["agreed_finished_count", "agreed_layout", "child_label", "combine", "piecewise_needed"]

_T = TypeVar("_T")

Labelled = Sequence[tuple[str, _T]]
"""Children's answers, each with its :func:`child_label`, in stack order."""


def child_label(position: int, name: str) -> str:
    """How a composite names its child in diagnostics: ``#2 FileStoreConnector``."""
    return f"#{position} {name}"


def agreed_layout(composite: str, answers: Labelled[str | None]) -> str | None:
    """The one layout the children need (``None``: no preference); different layouts conflict."""
    return _agree(composite, LAYOUT, answers, ignore_none=True)


def agreed_finished_count(composite: str, answers: Labelled[int | None]) -> int | None:
    """The children's common finished count; any difference, ``None`` included, conflicts."""
    return _agree(composite, FINISHED_COUNT, answers, ignore_none=False)


def piecewise_needed(answers: Iterable[bool]) -> bool:
    """Piecewise CUDA graphs are needed when any child needs them."""
    return any(answers)


def combine(composite: str, fact: StaticFact, answers: Labelled[Any]) -> object:
    """The composite's answer to ``fact`` from its children's, by that fact's rule."""
    if fact == LAYOUT:
        return agreed_layout(composite, cast("Labelled[str | None]", answers))
    if fact == FINISHED_COUNT:
        return agreed_finished_count(composite, cast("Labelled[int | None]", answers))
    return piecewise_needed(answer for _, answer in answers)


def _agree(composite: str, method: str, answers: Labelled[_T], *, ignore_none: bool) -> _T | None:
    considered = [(label, answer) for label, answer in answers if not (ignore_none and answer is None)]
    distinct = {answer for _, answer in considered}
    if len(distinct) > 1:
        detail = ", ".join(f"{label} -> {answer!r}" for label, answer in considered)
        raise ConflictError(
            f"{composite}.{method}: sub-connectors disagree ({detail})",
            connector=", ".join(label for label, _ in considered),
            method=method,
            value=sorted(map(repr, distinct)),
        )
    return considered[0][1] if considered else None
