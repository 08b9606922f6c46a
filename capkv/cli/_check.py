"""``capkv check CONFIG [--groups N]``: can this configured stack serve the engine?

Prints the stack as a tree with each node's capabilities and exits non-zero,
with one line per problem, when it cannot serve N KV-cache groups (decided from
the classes, before anything is built, with the same explanation as
:func:`capkv.check_stack` and the mypy plugin) or when its children conflict
(KV-cache layouts, finished counts).

Each fact — layout, piecewise CUDA graphs, finished count — comes from the
first place that knows it: the node's class, when its member is class-level
(:func:`capkv.capabilities.class_fact`); for a ``MultiConnector`` node, its
children's answers combined by the very rule ``MultiConnector`` applies
(:mod:`capkv.composite._agreement`), so a conflict found before building reads
exactly as the built stack would raise it; otherwise the connector built from
its extra config. ``?`` marks a fact none of these knows.

Unless ``--classes-only``, every connector is still built, to catch what only
construction checks. A connector that cannot be built is an error only when
that leaves a fact unknown: capkv's own connectors need the engine's
:class:`~capkv.KVSpec`, so no configuration file can build them, yet their facts
are class-level — failing them would make ``capkv check`` useless on the stacks
it is most often run on. Their extra config then goes unchecked, so the final
``ok`` line names them.

Exit status: 0 servable, 1 not servable or conflicting children, 2 the
configuration itself is wrong (including a connector that cannot be built from
it when a fact needs the instance — the tree and the HMA verdict are still
printed first).
"""

from __future__ import annotations

import argparse
import enum
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from capkv.capabilities._facts import (
    FINISHED_COUNT,
    LAYOUT,
    NEEDS_INSTANCE,
    PIECEWISE,
    STATIC_FACTS,
    StaticFact,
    class_fact,
)
from capkv.capabilities._hma import supports_hma
from capkv.capabilities._serving import require_hma
from capkv.composite._agreement import child_label, combine
from capkv.composite._multi import answers_by_agreement, stack_class
from capkv.config._build import build_connector
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack
from capkv.cli._host_check import host_lines, host_problems, load_hosted_file
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
        help="build no connector: only what the classes answer (facts a connector decides per instance show ?)",
    )


def run(args: argparse.Namespace) -> int:
    """Check the stack file; print the tree, then one line per problem."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" paths resolve like ``python -m``
    try:
        for module in args.imports:
            _import(module)
        hosted, configured = load_hosted_file(args.config)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    # from classes: nothing built yet; a capkv host's refusal says it all
    problems = host_problems(hosted, configured) or _capability_problems(configured, args.groups)
    root = _check(configured, build=not args.classes_only, problems=problems)
    rows = [[label, *fields] for label, fields in _rows(root, "", "")]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for line in host_lines(hosted, configured):
        print(line)
    unbuildable = list(dict.fromkeys(reason for node in _walk(root) for reason in node.missing_because))
    for problem in problems:
        _error(problem)
    for reason in unbuildable:
        _error(f"{reason} (layouts and finished counts are unchecked; --classes-only skips building)")
    if problems:
        return 1
    if unbuildable:
        return 2
    groups = "1 KV-cache group" if args.groups == 1 else f"{args.groups} KV-cache groups"
    print(f"ok: the stack can serve {groups}{_ok_note(root, args.classes_only)}")
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


class _Missing(enum.Enum):
    """A fact with no value: nothing could answer it, or the children conflict."""

    UNKNOWN = "?"
    CONFLICT = "conflict"


@dataclass
class _Checked:
    """One node of the stack, checked: its built connector (if any) and its facts."""

    node: ConfiguredNode
    children: tuple[_Checked, ...]
    built: Any = None
    unbuilt_because: tuple[str, ...] = ()
    """Why ``built`` is ``None``: this node's own build failure, or its unbuilt children's."""
    own_failure: bool = False
    """Whether building failed at this very node (not below it)."""
    answers: dict[StaticFact, object] = field(default_factory=dict[StaticFact, object])
    missing_because: tuple[str, ...] = ()
    """Build failures that left one of this node's facts unknown."""

    @property
    def name(self) -> str:
        """The class name a composite would use for this node in its messages."""
        if self.built is not None:
            return type(self.built).__name__
        if isinstance(self.node, ConfiguredStack):
            return str(stack_class(self.node.cls, self.node.children).__name__)
        return str(self.node.cls.__name__)


