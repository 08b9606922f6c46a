"""The mypy plugin behind :mod:`capkv.mypy` (which exports :func:`plugin` alone).

It changes mypy's messages about ``MultiConnector`` stacks, never its verdicts; the rule it applies lives in
:mod:`capkv._mypy_rule`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# mypy.plugin first: it imports mypy's modules in the order their cycles need.
from mypy.plugin import (  # isort: skip
    CheckerPluginInterface,
    FunctionContext,
    FunctionSigContext,
    Plugin,
    ReportConfigContext,
)
from mypy.errorcodes import ErrorCode
from mypy.nodes import ARG_NAMED, ARG_POS, ARG_STAR, CallExpr, Context, Expression, MypyFile, RefExpr
from mypy.options import Options
from mypy.traverser import NameAndMemberCollector
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    TupleType,
    Type,
    TypeOfAny,
    get_proper_type,
)

from capkv import _mypy_conformance, _mypy_rule
from capkv._homes import publish
from capkv._mypy_conformance import member_differences
from capkv._mypy_rule import CONNECTOR, HMA_STACK, StackRule, has_unpack, type_name
from capkv.capabilities import _hma, _table
from capkv.capabilities._hma import explain_not_hma
from capkv.capabilities._table import HMA_METHOD, fold
from capkv.composite._options import STACK_OPTIONS

__all__ = ["CAPKV_CONNECTOR", "CAPKV_HMA", "SUPPORTED_MYPY", "CapkvPlugin", "plugin"]

SUPPORTED_MYPY: tuple[tuple[int, int], ...] = ((2, 3), (2, 4))
"""mypy releases (major, minor) the plugin is tested with; others load, with a warning."""

CAPKV_HMA = ErrorCode("capkv-hma", "A connector stack used where HMA capability is required", "capkv")
"""The error code of the plugin's explanation (``# type: ignore[capkv-hma]`` silences it)."""

CAPKV_CONNECTOR = ErrorCode("capkv-connector", "A stack's child is not a KVConnector", "capkv")
"""The error code of a non-conforming child's explanation, member by member."""


_RULE_DIGEST = hashlib.sha256(
    b"".join(
        Path(path).read_bytes() for path in (__file__, *(m.__file__ or "" for m in (_mypy_conformance, _mypy_rule, _hma, _table)))
    )
).hexdigest()


