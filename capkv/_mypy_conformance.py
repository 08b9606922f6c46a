"""Why a type is not a connector: the protocol's members, one by one, in words.

mypy says a class "has incompatible type" or lists eighteen overloads; the plugin names the member and how it
differs. Nothing here reports, so the rule is read (and tested) apart from the hook.
"""

from __future__ import annotations

from mypy.messages import format_type_bare
from mypy.nodes import ArgKind
from mypy.options import Options
from mypy.subtypes import find_member, is_subtype
from mypy.types import CallableType, Instance, Type, get_proper_type

__all__ = ["member_differences"]

_LIMIT = 3
"""Differences spelled out per child; the rest are counted, so one message stays one line."""


def member_differences(child: Instance, protocol: Instance, options: Options) -> list[str]:
    """How ``child`` fails ``protocol``, one phrase per member (empty when it conforms).

    Each phrase says how the member differs: missing, a parameter renamed, missing, extra or of the wrong
    type, a wrong return type — using only mypy's types.
    """
    found: list[str] = []
    missing: list[str] = []
    for member in sorted(protocol.type.protocol_members):
        want = find_member(member, protocol, child)
        got = find_member(member, child, child)
        if want is None:
            continue
        if got is None:
            missing.append(member)
        elif not is_subtype(got, want, options=options):
            found.append(f"{member}: {_difference(got, want, options)}")
    if len(found) > _LIMIT:
        rest = len(found) - _LIMIT
        found = [*found[:_LIMIT], f"{rest} more member{'s' if rest > 1 else ''} differ{'' if rest > 1 else 's'}"]
    if missing and len(missing) == len(protocol.type.protocol_members):
        found.insert(0, "it has none of the contract's members")
    elif missing:
        more = f" and {len(missing) - _LIMIT} more" if len(missing) > _LIMIT else ""
        found.insert(0, f"missing {', '.join(missing[:_LIMIT])}{more}")
    return found


def _difference(got: Type, want: Type, options: Options) -> str:
    """One member: the most specific reason found, else both types."""
    got_proper, want_proper = get_proper_type(got), get_proper_type(want)
    if isinstance(got_proper, CallableType) and isinstance(want_proper, CallableType):
        reasons = _callable_differences(got_proper, want_proper, options)
        if reasons:
            return "; ".join(reasons)
    return f'is "{format_type_bare(got, options)}", the contract needs "{format_type_bare(want, options)}"'


def _callable_differences(got: CallableType, want: CallableType, options: Options) -> list[str]:
    """Parameter by parameter, as the engine calls ``want``; then the return type."""
    reasons: list[str] = []
    matched: set[int] = set()
    for index, (kind, name, typ) in enumerate(zip(want.arg_kinds, want.arg_names, want.arg_types)):
        if kind == ArgKind.ARG_STAR:
            if got.var_arg() is None:
                reasons.append("takes no *args")
            continue
        if kind == ArgKind.ARG_STAR2:
            if got.kw_arg() is None:
                reasons.append("takes no **kwargs")
            continue
        named = name is not None and not name.startswith("__")  # else positional-only: names do not matter
        if kind.is_positional():
            counterpart = got.argument_by_position(index)
            label = f'parameter "{name}"' if named else f"parameter {index + 1}"
            if counterpart is None:
                reasons.append(f"has no {label}")
                continue
            if index < len(got.arg_kinds):
                matched.add(index)
            if named and counterpart.name is not None and counterpart.name != name:
                reasons.append(f'{label} is named "{counterpart.name}"')
                continue
        else:
            counterpart = got.argument_by_name(name)
            label = f'keyword parameter "{name}"'
            if counterpart is None:
                reasons.append(f"has no {label}")
                continue
            if counterpart.pos is not None:
                matched.add(counterpart.pos)
        if not is_subtype(typ, counterpart.typ, options=options):
            passed, taken = format_type_bare(typ, options), format_type_bare(counterpart.typ, options)
            reasons.append(f'{label} takes "{taken}", the engine passes "{passed}"')
    for index, (kind, name) in enumerate(zip(got.arg_kinds, got.arg_names)):
        if kind.is_required() and index not in matched and not _passed_by(want, name, index):
            label = f'"{name}"' if name else str(index + 1)
            reasons.append(f"requires parameter {label}, which the engine does not pass")
    if not is_subtype(got.ret_type, want.ret_type, options=options):
        returned, needed = format_type_bare(got.ret_type, options), format_type_bare(want.ret_type, options)
        reasons.append(f'returns "{returned}", the contract needs "{needed}"')
    return reasons


def _passed_by(want: CallableType, name: str | None, index: int) -> bool:
    """Whether the engine, calling ``want``'s way, fills a parameter (``name``, at ``index``)."""
    if index < len(want.arg_kinds) and want.arg_kinds[index].is_positional():
        return True
    return name is not None and name in want.arg_names