def _check(node: ConfiguredNode, *, build: bool, problems: list[str]) -> _Checked:
    """Build what can be built (children first), then answer every fact."""
    if isinstance(node, ConfiguredConnector):
        checked = _Checked(node, ())
        if build:
            _build(checked, lambda: build_connector(node), problems)
    else:
        children = tuple(_check(entry, build=build, problems=problems) for entry in node.entries)
        checked = _Checked(node, children)
        if build and all(child.built is not None for child in children):
            _build(checked, lambda: node.cls(*(child.built for child in children)), problems)
        else:
            checked.unbuilt_because = tuple(r for child in children for r in child.unbuilt_because)
    for fact in STATIC_FACTS:
        checked.answers[fact] = _answer(checked, fact, problems)
        if checked.answers[fact] is _Missing.UNKNOWN and not _by_agreement(checked, fact):
            checked.missing_because = checked.unbuilt_because
    return checked


def _build(checked: _Checked, make: Callable[[], Any], problems: list[str]) -> None:
    try:
        checked.built = make()
    except ConfigError as exc:  # e.g. a connector that needs more than its extra config
        checked.unbuilt_because, checked.own_failure = (str(exc),), True
    except CapkvError as exc:  # e.g. a composite refused its children
        problems.append(str(exc))


def _by_agreement(checked: _Checked, fact: StaticFact) -> bool:
    return isinstance(checked.node, ConfiguredStack) and answers_by_agreement(checked.node.cls, fact)


def _answer(checked: _Checked, fact: StaticFact, problems: list[str]) -> object:
    """From the class if it can answer, else by agreement of the children, else from the instance."""
    try:
        answer = class_fact(checked.node.cls, fact)
        if answer is not NEEDS_INSTANCE:
            return answer
        if _by_agreement(checked, fact):
            return _agreement(checked, fact)
        if checked.built is not None:
            instance_answer: object = getattr(checked.built, fact)()
            return instance_answer
    except CapkvError as exc:
        problems.append(str(exc))
        return _Missing.CONFLICT
    return _Missing.UNKNOWN


def _agreement(checked: _Checked, fact: StaticFact) -> object:
    """The children's answers combined; a conflict among those known is reported even if some are not."""
    labelled = [(child_label(i, child.name), child.answers[fact]) for i, child in enumerate(checked.children, start=1)]
    if any(answer is _Missing.CONFLICT for _, answer in labelled):
        return _Missing.CONFLICT  # already reported, as the built stack would raise the child's error
    known = [(label, answer) for label, answer in labelled if answer is not _Missing.UNKNOWN]
    combined = combine(checked.name, fact, known)
    return combined if len(known) == len(labelled) else _Missing.UNKNOWN


def _walk(checked: _Checked) -> Iterator[_Checked]:
    yield checked
    for child in checked.children:
        yield from _walk(child)


def _ok_note(root: _Checked, classes_only: bool) -> str:
    if classes_only:
        return " (classes only)"
    unbuilt = [node.node.position or node.node.cls.__name__ for node in _walk(root) if node.own_failure]
    if not unbuilt:
        return ""
    return f" ({', '.join(unbuilt)} not built from extra config: facts from their classes)"


_SHOW: dict[StaticFact, tuple[str, Callable[[Any], str]]] = {
    LAYOUT: ("layout", lambda v: "any" if v is None else str(v)),
    PIECEWISE: ("piecewise cudagraph", lambda v: "yes" if v else "no"),
    FINISHED_COUNT: ("finished count", lambda v: "default" if v is None else str(v)),
}


def _rows(checked: _Checked, prefix: str, branch: str) -> Iterator[tuple[str, list[str]]]:
    node = checked.node
    subject = node if isinstance(node, ConfiguredStack) else node.cls
    label = f"{node.position} {node.cls.__name__}".strip()
    if node.name.rpartition(":")[2] != node.cls.__name__:
        label += f' ("{node.name}")'  # registered under another name
    capabilities = [f"HMA: {'yes' if supports_hma(subject) else 'no'}"]
    for fact in STATIC_FACTS:
        title, show = _SHOW[fact]
        answer = checked.answers[fact]
        capabilities.append(f"{title}: {answer.value if isinstance(answer, _Missing) else show(answer)}")
    yield prefix + branch + label, capabilities
    inner = prefix + ("│  " if branch == "├─ " else "   " if branch else "")
    for index, child in enumerate(checked.children, start=1):
        yield from _rows(child, inner, "└─ " if index == len(checked.children) else "├─ ")
