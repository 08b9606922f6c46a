"""The members of vLLM's connector base class capkv knows, per release, and the rule for any other.

vLLM adds members in most releases, and its ``MultiConnector`` defines in the same release how the children's
answers combine: a member capkv does not know is answered by that rule over the stack's leaves, so capkv gives
vLLM's answer on the day a release ships (docs/vllm.md, "New vLLM members").
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterable, Mapping
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from capkv.adapters.vllm._composite_rule import composite_rule

__all__ = ["BASE_OWNED", "VLLM_MEMBERS", "complete", "known_members", "unknown_members"]

_V032: frozenset[str] = frozenset({
    "bind_connector_metadata", "bind_gpu_block_pool", "bind_kv_cache_manager", "build_connector_meta",
    "build_connector_worker_meta", "build_kv_connector_stats", "build_prom_metrics", "clear_connector_metadata",
    "finish_forward", "get_block_ids_with_load_errors", "get_external_cache_hit_sources", "get_finished",
    "get_finished_count", "get_handshake_metadata", "get_kv_connector_kv_cache_events", "get_kv_connector_stats",
    "get_loaded_kv_cache_group_ids", "get_mem_pool_context", "get_num_new_matched_tokens",
    "get_required_kvcache_layout", "get_transfer_results", "handle_preemptions", "has_connector_metadata",
    "has_pending_block_frees", "has_pending_push_work", "on_new_request", "register_finished_partial_tail",
    "register_kv_caches", "request_finished", "requires_kv_delivery", "requires_piecewise_for_cudagraph",
    "reset_cache", "reset_capture_state", "role", "save_kv_layer", "set_host_xfer_buffer_ops",
    "set_xfer_handshake_metadata", "set_xfer_handshake_metadata_pp_aware", "shutdown", "start_load_kv",
    "supports_divergent_local_hybrid_hits", "take_events", "update_connector_output", "update_state_after_alloc",
    "wait_for_layer_load", "wait_for_save",
})

VLLM_MEMBERS: Mapping[str, frozenset[str]] = types.MappingProxyType({
    "0.32": _V032,
    "0.33": _V032 | {"supports_sleep_mode", "unregister_kv_caches", "restore_kv_caches"},
    "0.34": _V032 | {"supports_sleep_mode", "unregister_kv_caches", "restore_kv_caches",
                     "kv_cache_access", "may_load_async", "supports_lookahead_block_hashes"},
})
"""The public members of ``KVConnectorBase_V1`` in each supported vLLM release."""

BASE_OWNED: frozenset[str] = frozenset({"role", "has_connector_metadata"})
"""Known members a host leaves to vLLM's base class by design (its state is the base's own)."""

_log = logging.getLogger("capkv.vllm")
_warned: set[str] = set()


def known_members() -> frozenset[str]:
    """Every member capkv knows, in any supported release."""
    return frozenset[str]().union(*VLLM_MEMBERS.values())


def unknown_members(base: type[Any] = KVConnectorBase_V1) -> list[str]:
    """The public members of vLLM's base class (as installed) that capkv does not know, sorted."""
    known = known_members()
    return sorted(name for name in dir(base) if not name.startswith("_") and name not in known)


def complete(cls: type[Any], *, own: bool = False) -> tuple[str, ...]:
    """Give ``cls`` vLLM's composite rule for every unknown member only vLLM's base defines (the base's
    default where vLLM's composite has none); return their names.

    With ``own``, also make every other member of the base one of ``cls``'s own (in its ``__dict__``,
    bound to its module), as vLLM's composite defines them, so a check of the class's namespace sees
    each one delegated.
    """
    known = known_members()
    filled: list[str] = []
    for name in dir(KVConnectorBase_V1):
        if name.startswith("_") or name in vars(cls) or name in BASE_OWNED:
            continue
        owner = next(base for base in cls.__mro__ if name in vars(base))
        member: object = vars(owner)[name]
        if owner is KVConnectorBase_V1:
            if name in known:
                continue  # a known member the class leaves to the base: tests/vllm/test_members.py names it
            filled.append(name)
            rule = composite_rule(name, cls)
            setattr(cls, name, _owned(member, cls) if rule is None else rule)
        elif own:
            setattr(cls, name, _owned(member, cls))
    _warn(filled)
    return tuple(filled)


def _warn(names: Iterable[str]) -> None:
    new = [name for name in names if name not in _warned]
    if not new:
        return
    _warned.update(new)
    _log.warning(
        "capkv.vllm: this vLLM's connector base class has member%s capkv does not know: %s; each is "
        "answered by vLLM's own MultiConnector rule over the stack's leaves, or vLLM's default where that "
        "has none (see docs/vllm.md, \"New vLLM members\")", "s" if len(new) > 1 else "", ", ".join(new),
    )


def _owned(member: Any, cls: type[Any]) -> Any:
    """``member`` (a function, classmethod, staticmethod or property) as ``cls``'s own."""
    if isinstance(member, types.FunctionType):
        copy = types.FunctionType(member.__code__, member.__globals__, member.__name__, member.__defaults__,
                                  member.__closure__)
        copy.__kwdefaults__ = member.__kwdefaults__
        copy.__annotations__ = dict(member.__annotations__)
        copy.__doc__ = member.__doc__
        copy.__qualname__ = f"{cls.__qualname__}.{member.__name__}"
        copy.__module__ = cls.__module__
        return copy
    if isinstance(member, classmethod):
        owned: Any = classmethod(_owned(cast("Any", member).__func__, cls))
        return owned
    if isinstance(member, staticmethod):
        still: Any = staticmethod(_owned(cast("Any", member).__func__, cls))
        return still
    if isinstance(member, property):
        getter: Any = member.fget
        return property(_owned(getter, cls), member.fset, member.fdel, member.__doc__)
    return member
