"""Engine-side objects for a connector's unit tests, built in one call each.

The reference engine's own objects, so a unit test and the conformance run see the same shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from capkv._homes import publish
from capkv.contracts._engine import BlockIds
from capkv.contracts._key_inputs import MultimodalItem
from capkv.contracts._spec import KVSpec
from capkv.engine._outputs import ForwardContext, LoadCheck, ScheduledRequest, SchedulerOutput
from capkv.engine._request import Request
from capkv.errors import ConfigError

__all__ = ["forward_context", "kv_caches", "make_request", "scheduled", "scheduler_output"]


def make_request(
    request_id: str = "req-0",
    prompt_token_ids: Sequence[int] = tuple(range(1, 33)),
    *,
    max_tokens: int = 1,
    num_computed_tokens: int = 0,
    cache_salt: str | None = None,
    adapter: str | None = None,
    multimodal: Sequence[MultimodalItem] = (),
    prompt_embeds: Sequence[bytes] = (),
) -> Request:
    """A request as the reference engine tracks it (a :class:`capkv.ComputedTokenRequest` and a
    :class:`capkv.KeyedRequest`: ``cache_salt``, ``adapter``, ``multimodal`` and ``prompt_embeds`` are
    its inputs besides its tokens, see :class:`capkv.KeyInputs`)."""
    request = Request(
        request_id, prompt_token_ids, max_tokens=max_tokens, cache_salt=cache_salt, adapter=adapter,
        multimodal=multimodal, prompt_embeds=prompt_embeds,
    )
    if not 0 <= num_computed_tokens <= request.num_tokens:
        raise ConfigError(
            f"make_request: num_computed_tokens {num_computed_tokens} is outside [0, {request.num_tokens}]",
            method="make_request", value=num_computed_tokens,
        )
    request.num_computed_tokens = num_computed_tokens
    return request


def scheduled(
    request: Request,
    block_ids: BlockIds,
    *,
    start: int | None = None,
    stop: int | None = None,
    loaded: tuple[int, int] | None = None,
) -> ScheduledRequest:
    """One request's share of a step: positions ``[start, stop)`` (default: from its computed tokens to its end).

    ``loaded`` is the ``(start, stop)`` token range a connector loaded for it this step, if any.
    """
    first = request.num_computed_tokens if start is None else start
    last = request.num_tokens if stop is None else stop
    if not 0 <= first <= last <= request.num_tokens:
        raise ConfigError(
            f"scheduled: [{first}, {last}) is not a range of request {request.request_id!r}'s "
            f"{request.num_tokens} tokens",
            method="scheduled", value=(first, last),
        )
    check = None if loaded is None else LoadCheck(*loaded)
    return ScheduledRequest(request, first, last, tuple(list(ids) for ids in block_ids), check)


def scheduler_output(
    requests: Iterable[ScheduledRequest] = (),
    *,
    step: int = 1,
    finished_req_ids: Iterable[str] = (),
    connector_metadata: object = None,
) -> SchedulerOutput:
    """One step's plan, as ``build_connector_meta`` receives it."""
    output = SchedulerOutput(step, list(requests), set(finished_req_ids))
    output.kv_connector_metadata = connector_metadata
    return output


def forward_context(output: SchedulerOutput, spec: KVSpec) -> ForwardContext:
    """What ``start_load_kv`` receives for ``output`` on a model with ``spec``'s layers."""
    return ForwardContext(output, spec.layer_names)


def kv_caches(spec: KVSpec, *, fill: float | None = None) -> dict[str, torch.Tensor]:
    """Paged KV tensors for every layer ``spec`` names, in its shapes, dtype and device.

    ``fill=None`` fills them with a pattern that varies from element to element
    and from layer to layer, so a copy that moves the wrong block usually shows;
    a number fills every element with it.
    """
    if not spec.layer_names:
        raise ConfigError("kv_caches: the spec names no layers", method="kv_caches", value=spec)
    caches: dict[str, torch.Tensor] = {}
    dtype = spec.dtype or torch.float32
    for group_index, group in enumerate(spec.groups):
        shape = group.kv_shape
        if shape is None:
            raise ConfigError(
                f"kv_caches: group {group_index} has no kv_shape", method="kv_caches", group=group_index, value=group
            )
        for offset, name in enumerate(group.layer_names):
            if fill is not None:
                tensor = torch.full(shape, fill, dtype=dtype, device=spec.device)
            else:
                count = 1
                for size in shape:
                    count *= size
                values = torch.arange(count, dtype=torch.float64) + offset * count
                tensor = values.remainder(2.0**11).to(dtype).reshape(shape).to(spec.device)
            caches[name] = tensor
    return caches


publish(__name__)
