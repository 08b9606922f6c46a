"""``capkv check CONFIG [--groups N]``: can this configured stack serve the engine?

Prints the stack as a tree with each node's capabilities and exits non-zero,
with one line per problem, when it cannot serve N KV-cache groups (decided from
the classes, before anything is built, with the same explanation as
:func:`capkv.check_stack` and the mypy plugin) or when its children conflict
(KV-cache layouts, finished counts — these need instances, so the connectors are
built from their extra config; ``--classes-only`` skips that).

Exit status: 0 servable, 1 not servable, 2 the configuration itself is wrong
(including a connector that cannot be built from it — the HMA verdict, decided
from the classes, is still printed first).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from capkv.capabilities.hma import StackNode, supports_hma
from capkv.capabilities.serving import require_hma
from capkv.config.build import build_stack
from capkv.config.loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack, load_stack_file
from capkv.errors import CapkvError, ConfigError

__all__ = ["add_arguments", "run"]

_PROG = "capkv check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check`` subcommand's options."""
    parser.add_argument("config", metavar="CONFIG", help="stack file (.json or .toml) shaped like vLLM's kv_transfer_config")
    parser.add_argument("--groups", type=_positive_int, default=1, metavar="N", help="KV-cache groups the engine has (default: 1)")
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import MODULE first, so its @register_connector classes are known (repeatable)",
    )
    parser.add_argument(
        "--classes-only", action="store_true",
        help="build no connector: check HMA capability only (layouts and finished counts need instances)",
    )


def run(args: argparse.Namespace) -> int:
    """Check the stack file; print the tree, then one line per problem."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" paths resolve like ``python -m``
    try:
        for module in args.imports:
            _import(module)
        configured = load_stack_file(args.config)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    problems = _capability_problems(configured, args.groups)  # from classes: nothing built yet
    built: Any = None
    build_failure: str | None = None
    if not args.classes_only:
        try:
            built = build_stack(configured)
        except ConfigError as exc:  # e.g. a connector that needs more than its extra config
            build_failure = str(exc)
        except CapkvError as exc:  # a composite refused its children while being built
            problems.append(str(exc))
    rows = [[label, *fields] for label, fields in _rows(configured, built, "", "")]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if built is not None:
        problems += _conflicts(built)
    for problem in problems:
        _error(problem)
    if build_failure is not None:
        _error(f"{build_failure} (layouts and finished counts are unchecked; --classes-only skips building)")
    if problems:
        return 1
    if build_failure is not None:
        return 2
    groups = "1 KV-cache group" if args.groups == 1 else f"{args.groups} KV-cache groups"
    print(f"ok: the stack can serve {groups}" + (" (classes only)" if built is None else ""))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of groups, got {text!r}")
    return value


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise ConfigError(f'cannot import "{module}" (--import): {type(exc).__name__}: {exc}', value=module) from exc


def _error(message: str) -> None:
    print(f"{_PROG}: error: {message}", file=sys.stderr)


def _capability_problems(configured: ConfiguredNode, groups: int) -> list[str]:
    subject = configured if isinstance(configured, ConfiguredStack) else configured.cls
    try:
        require_hma(subject, groups)
    except CapkvError as exc:
        return [str(exc)]
    return []


def _conflicts(built: Any) -> list[str]:
    problems: list[str] = []
    for method in ("get_required_kvcache_layout", "get_finished_count"):
        try:
            getattr(built, method)()
        except CapkvError as exc:
            problems.append(str(exc))
    return problems


@dataclass(frozen=True)
class _Answer:
    """One instance-level capability, or why it is unknown."""

    text: str


def _ask(built: Any, method: str, show: Callable[[Any], str]) -> _Answer:
    if built is None:
        return _Answer("?")
    try:
        return _Answer(show(getattr(built, method)()))
    except CapkvError:
        return _Answer("conflict")


def _rows(node: ConfiguredNode, built: Any, prefix: str, branch: str) -> Iterator[tuple[str, list[str]]]:
    subject = node if isinstance(node, ConfiguredStack) else node.cls
    label = f"{node.position} {node.cls.__name__}".strip()
    if node.name.rpartition(":")[2] != node.cls.__name__:
        label += f' ("{node.name}")'  # registered under another name
    capabilities = [
        f"HMA: {'yes' if supports_hma(subject) else 'no'}",
        f"layout: {_ask(built, 'get_required_kvcache_layout', lambda v: 'any' if v is None else str(v)).text}",
        f"piecewise cudagraph: {_ask(built, 'requires_piecewise_for_cudagraph', lambda v: 'yes' if v else 'no').text}",
        f"finished count: {_ask(built, 'get_finished_count', lambda v: 'default' if v is None else str(v)).text}",
    ]
    yield prefix + branch + label, capabilities
    if isinstance(node, ConfiguredConnector):
        return
    built_children: tuple[Any, ...] = (
        built.children if isinstance(built, StackNode) else (None,) * len(node.entries)
    )
    inner = prefix + ("│  " if branch == "├─ " else "   " if branch else "")
    for index, (entry, child) in enumerate(zip(node.entries, built_children, strict=True), start=1):
        yield from _rows(entry, child, inner, "└─ " if index == len(node.entries) else "├─ ")
