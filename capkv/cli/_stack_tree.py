"""One configured stack, built and asked: the tree ``capkv check`` and ``capkv demo`` both print.

One builder and one renderer, so the two commands never disagree about a stack (the fact rules:
docs/internals.md, "The command line").
"""

from __future__ import annotations

import enum
import reprlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capkv.capabilities._fact_values import fact_problem
from capkv.capabilities._facts import FINISHED_COUNT, LAYOUT, NEEDS_INSTANCE, PIECEWISE, STATIC_FACTS, StaticFact, class_fact
from capkv.capabilities._hma import supports_hma
from capkv.composite._agreement import child_label, combine
from capkv.composite._building import answers_by_agreement, stack_class
from capkv.config._build import BuildContext, build_composite, build_connector, call_user_code
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack
from capkv.config._options import declared_options
from capkv.errors import CapkvError, ConfigError

__all__ = ["Findings", "Inspected", "Missing", "engine_class", "inspect_stack", "loads", "tree_lines", "walk"]


class Missing(enum.Enum):
    """A fact with no value: nothing could answer it, or the children conflict (or it was refused)."""

    UNKNOWN = "?"
    CONFLICT = "conflict"


@dataclass
class Findings:
    """What inspecting a stack found, in the order found."""

    problems: list[str] = field(default_factory=list[str])
    """The stack cannot serve as configured: conflicts, capability (exit 1)."""
    errors: list[str] = field(default_factory=list[str])
    """The configuration or a connector is broken: bad options, a connector that raises (exit 2)."""


@dataclass
class Inspected:
    """One node of the stack, inspected: its built connector (if any) and its facts."""

    node: ConfiguredNode
    children: tuple[Inspected, ...]
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

    @property
    def label(self) -> str:
        """``#2.1 FileStoreConnector``, with the configured name when it differs from the class's."""
        node = self.node
        label = f"{node.position} {node.cls.__name__}".strip()
        if node.name.rpartition(":")[2] != node.cls.__name__:
            label += f' ("{node.name}")'  # registered under another name
        return label


def inspect_stack(
    node: ConfiguredNode, *, build: bool = True, context: BuildContext | None = None, findings: Findings
) -> Inspected:
    """Build what can be built (children first), then answer every fact; record what is wrong in ``findings``."""
    if isinstance(node, ConfiguredConnector):
        inspected = Inspected(node, ())
        if _options_ok(node, context, findings) and build and not engine_class(node.cls):
            _build(inspected, lambda: build_connector(node, context=context), findings)
    else:
        children = tuple(inspect_stack(entry, build=build, context=context, findings=findings) for entry in node.entries)
        inspected = Inspected(node, children)
        if build and all(child.built is not None for child in children):
            _build(inspected, lambda: build_composite(node, [child.built for child in children]), findings)
        else:
            inspected.unbuilt_because = tuple(r for child in children for r in child.unbuilt_because)
    for fact in STATIC_FACTS:
        inspected.answers[fact] = _answer(inspected, fact, findings)
        if inspected.answers[fact] is Missing.UNKNOWN and not _by_agreement(inspected, fact):
            inspected.missing_because = inspected.unbuilt_because
    return inspected


def engine_class(cls: type[Any]) -> bool:
    """Whether ``cls`` is an engine's own connector class (vLLM's ``KVConnectorBase_V1``): the engine builds
    it from its own configuration, never from an extra config alone, so ``capkv check`` answers it by class."""
    return any(base.__name__ == "KVConnectorBase_V1" and base.__module__.startswith("vllm.") for base in cls.__mro__)


def _options_ok(node: ConfiguredConnector, context: BuildContext | None, findings: Findings) -> bool:
    """Check the leaf's extra config against its declared options, even when it will not be built."""
    where = f"{node.position}: " if node.position else ""
    try:
        options = declared_options(node.cls)
        if options is not None:
            defaults: Mapping[str, object] = {} if context is None else context.defaults
            extra: dict[str, object] = {k: v for k, v in defaults.items() if k in options.options}
            extra.update(node.extra_config)
            options.check(extra, connector=f'"{node.name}"')
    except ConfigError as exc:
        findings.errors.append(f"{where}{exc}")
        return False
    return True


def _build(inspected: Inspected, make: Callable[[], Any], findings: Findings) -> None:
    try:
        inspected.built = make()
    except ConfigError as exc:  # e.g. a connector that needs more than its extra config
        inspected.unbuilt_because, inspected.own_failure = (str(exc),), True
    except CapkvError as exc:  # e.g. a composite refused its children
        findings.problems.append(str(exc))


def _by_agreement(inspected: Inspected, fact: StaticFact) -> bool:
    return isinstance(inspected.node, ConfiguredStack) and answers_by_agreement(inspected.node.cls, fact)


