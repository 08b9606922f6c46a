"""What went wrong while serving, in words: loads that failed, hits that fell short, and the causes connectors logged.

The conformance kit and ``capkv demo`` judge a run by what landed; these are the
sentences both print, so a finding reads the same in each.
"""

from __future__ import annotations

import logging
import traceback
from types import TracebackType
from typing import cast

from typing_extensions import Self

from capkv.engine._stats import EngineStats
from capkv.errors import CapkvError

__all__ = ["LoggedCauses", "explain", "failed_loads", "notes_of", "short_hits"]


class LoggedCauses(logging.Handler):
    """Collects the warnings logged (by any logger) while it is entered: the causes connectors give.

    capkv's stores log why a load failed (a damaged value, a value its backend no longer has, what the
    backend raised, with its member); a connector of your own is heard the same way when it logs a
    warning. The root logger is opened to warnings while entered, if it was set higher.
    """

    def __init__(self, *, keep: int = 256) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        """The first ``keep`` warnings, as ``logger: message``."""
        self._keep = keep
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < self._keep:
            self.messages.append(f"{record.name}: {record.getMessage()}")

    def first(self, since: int = 0, until: int | None = None) -> str:
        """The first warning logged after the first ``since`` (``len(messages)`` before a run) and before the
        first ``until`` (after it); else the last one before (a store warns of each kind of failure once a
        minute), or a sentence saying none was."""
        if len(self.messages) > since and (until is None or until > since):
            return self.messages[since]
        if since:
            return f"{self.messages[since - 1]} (the last warning before this run: none was logged during it)"
        return "no cause given (no warning was logged)"

    def __enter__(self) -> Self:
        root = logging.getLogger()
        self._level = root.level
        if root.level > logging.WARNING:
            root.setLevel(logging.WARNING)
        root.addHandler(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._level)


def failed_loads(stats: EngineStats) -> str | None:
    """``None`` when every load a connector offered landed; else the groups and counts of those that failed."""
    groups = [(index, group) for index, group in enumerate(stats.groups) if group.load_error_blocks or group.failed_load_tokens]
    if not groups and not stats.load_error_blocks and not stats.failed_load_tokens:
        return None
    per_group = "; ".join(
        f"group {index}: {group.load_error_blocks:,} blocks failed, {group.failed_load_tokens:,} tokens recomputed"
        for index, group in groups
    )
    return (
        f"{stats.load_error_blocks:,} blocks the connector offered failed to load ({per_group}); of the "
        f"{stats.external_hit_tokens:,} prompt tokens it offered, {stats.loaded_hit_tokens:,} loaded"
    )


def short_hits(stats: EngineStats) -> str | None:
    """``None`` when the hits offered (local and by connectors) covered every prompt token that a store holding
    every block covers; else by how much they fell short (loads that then failed are :func:`failed_loads`)."""
    covered = stats.local_hit_tokens + stats.external_hit_tokens
    if covered >= stats.hit_limit_tokens:
        return None
    return (
        f"hits covered {covered:,} of the {stats.hit_limit_tokens:,} prompt tokens a store holding every block "
        f"covers ({stats.local_hit_tokens:,} from the local prefix cache, {stats.external_hit_tokens:,} offered by "
        "the connector)"
    )


def explain(error: BaseException) -> str:
    """``Type: message``, with the notes that say where a backend's fault came from (a stack's or a store's
    group of failures: its first one's); else where it was raised, when it is not one of capkv's own errors."""
    text = f"{type(error).__name__}: {error}"
    inner: list[BaseException] = [error]
    members: object = getattr(error, "exceptions", None)  # a stack's (SubConnectorError) or a group's
    if isinstance(members, tuple) and members:
        first = cast("tuple[object, ...]", members)[0]
        if isinstance(first, BaseException):
            inner.append(first)
    notes = [note for each in inner for note in notes_of(each)]
    if notes:  # where it came from, unless the message says it already
        fresh = [note for note in dict.fromkeys(notes) if note not in text]
        return f"{text} ({'; '.join(fresh)})" if fresh else text
    if isinstance(error, CapkvError):
        return text
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno}, in {last.name})"
    return text


def notes_of(error: BaseException) -> list[str]:
    """The notes added to ``error`` (``add_note``: capkv's stores note which backend member raised it), as text."""
    notes: object = getattr(error, "__notes__", None)
    return [str(note) for note in cast("list[object]", notes)] if isinstance(notes, list) else []
