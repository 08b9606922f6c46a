"""How a composite's facts follow from its children's answers: the rows of :mod:`capkv.capabilities._table`.

Applied by :class:`~capkv.MultiConnector` at run time and by ``capkv check`` before building, so both give the
same answer and, for a conflict, the same :class:`~capkv.ConflictError` text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

from capkv.capabilities import _table
from capkv.capabilities._facts import FINISHED_COUNT, LAYOUT, PIECEWISE

__all__ = ["agreed_finished_count", "agreed_layout", "child_label", "combine", "piecewise_needed"]

_T = TypeVar("_T")

Labelled = Sequence[tuple[str, _T]]
"""Children's answers, each with its :func:`child_label`, in stack order."""


def child_label(position: int, name: str) -> str:
    """How a composite names its child in diagnostics: ``#2 FileStoreConnector``."""
    return f"#{position} {name}"


def agreed_layout(composite: str, answers: Labelled[str | None]) -> str | None:
    """The one layout the children need (``None``: no preference); different layouts conflict."""
    return cast("str | None", _table.combine(composite, LAYOUT, answers))


def agreed_finished_count(composite: str, answers: Labelled[int | None]) -> int | None:
    """The children's common finished count; any difference, ``None`` included, conflicts."""
    return cast("int | None", _table.combine(composite, FINISHED_COUNT, answers))


def piecewise_needed(answers: Iterable[bool]) -> bool:
    """Piecewise CUDA graphs are needed when any child needs them."""
    return _table.fold(PIECEWISE, answers)


def combine(composite: str, fact: str, answers: Labelled[Any]) -> object:
    """The composite's answer to ``fact`` from its children's, by that fact's row."""
    return _table.combine(composite, fact, answers)
