"""``@class_level``: a contract member the class answers, before any instance exists.

So ``capkv check`` can read a connector's facts from its class, for connectors that cannot be built without
the engine's objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from capkv._homes import publish

__all__ = ["class_level"]

_Method = TypeVar("_Method")


def class_level(method: _Method) -> _Method:
    """Make ``method`` a classmethod, keeping its instance-method type for checkers.

    Three members of :class:`~capkv.KVConnector` state facts rather than do work —
    ``get_required_kvcache_layout``, ``get_finished_count`` and ``requires_piecewise_for_cudagraph``. When a
    connector's answer does not depend on how it is configured, declaring the member class-level lets ``capkv
    check`` (:func:`capkv.capabilities._facts.class_fact`) answer from the class alone.

    A plain ``classmethod`` satisfies the protocol member too, but mypy and pyright both refuse an instance
    method overriding a classmethod, and pyright refuses the reverse. ``@class_level`` is a classmethod at run
    time that checkers see as the instance method it declares, so :class:`~capkv.KVConnectorBase`'s defaults
    use it and subclasses may override them either way: with an instance method when the answer depends on
    configuration, with ``@class_level`` when it does not. The decorated method's first parameter receives the
    *class*: name it ``cls``.
    """
    return cast("_Method", classmethod(cast("Callable[..., Any]", method)))


publish(__name__)