class CapkvPlugin(Plugin):
    """Hooks ``MultiConnector`` (and subclass) construction: precise types and explanations.

    The stack's precise type from every child's type, and — where the result must be HMA-capable and is not —
    one error naming the offending children (``capkv-hma``), or, for a child that is not a ``KVConnector``,
    one error per child naming the members that differ (``capkv-connector``, :mod:`capkv._mypy_conformance`).
    """

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._reset()

    def set_modules(self, modules: dict[str, MypyFile]) -> None:
        """A new build (the daemon reuses plugins): forget what the last one learnt."""
        super().set_modules(modules)
        self._reset()

    def _reset(self) -> None:
        self._rule = StackRule(self.lookup_fully_qualified)
        self._receivers: dict[int, tuple[MypyFile, frozenset[int], list[CallExpr]]] = {}
        self._verdicts: dict[int, tuple[CallExpr, Type | None, _Verdict | None]] = {}
        self._evaluating = 0  # > 0 while typing a stack's children for a verdict

    def report_config_data(self, ctx: ReportConfigContext) -> str:
        """The rule's own version: mypy re-checks cached modules when the plugin's modules change.

        mypy fingerprints the plugin's entry module (``capkv/mypy.py``) only; the plugin lives beside it.
        """
        return _RULE_DIGEST

    # ---- hook registration ---------------------------------------------------------

    def get_function_signature_hook(
        self, fullname: str
    ) -> Callable[[FunctionSigContext], FunctionLike] | None:
        """Constructing a stack: explain, before overload resolution, why it cannot be HMA here."""
        return self._explain_use if self._rule.is_stack_class(fullname) else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        """Constructing a stack: its type from every child's type."""
        return self._stack_type if self._rule.is_stack_class(fullname) else None

    # ---- construction: the stack's type --------------------------------------------

    def _stack_type(self, ctx: FunctionContext) -> Type:
        """Every child's type, at any arity; HMA exactly when every child is (``Any`` is not)."""
        if not isinstance(get_proper_type(ctx.default_return_type), Instance):
            return ctx.default_return_type  # an error was reported, or the call is not a stack
        call = ctx.context
        if not isinstance(call, CallExpr) or self._explained(call, ctx.api):
            return ctx.default_return_type
        by_expr = {id(e): t for es, ts in zip(ctx.args, ctx.arg_types) for e, t in zip(es, ts)}
        children: list[Type] = []
        labels: list[str] = []  # how an error names each child: by position while positions are known
        exact = True
        options = False  # keyword arguments: a subclass's own options, not children
        for expr, kind, name in zip(call.args, call.arg_kinds, call.arg_names):
            if kind not in (ARG_POS, ARG_STAR):
                options = options or name not in STACK_OPTIONS  # the stack's own option is no subclass's
                continue
            typ = by_expr.get(id(expr))
            proper = get_proper_type(typ) if typ is not None else None
            if proper is None:
                return ctx.default_return_type
            items: list[Type] | None = None
            if kind == ARG_POS:
                items = [proper]
            elif isinstance(proper, TupleType) and not has_unpack(proper.items):
                items = proper.items
            if items is not None:
                for item in items:
                    children.append(item)
                    labels.append(f"sub-connector #{len(children)}" if exact else "an unpacked sub-connector")
            else:
                element = self._rule.element_type(proper)
                if element is None:
                    return ctx.default_return_type
                children.append(element)
                labels.append("an unpacked sub-connector")
                exact = False
        if not children:
            return ctx.default_return_type
        if not all(self._rule.is_connector(child) for child in children):
            return self._explain_children(ctx.api, call, children, labels)
        if options:
            return ctx.default_return_type  # the subclass's own constructor types the call
        hma = fold(HMA_METHOD, (self._rule.is_hma(child) for child in children))
        return self._rule.stack(children, hma=hma) if exact else self._rule.any_arity_stack(hma=hma)

    def _explain_children(
        self, api: CheckerPluginInterface, call: CallExpr, children: Sequence[Type], labels: Sequence[str]
    ) -> Type:
        """Children that are not connectors: one error each, member by member; the call is then ``Any``.

        Reached only through the catch-all overload item, which the signature hook
        widened to take any child (see :meth:`_explain_use`), so mypy's list of every
        overload never precedes it.
        """
        stack = _callee_name(call)
        protocol = self._rule.protocol(CONNECTOR)
        for label, child in zip(labels, children, strict=True):
            proper = get_proper_type(child)
            if self._rule.is_connector(proper):
                continue
            differences = member_differences(proper, protocol, api.options) if isinstance(proper, Instance) else []
            why = f" ({'; '.join(differences)})" if differences else ""
            api.fail(
                f'{stack}: {label} "{type_name(proper)}" is not a KVConnector{why}', call, code=CAPKV_CONNECTOR
            )
        return AnyType(TypeOfAny.from_error)

    # ---- use: the explanation ------------------------------------------------------------

    def _explain_use(self, ctx: FunctionSigContext) -> FunctionLike:
        """Where the call's result must be HMA-capable and is not, say why — once, precisely.

        Runs before overload resolution, once per overload item. The children are
        typed as the HMA items type them, silently, as mypy's own trial does. The
        error is reported here, outside any trial; the call then gets the HMA
        stack's type, so mypy's generic error does not follow it.
        """
        signature = ctx.default_signature
        if _is_catch_all(signature):
            # The last item takes any children, so that a non-connector child reaches
            # the function hook (_explain_children) instead of failing every item.
            # Only parameters typed KVConnector widen: a subclass's own options keep their types.
            anything = ctx.api.named_generic_type("builtins.object", [])
            widened = [
                anything if kind in (ARG_POS, ARG_STAR) and _is_connector_type(typ) else typ
                for kind, typ in zip(signature.arg_kinds, signature.arg_types)
            ]
            signature = signature.copy_modified(arg_types=widened)  # pyright: ignore[reportUnknownMemberType]
        call = ctx.context
        if self._evaluating or not isinstance(call, CallExpr) or not _plausible(signature, call):
            return signature
        context = ctx.api.type_context[-1] if ctx.api.type_context else None
        known = self._verdicts.get(id(call))
        if known is not None and known[0] is call and known[1] is context and not _is_hma_item(signature):
            verdict = known[2]
        else:
            verdict = self._verdict(ctx.api, call, context, signature)
            self._verdicts[id(call)] = (call, context, verdict)
        if verdict is None:
            return signature
        ctx.api.fail(verdict.message, call, code=CAPKV_HMA)
        # mypy types copy_modified's parameters with its own "Bogus" alias, unknown to pyright
        return signature.copy_modified(ret_type=verdict.recovery)  # pyright: ignore[reportUnknownMemberType]

    def _explained(self, call: CallExpr, api: CheckerPluginInterface) -> bool:
        """Whether this evaluation of ``call`` already reported its explanation."""
        known = self._verdicts.get(id(call))
        context = api.type_context[-1] if api.type_context else None
        return known is not None and known[0] is call and known[1] is context and known[2] is not None

    def _verdict(
        self, api: CheckerPluginInterface, call: CallExpr, context: Type | None, signature: CallableType
    ) -> _Verdict | None:
        receiver = self._is_receiver(api, call)
        if not receiver and not self._rule.requires_hma(context, None):
            return None
        args = _children_args(call)
        if args is None:
            return None  # unpacked children have no positions to name (or a subclass's options): mypy's message stands
        formals = [typ for typ, kind in zip(signature.arg_types, signature.arg_kinds) if kind in (ARG_POS, ARG_STAR)]
        self._evaluating += 1
        try:
            with api.msg.filter_errors():
                children = [
                    self._child_type(api, arg, formals[min(index, len(formals) - 1)])
                    for index, arg in enumerate(args)
                ]
        finally:
            self._evaluating -= 1
        if any(child is None or not self._rule.is_connector(child) for child in children):
            return None
        known = [child for child in children if child is not None]
        offenders = self._rule.offenders(known)
        if not offenders or not (receiver or self._rule.requires_hma(context, known)):
            return None
        stack = _callee_name(call)
        what = f'"{stack}" has no {HMA_METHOD}' if receiver else f'"{stack}" is not HMA-capable'
        return _Verdict(f"{what}: {explain_not_hma(offenders)}", self._rule.stack(known, hma=True))

    def _child_type(self, api: CheckerPluginInterface, expr: Expression, formal: Type) -> Type | None:
        """A child's type as the HMA overload item types it; nested stacks by the rule itself.

        Typing a nested ``MultiConnector(...)`` through mypy would resolve its
        overloads once more per level; the rule gives the same type directly.
        """
        callee = expr.callee if isinstance(expr, CallExpr) else None
        nested = _children_args(expr) if isinstance(expr, CallExpr) else None
        if isinstance(callee, RefExpr) and self._rule.is_stack_class(callee.fullname) and nested:
            children = [self._child_type(api, arg, formal) for arg in nested]
            if any(child is None or not self._rule.is_connector(child) for child in children):
                return None
            known = [child for child in children if child is not None]
            return self._rule.stack(known, hma=fold(HMA_METHOD, (self._rule.is_hma(child) for child in known)))
        return api.get_expression_type(expr, formal)

    def _is_receiver(self, api: CheckerPluginInterface, call: CallExpr) -> bool:
        """Whether the call is ``<call>.request_finished_all_groups`` in the module being checked."""
        tree = getattr(api, "tree", None)
        if not isinstance(tree, MypyFile):
            return False
        known = self._receivers.get(id(tree))
        if known is None or known[0] is not tree:
            collector = NameAndMemberCollector()
            tree.accept(collector)
            found = [m.expr for m in collector.member_exprs if m.name == HMA_METHOD and isinstance(m.expr, CallExpr)]
            known = self._receivers[id(tree)] = (tree, frozenset(map(id, found)), found)  # nodes kept alive
        return id(call) in known[1]


