"""The contract's three facts, answered from a connector *class* when it can.

So ``capkv check`` can report a configured stack whose connectors need the engine's objects to be built.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any, Final, Literal

from capkv.capabilities._table import ACCESS, LOOKAHEAD, SLEEP_MODE
from capkv.contracts._access import KVCacheAccess

__all__ = [
    "ACCESS",
    "CONFIG_FACTS",
    "ConfigFact",
    "FINISHED_COUNT",
    "LOOKAHEAD",
    "LAYOUT",
    "NEEDS_INSTANCE",
    "PIECEWISE",
    "STATIC_FACTS",
    "NeedsInstance",
    "SLEEP_MODE",
    "SleepFact",
    "StaticFact",
    "class_answer",
    "class_fact",
    "class_sleeps",
]

StaticFact = Literal["get_required_kvcache_layout", "requires_piecewise_for_cudagraph", "get_finished_count"]
"""The name of one of the contract's facts."""

LAYOUT: Final = "get_required_kvcache_layout"
PIECEWISE: Final = "requires_piecewise_for_cudagraph"
FINISHED_COUNT: Final = "get_finished_count"

SleepFact = Literal["supports_sleep_mode"]
"""The sleep-mode fact (asked at configuration time by vLLM releases that have it, not shown by ``capkv check``'s tree)."""

ConfigFact = Literal["supports_sleep_mode", "kv_cache_access", "supports_lookahead_block_hashes"]
"""The facts vLLM asks a connector class with its configuration (0.33, 0.34); a class without the member
answers its default (:data:`CONFIG_FACTS`)."""

CONFIG_FACTS: dict[ConfigFact, object] = {SLEEP_MODE: True, ACCESS: KVCacheAccess.IN_PROCESS, LOOKAHEAD: False}
"""Each configuration-time fact and the answer of a class without the member (vLLM's base default)."""

STATIC_FACTS: tuple[StaticFact, ...] = (LAYOUT, PIECEWISE, FINISHED_COUNT)
"""The facts, in the order ``capkv check`` shows them."""


class NeedsInstance(enum.Enum):
    """The type of :data:`NEEDS_INSTANCE`."""

    NEEDS_INSTANCE = "needs an instance"

    def __repr__(self) -> str:
        return "NEEDS_INSTANCE"


NEEDS_INSTANCE: Final = NeedsInstance.NEEDS_INSTANCE
"""What :func:`class_fact` returns when only an instance can answer."""


def class_fact(cls: type[Any], fact: StaticFact | ConfigFact) -> object:
    """``cls``'s answer to ``fact`` when its member is class-level, else :data:`NEEDS_INSTANCE`.

    The member is found as attribute lookup finds it (through the MRO, without
    invoking descriptors), so a subclass's instance-method override hides a
    base's class-level default, and a class-level override hides an instance
    method. A class-level member that needs arguments (vLLM's take the engine's
    config) cannot answer from the class alone: :data:`NEEDS_INSTANCE` too.
    Errors raised by the member propagate.

    ``get_required_kvcache_layout``, ``get_finished_count`` and ``requires_piecewise_for_cudagraph`` state
    facts an engine needs before serving. A connector whose answer does not depend on its configuration
    declares the member class-level (a classmethod or staticmethod; in a :class:`~capkv.KVConnectorBase`
    subclass, :func:`~capkv.class_level`), and then the class answers.

    The rule is the member the class resolves through its MRO, nothing else: a class-level member answers from
    the class, an instance method means "ask an instance". ``KVConnectorBase``'s defaults are class-level by
    that same rule, not by being special-cased.
    """
    member = inspect.getattr_static(cls, fact, None)
    if isinstance(member, classmethod | staticmethod):
        bound = getattr(cls, fact)
        if _needs_arguments(bound):
            return NEEDS_INSTANCE
        answer: object = bound()
        return answer
    return NEEDS_INSTANCE


def class_answer(cls: type[Any], fact: ConfigFact) -> object:
    """capkv connector class ``cls``'s answer to a configuration-time ``fact``: its class-level member's,
    the default (:data:`CONFIG_FACTS`) without one, :data:`NEEDS_INSTANCE` for an instance method."""
    if inspect.getattr_static(cls, fact, None) is None:
        return CONFIG_FACTS[fact]
    return class_fact(cls, fact)


def class_sleeps(cls: type[Any]) -> object:
    """Whether the engine may sleep (give up its KV cache's memory) with capkv connector class ``cls``.

    Its class-level ``supports_sleep_mode()`` says; a class without the member can (vLLM's base
    default): a connector that holds views of the KV cache releases them in ``unregister_kv_caches``
    and is registered again on wake. An instance method: :data:`NEEDS_INSTANCE`.
    """
    return class_answer(cls, SLEEP_MODE)


def _needs_arguments(member: Any) -> bool:
    try:
        parameters = inspect.signature(member).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it as the contract says
        return False
    return any(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters
    )
