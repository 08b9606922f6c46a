"""Stacks written on the command line: ``cpu,file``, ``cpu,[file,mykv.connectors:MemStore]``.

A shorthand for a configuration file, nothing more: the same mapping, the same registry (docs/internals.md,
"The command line").
"""

from __future__ import annotations

from typing import Any

from capkv.config._loader import MAX_NESTING
from capkv.errors import ConfigError

__all__ = ["parse_stack"]

_NAME_CHARS = frozenset("-_.:")


def parse_stack(text: str) -> dict[str, Any]:
    """The ``kv_transfer_config`` that ``text`` describes; :class:`~capkv.ConfigError` names the position of a syntax error."""
    tokens = _tokens(text)
    items, end = _parse_list(tokens, 0, text, 0)
    if end != len(tokens):
        raise _syntax(text, tokens[end][1], f"unexpected {tokens[end][0]!r}")
    return items[0] if len(items) == 1 else _multi(items)


def _multi(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": items}}


def _tokens(text: str) -> list[tuple[str, int]]:
    tokens: list[tuple[str, int]] = []
    name_start: int | None = None
    for index, char in enumerate(text + ","):
        if char.isalnum() or char in _NAME_CHARS:
            if name_start is None:
                name_start = index
            continue
        if name_start is not None:
            tokens.append((text[name_start:index], name_start))
            name_start = None
        if index == len(text):
            break
        if char in ",[]":
            tokens.append((char, index))
        elif not char.isspace():
            raise _syntax(text, index, f"unexpected {char!r}")
    return tokens


def _parse_list(tokens: list[tuple[str, int]], at: int, text: str, depth: int) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    while True:
        if at == len(tokens):
            raise _syntax(text, len(text), "a connector name or '[' is missing")
        token, position = tokens[at]
        if token == "[":
            if depth >= MAX_NESTING:
                raise _syntax(text, position, f"stacks nest at most {MAX_NESTING} levels deep")
            inner, at = _parse_list(tokens, at + 1, text, depth + 1)
            if at == len(tokens) or tokens[at][0] != "]":
                raise _syntax(text, len(text) if at == len(tokens) else tokens[at][1], "']' is missing")
            items.append(_multi(inner))
            at += 1
        elif token in ",]":
            raise _syntax(text, position, "a connector name or '[' is missing")
        else:
            items.append({"kv_connector": token})
            at += 1
        if at == len(tokens) or tokens[at][0] != ",":
            return items, at
        at += 1


def _syntax(text: str, position: int, why: str) -> ConfigError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return ConfigError(
        f"--stack {shown!r}: {why} at character {position + 1}", method="parse_stack", value=text
    )
