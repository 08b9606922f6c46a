"""Stacks written on the command line: ``cpu,file``, ``cpu,[file,single]``.

A comma-separated list is a :class:`~capkv.MultiConnector` of its items (a list
of one item is the item itself); square brackets nest a stack inside a stack.
Names are looked up in a table of connector factories, so the grammar knows
nothing about which connectors exist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capkv.capabilities._hma import StackNode, describe, supports_hma
from capkv.composite._multi import MultiConnector
from capkv.contracts._connector import KVConnector
from capkv.errors import ConfigError

__all__ = ["StackTree", "build_stack", "parse_stack", "render_stack"]



@dataclass(frozen=True)
class StackTree:
    """A connector ``name``, or a stack of ``items`` (first loads first)."""

    name: str = ""
    items: tuple[StackTree, ...] = ()

Factory = Callable[[], KVConnector[Any]]


def parse_stack(text: str) -> StackTree:
    """Parse ``text`` into a tree; :class:`~capkv.ConfigError` names the position of a syntax error."""
    tokens = _tokens(text)
    items, end = _parse_list(tokens, 0, text)
    if end != len(tokens):
        raise _syntax(text, tokens[end][1], f"unexpected {tokens[end][0]!r}")
    return items[0] if len(items) == 1 else StackTree(items=tuple(items))


def _tokens(text: str) -> list[tuple[str, int]]:
    tokens: list[tuple[str, int]] = []
    name_start: int | None = None
    for index, char in enumerate(text + ","):
        if char.isalnum() or char in "-_.":
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


def _parse_list(tokens: list[tuple[str, int]], at: int, text: str) -> tuple[list[StackTree], int]:
    items: list[StackTree] = []
    while True:
        if at == len(tokens):
            raise _syntax(text, len(text), "a connector name or '[' is missing")
        token, position = tokens[at]
        if token == "[":
            inner, at = _parse_list(tokens, at + 1, text)
            if at == len(tokens) or tokens[at][0] != "]":
                raise _syntax(text, len(text) if at == len(tokens) else tokens[at][1], "']' is missing")
            items.append(StackTree(items=tuple(inner)))
            at += 1
        elif token in ",]":
            raise _syntax(text, position, "a connector name or '[' is missing")
        else:
            items.append(StackTree(name=token))
            at += 1
        if at == len(tokens) or tokens[at][0] != ",":
            return items, at
        at += 1


def _syntax(text: str, position: int, why: str) -> ConfigError:
    return ConfigError(
        f"--stack {text!r}: {why} at character {position + 1}", method="parse_stack", value=text
    )


def build_stack(tree: StackTree, factories: Mapping[str, Factory]) -> KVConnector[Any]:
    """The connector a tree describes, each name made by its factory."""
    if not tree.items:
        factory = factories.get(tree.name)
        if factory is None:
            raise ConfigError(
                f"--stack: unknown connector {tree.name!r} (known: {', '.join(sorted(factories))})",
                method="build_stack", value=tree.name,
            )
        return factory()
    return MultiConnector(*(build_stack(child, factories) for child in tree.items))


def render_stack(connector: object, describe_leaf: Callable[[object], str] = lambda _: "") -> list[str]:
    """The stack as an indented tree, one line per node, with its HMA capability."""
    lines: list[str] = []

    def walk(node: object, prefix: str, branch: str, label: str) -> None:
        hma = "HMA: yes" if supports_hma(node) else "HMA: no "
        extra = "" if isinstance(node, StackNode) else describe_leaf(node)
        name = f"{branch}{label}{describe(node)}"
        lines.append(f"{name:<44} {hma}{'   ' + extra if extra else ''}")
        if isinstance(node, StackNode):
            children = node.children
            for index, child in enumerate(children, start=1):
                last = index == len(children)
                walk(child, prefix + ("   " if last else "│  "), prefix + ("└─ " if last else "├─ "), f"#{index} ")

    walk(connector, "", "", "")
    return lines