@dataclass(frozen=True)
class _Verdict:
    """The explanation to report, and the type the call gets afterwards (no second error)."""

    message: str
    recovery: Instance


def _plausible(signature: CallableType, call: CallExpr) -> bool:
    """Whether this overload item could take the call's children (by count; ``promote=`` is no child)."""
    given = sum(1 for kind in call.arg_kinds if kind in (ARG_POS, ARG_STAR))
    if signature.is_var_arg:
        return given >= 1
    return sum(1 for kind in signature.arg_kinds if kind == ARG_POS) == given


def _children_args(call: CallExpr) -> list[Expression] | None:
    """The call's children, when each is a plain positional argument and the only keywords are the stack's own
    options; else ``None``."""
    children: list[Expression] = []
    for expr, kind, name in zip(call.args, call.arg_kinds, call.arg_names):
        if kind == ARG_POS:
            children.append(expr)
        elif kind != ARG_NAMED or name not in STACK_OPTIONS:
            return None
    return children


def _is_catch_all(signature: CallableType) -> bool:
    """The overload item for any number of plain connectors: ``(KVConnector, /, *rest: KVConnector)``."""
    return signature.is_var_arg and not _is_hma_item(signature)


def _is_connector_type(typ: Type) -> bool:
    proper = get_proper_type(typ)
    return isinstance(proper, Instance) and proper.type.fullname == CONNECTOR


def _is_hma_item(signature: CallableType) -> bool:
    returned = get_proper_type(signature.ret_type)
    return isinstance(returned, Instance) and returned.type.has_base(HMA_STACK)


def _callee_name(call: Context) -> str:
    callee = call.callee if isinstance(call, CallExpr) else None
    name = getattr(callee, "name", None)
    return name if isinstance(name, str) else "MultiConnector"


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point (``plugins = capkv.mypy``)."""
    if _release(version) not in SUPPORTED_MYPY:
        tested = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_MYPY)
        print(f"capkv.mypy: tested with mypy {tested}, not {version}: messages may differ", file=sys.stderr)
    return CapkvPlugin


def _release(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


publish(__name__, "capkv.mypy")
