"""Public homes: an exported class or function reports the front users import it from.

So reprs, tracebacks, generated docs and pickles name ``capkv.MultiConnector``, which any later capkv can
resolve wherever the class then lives.
"""

from __future__ import annotations

import enum
import importlib
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["publish", "register"]

_FRONTS: dict[str, dict[str, list[str]]] = {}
"""Registered fronts: front -> {defining module: names it exports from there}."""


def register(front: str, exports: Mapping[str, Iterable[str]]) -> None:
    """Record that ``front`` exports ``exports`` (defining module -> names)."""
    _FRONTS[front] = {module: list(names) for module, names in exports.items()}


def publish(module: str, *fronts: str) -> None:
    """Give every name a front exports from ``module`` that front as its ``__module__``.

    The fronts consulted are ``capkv``, the module's own package fronts (all
    imported before the module itself), and ``fronts``: those of another package
    that export from this one (``capkv.testing`` exports an engine object), which
    are imported here — a front costs nothing to import.

    capkv defines its names in private modules (``capkv/composite/_multi.py``) and exports them from package
    fronts (``capkv``). Python records the defining module as ``__module__``; as trio and httpx do, each
    exported object is given its front's name instead — ``capkv.MultiConnector.__module__ == "capkv"``. An
    exported enum member re-homes its enum (which pickles its members by name, ``capkv.composite.NOT_BUILT``).

    The fronts register what they export (:func:`register`, called by :func:`capkv._lazy.attach`); a private
    module that defines exported names ends with ``publish(__name__)``, which re-homes them the moment they
    exist — whether the module was loaded through a front or imported directly — so no object is ever seen, or
    pickled, under its private path. ``tests/test_homes.py`` pins it for every exported name.
    """
    namespace = vars(sys.modules[module])
    parts = module.split(".")
    for front in (*(".".join(parts[:i]) for i in range(1, len(parts))), *fronts):
        if front not in _FRONTS:
            importlib.import_module(front)
        for name in _FRONTS.get(front, {}).get(module, ()):
            value = namespace[name]
            if isinstance(value, enum.Enum):  # an exported member (capkv.composite.NOT_BUILT): its enum moves too
                value = type(value)
            if isinstance(value, (type, types.FunctionType)) and value.__module__ == module:
                _rehome(value, module, front, namespace)


def _rehome(obj: Any, old: str, new: str, namespace: dict[str, Any]) -> None:
    """``obj`` and what its class body defined (methods, nested classes) move from ``old`` to ``new``."""
    if isinstance(obj, type):
        _resolve_annotations(obj, namespace)
        for member in list(vars(obj).values()):
            for inner in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
                if isinstance(inner, (type, types.FunctionType)) and inner.__module__ == old:
                    _rehome(inner, old, new, namespace)
    obj.__module__ = new


def _resolve_annotations(cls: type, namespace: dict[str, Any]) -> None:
    """Evaluate the class's string annotations where they were written.

    ``typing.get_type_hints(cls)`` evaluates them in ``sys.modules[cls.__module__]``,
    which after the move is the front, where the names they use are not. Each one
    that evaluates now is stored evaluated; one that cannot (a name imported only
    for type checkers) stays a string, as unresolvable as it was.
    """
    annotations: dict[str, Any] | None = vars(cls).get("__annotations__")
    if not annotations:
        return
    scope = {**namespace, **vars(cls)}
    for name, hint in list(annotations.items()):
        if isinstance(hint, str):
            try:
                annotations[name] = eval(hint, scope)  # noqa: S307 - the module's own annotation text
            except Exception:  # noqa: BLE001 - left as written, like get_type_hints would fail on it
                continue
