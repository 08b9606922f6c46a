"""Engine entry points that enforce capabilities — never with ``assert``.

Both behave identically under ``python -O``: a stack that cannot serve is refused, never truncated to group 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast, runtime_checkable

from capkv._homes import publish
from capkv.capabilities._hma import StackNode, describe, explain_not_hma, non_hma_children, supports_hma
from capkv.contracts._connector import KVConnector, RequestT, missing_members
from capkv.contracts._engine import BlockIds, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.errors import CapabilityError, ConfigError, ContractError

__all__ = ["KVCacheConfigLike", "check_stack", "finish_request", "num_kv_cache_groups", "require_hma"]


@runtime_checkable
class KVCacheConfigLike(Protocol):
    """Anything with a sequence of KV-cache groups — vLLM's ``KVCacheConfig`` included."""

    @property
    def kv_cache_groups(self) -> Sequence[object]: ...


def num_kv_cache_groups(kv_cache_config: KVCacheConfigLike | KVSpec | int) -> int:
    """How many KV-cache groups a configuration describes (at least one)."""
    given: object = kv_cache_config
    if isinstance(given, KVSpec):
        return given.num_groups
    if isinstance(given, int) and not isinstance(given, bool):
        count = given
    else:
        groups = getattr(given, "kv_cache_groups", None)
        if not isinstance(groups, Sequence):
            raise ConfigError(
                f"expected a KV-cache config (with a kv_cache_groups sequence), a KVSpec or a group "
                f"count, got {type(given).__name__} {given!r}",
                method="check_stack",
                value=given,
            )
        count = len(cast("Sequence[object]", groups))
    if count < 1:
        raise ConfigError(
            f"a KV cache has at least one group, got {count}", method="check_stack", value=given
        )
    return count


def check_stack(
    connector: object, kv_cache_config: KVCacheConfigLike | KVSpec | int
) -> None:
    """Raise :class:`~capkv.CapabilityError` unless ``connector`` can serve ``kv_cache_config``.

    With more than one KV-cache group every leaf of the stack must be HMA-capable;
    the error names each one that is not, by position and class. Children's
    conflicts (layouts, finished counts) surface here too, as
    :class:`~capkv.ConflictError`, rather than mid-serving. Given a
    :class:`~capkv.KVSpec`, a composite with ``bind_kv_spec`` (a
    :class:`~capkv.MultiConnector`) learns the block sizes, by which it checks that
    its children's slices of a composed hit end on block boundaries.
    """
    num_groups = num_kv_cache_groups(kv_cache_config)
    missing = missing_members(connector)
    if missing:
        raise CapabilityError(
            f'"{describe(connector)}" is not a KVConnector (missing {", ".join(missing)})',
            connector=describe(connector),
            method="check_stack",
            value=missing,
        )
    require_hma(connector, num_groups)
    stack = cast("KVConnector", connector)
    stack.get_required_kvcache_layout()
    stack.get_finished_count()
    if isinstance(kv_cache_config, KVSpec) and isinstance(connector, StackNode):
        bind: object = getattr(connector, "bind_kv_spec", None)
        if callable(bind):  # a composite checks its children's slices against the block sizes
            bind(kv_cache_config)


def require_hma(stack: object, kv_cache_config: KVCacheConfigLike | KVSpec | int) -> None:
    """Raise :class:`~capkv.CapabilityError` when ``stack`` cannot serve that many KV-cache groups.

    ``stack`` may be a connector, a connector class, or a :class:`~capkv.StackNode`
    (a composite, or a stack read from configuration whose leaves are classes):
    the verdict needs no instance. The error names every non-HMA leaf by position.
    """
    num_groups = num_kv_cache_groups(kv_cache_config)
    if num_groups <= 1 or supports_hma(stack):
        return
    offenders = non_hma_children(stack)
    raise CapabilityError(
        f'"{describe(stack)}" cannot serve {num_groups} KV-cache groups: {explain_not_hma(offenders)}',
        connector=", ".join(f"{c.position} {c.name}" if c.path else c.name for c in offenders),
        method="check_stack",
        value=num_groups,
    )


def finish_request(
    connector: KVConnector[RequestT], request: RequestT, block_ids: BlockIds
) -> tuple[bool, KVTransferParams | None]:
    """Hand a finished request's blocks (one list per group) to ``connector``.

    HMA-capable connectors get every group; others get the single group when
    there is exactly one. Anything else is a :class:`~capkv.CapabilityError`:
    handing only group 0 would store or free the wrong KV. ``block_ids`` must be
    a non-empty tuple of lists (vLLM's old flat ``list[int]`` is refused with a
    :class:`~capkv.ContractError`, not passed on); checking the shape costs one
    step per group, the ids themselves are checked in dev mode.
    """
    _check_groups_shape(connector, block_ids)
    if supports_hma(connector):
        hma: Any = connector
        result: tuple[bool, KVTransferParams | None] = hma.request_finished_all_groups(
            request, block_ids
        )
        return result
    if len(block_ids) == 1:
        return connector.request_finished(request, block_ids[0])
    offenders = non_hma_children(connector)
    raise CapabilityError(
        f'"{describe(connector)}".request_finished_all_groups is unavailable and the request '
        f"has {len(block_ids)} KV-cache groups: {explain_not_hma(offenders)}",
        connector=describe(connector),
        method="finish_request",
        group=1 if block_ids else None,
        value=len(block_ids),
    )


def _check_groups_shape(connector: object, block_ids: object) -> None:
    if _is_one_list_per_group(block_ids):
        return
    raise ContractError(
        f'finish_request("{describe(connector)}"): block_ids must be a non-empty tuple with one list '
        f"of block ids per KV-cache group, got {type(block_ids).__name__} {block_ids!r}",
        connector=describe(connector),
        method="finish_request",
        value=block_ids,
    )


def _is_one_list_per_group(block_ids: object) -> bool:
    if type(block_ids) is not tuple:
        return False
    groups = cast("tuple[object, ...]", block_ids)
    return bool(groups) and all(isinstance(group, list) for group in groups)


publish(__name__)