def _answer(inspected: Inspected, fact: StaticFact, findings: Findings) -> object:
    """From the class if it can answer, else by agreement of the children, else from the instance."""
    where = f"{inspected.node.position} " if inspected.node.position else ""
    asked = f'{where}"{inspected.name}".{fact}()'
    try:
        answer = call_user_code(lambda: class_fact(inspected.node.cls, fact), asked, where or inspected.name, None, fact)
        if answer is NEEDS_INSTANCE:
            if _by_agreement(inspected, fact):
                return _agreement(inspected, fact)
            if inspected.built is None:
                return Missing.UNKNOWN
            built = inspected.built
            answer = call_user_code(lambda: getattr(built, fact)(), asked, where or inspected.name, None, fact)
    except ConfigError as exc:  # the connector's own code raised
        findings.errors.append(str(exc))
        return Missing.CONFLICT
    except CapkvError as exc:
        findings.problems.append(str(exc))
        return Missing.CONFLICT
    problem = fact_problem(fact, answer)
    if problem is not None:
        findings.errors.append(f"{asked} returned {reprlib.repr(answer)}: {problem}")
        return Missing.CONFLICT
    return answer


def _agreement(inspected: Inspected, fact: StaticFact) -> object:
    """The children's answers combined; a conflict among those known is reported even if some are not."""
    labelled = [(child_label(i, child.name), child.answers[fact]) for i, child in enumerate(inspected.children, start=1)]
    if any(answer is Missing.CONFLICT for _, answer in labelled):
        return Missing.CONFLICT  # already reported, as the built stack would raise the child's error
    known = [(label, answer) for label, answer in labelled if answer is not Missing.UNKNOWN]
    combined = combine(inspected.name, fact, known)
    return combined if len(known) == len(labelled) else Missing.UNKNOWN


def walk(inspected: Inspected) -> Iterator[Inspected]:
    """Every node, root first, depth first."""
    yield inspected
    for child in inspected.children:
        yield from walk(child)


_SHOW: dict[StaticFact, tuple[str, Callable[[Any], str]]] = {
    LAYOUT: ("layout", lambda v: "any" if v is None else str(v)),
    PIECEWISE: ("piecewise cudagraph", lambda v: "yes" if v else "no"),
    FINISHED_COUNT: ("finished count", lambda v: "default" if v is None else str(v)),
}


def loads(inspected: Inspected) -> str:
    """How a store tier's hits load: ``async`` (answered ``load_async=True``, read off the engine's step: its
    backend declares ``slow = True``), ``sync`` (in the engine's step), ``?`` (a store not built, whose backend
    decides). Blank for a stack, and for a connector that is not one of capkv's stores (it answers
    ``load_async`` with each hit)."""
    if isinstance(inspected.node, ConfiguredStack):
        return ""
    built = inspected.built
    answer: object = (
        getattr(built, "loads_async", _PER_HIT) if built is not None
        else getattr(inspected.node.cls, "default_loads_async", _PER_HIT)
    )
    if answer is _PER_HIT or (built is not None and not isinstance(answer, bool)):
        return ""
    return "loads: " + ("async" if answer is True else "sync" if answer is False else "?")


_PER_HIT = object()


def tree_lines(
    root: Inspected,
    detail: Callable[[Inspected], str] | None = None,
    *,
    hma: Callable[[Inspected], bool | None] | None = None,
) -> list[str]:
    """The stack as a tree, one line per node, columns aligned: HMA, each fact, how a tier's hits load
    (:func:`loads`), then ``detail`` (if any).

    ``hma`` answers a node's HMA column where an engine's rule decides it (``None``: capkv's rule).
    """
    rows = [[label, *cells] for label, cells in _rows(root, "", "", detail, hma)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _rows(
    inspected: Inspected,
    prefix: str,
    branch: str,
    detail: Callable[[Inspected], str] | None,
    hma: Callable[[Inspected], bool | None] | None,
) -> Iterator[tuple[str, list[str]]]:
    node = inspected.node
    subject = node if isinstance(node, ConfiguredStack) else node.cls
    decided = None if hma is None else hma(inspected)
    cells = [f"HMA: {'yes' if (supports_hma(subject) if decided is None else decided) else 'no'}"]
    for fact in STATIC_FACTS:
        title, show = _SHOW[fact]
        answer = inspected.answers[fact]
        cells.append(f"{title}: {answer.value if isinstance(answer, Missing) else show(answer)}")
    cells.append(loads(inspected))
    if detail is not None:
        cells.append(detail(inspected))
    yield prefix + branch + inspected.label, cells
    inner = prefix + ("│  " if branch == "├─ " else "   " if branch else "")
    for index, child in enumerate(inspected.children, start=1):
        yield from _rows(child, inner, "└─ " if index == len(inspected.children) else "├─ ", detail, hma)
