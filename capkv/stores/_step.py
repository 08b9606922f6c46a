"""What a store reads of a scheduler output: which requests compute which tokens, in which blocks.

A store saves a block in the step that computes it, while the engine still holds it; capkv reads vLLM's own
fields, so vLLM's object fits as it is.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from capkv.errors import ContractError

__all__ = ["ScheduledBlocks", "scheduled_blocks"]

_METHOD = "build_connector_meta"


@dataclass(frozen=True)
class ScheduledBlocks:
    """One scheduled request, as a store sees it."""

    request_id: str
    num_computed_tokens: int
    """Tokens whose KV the engine holds before this step."""
    num_scheduled_tokens: int
    """Tokens this step computes."""
    block_ids: tuple[list[int], ...] | None
    """Per group: the block ids to append to the request's table (``None``: no new blocks)."""
    replace: bool
    """``block_ids`` is the whole table (a new or resumed request), not an addition."""


def scheduled_blocks(scheduler_output: object, *, owner: str) -> list[ScheduledBlocks]:
    """The step's scheduled requests (empty for ``None``), checked field by field."""
    if scheduler_output is None:
        return []
    scheduled = _field(scheduler_output, "num_scheduled_tokens", owner)
    if not isinstance(scheduled, Mapping):
        raise _malformed(owner, "num_scheduled_tokens", scheduled, "a mapping of request id to token count")
    counts = cast("Mapping[object, object]", scheduled)
    views: list[ScheduledBlocks] = []
    new_reqs = _field(scheduler_output, "scheduled_new_reqs", owner)
    for item in _sequence(new_reqs, "scheduled_new_reqs", owner):
        request_id = _field(item, "req_id", owner)
        views.append(_view(
            owner, request_id, _field(item, "num_computed_tokens", owner), counts,
            _field(item, "block_ids", owner), replace=True,
        ))
    cached = _field(scheduler_output, "scheduled_cached_reqs", owner)
    ids = _sequence(_field(cached, "req_ids", owner), "scheduled_cached_reqs.req_ids", owner)
    new_block_ids = _sequence(_field(cached, "new_block_ids", owner), "scheduled_cached_reqs.new_block_ids", owner)
    computed = _sequence(_field(cached, "num_computed_tokens", owner), "scheduled_cached_reqs.num_computed_tokens", owner)
    resumed: object = getattr(cached, "resumed_req_ids", ())
    if not isinstance(resumed, Collection) or isinstance(resumed, (str, bytes)):
        raise _malformed(owner, "scheduled_cached_reqs.resumed_req_ids", resumed, "a set of request ids")
    if not len(ids) == len(new_block_ids) == len(computed):
        raise _malformed(
            owner, "scheduled_cached_reqs", (len(ids), len(new_block_ids), len(computed)),
            "req_ids, new_block_ids and num_computed_tokens of equal length",
        )
    for request_id, blocks, before in zip(ids, new_block_ids, computed, strict=True):
        views.append(_view(owner, request_id, before, counts, blocks, replace=request_id in resumed))
    return views


def _view(
    owner: str, request_id: object, before: object, counts: Mapping[object, object], blocks: object, *, replace: bool
) -> ScheduledBlocks:
    if not isinstance(request_id, str):
        raise _malformed(owner, "req_id", request_id, "a request id (str)")
    if type(before) is not int or before < 0:
        raise _malformed(owner, f"num_computed_tokens of {request_id!r}", before, "an int >= 0")
    count = counts.get(request_id, 0)
    if type(count) is not int or count < 0:
        raise _malformed(owner, f"num_scheduled_tokens[{request_id!r}]", count, "an int >= 0")
    table: tuple[list[int], ...] | None = None
    if blocks is not None:
        groups = _sequence(blocks, f"block ids of {request_id!r}", owner)
        table = tuple(_ids(group, request_id, owner) for group in groups)
    return ScheduledBlocks(request_id, before, count, table, replace)


def _ids(group: object, request_id: str, owner: str) -> list[int]:
    ids: list[int] = []
    for value in _sequence(group, f"block ids of {request_id!r}", owner):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _malformed(owner, f"block ids of {request_id!r}", value, "int block ids")
        ids.append(value)
    return ids


def _sequence(value: object, name: str, owner: str) -> Sequence[object]:
    if isinstance(value, (str, bytes, Mapping)):
        raise _malformed(owner, name, cast(object, value), "a sequence")
    if isinstance(value, Sequence):
        return cast("Sequence[object]", value)
    if isinstance(value, Iterable):
        return list(cast("Iterable[object]", value))
    raise _malformed(owner, name, value, "a sequence")


_MISSING = object()


def _field(value: object, name: str, owner: str) -> object:
    found = getattr(value, name, _MISSING)
    if found is _MISSING:
        raise ContractError(
            f"{owner}.{_METHOD}: the scheduler output has no {name!r} ({type(value).__name__}); a store reads "
            "scheduled_new_reqs, scheduled_cached_reqs and num_scheduled_tokens, as vLLM's SchedulerOutput "
            "has them, to save blocks in the step that computes them (pass None to save only at finish)",
            connector=owner, method=_METHOD, value=value,
        )
    return found


def _malformed(owner: str, name: str, value: object, expected: str) -> ContractError:
    return ContractError(
        f"{owner}.{_METHOD}: scheduler output field {name} is {value!r}; expected {expected}",
        connector=owner, method=_METHOD, value=value,
    )
