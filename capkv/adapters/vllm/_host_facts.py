"""vLLM 0.34's per-stack facts a host answers from its leaves: asynchronous loads, and what the classes told.

vLLM asks ``may_load_async`` each time a request enters a waiting queue, and allocates its KV cache by what
the classes told it: a built leaf must not need more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from vllm.config.kv_transfer import KVTransferConfig
from vllm.v1.request import Request

from capkv.adapters.vllm._vllm_calls import leaves, wrapped_vllm
from capkv.capabilities._facts import ACCESS, LOOKAHEAD, NEEDS_INSTANCE, ConfigFact, class_answer
from capkv.capabilities._table import MAY_LOAD_ASYNC, fold
from capkv.errors import ConflictError

__all__ = ["AsyncLoads", "check_told"]


def _base_rule(request: Any) -> bool:
    """vLLM's base ``may_load_async``: the request's P/D ``do_remote_prefill``."""
    params: Any = getattr(request, "kv_transfer_params", None)
    return bool(params and params.get("do_remote_prefill"))


class AsyncLoads:
    """The host's ``may_load_async``."""

    _built: object

    def may_load_async(self, request: Request) -> bool:
        """Whether any leaf may answer ``load_async=True`` for ``request`` (vLLM 0.34, with
        ``max_num_inflight_kv_loads``: such a request may start loading while the running batch is full)."""
        asks = self._may_load_async_asks()
        return fold(MAY_LOAD_ASYNC, (ask(request) for ask in asks))

    def _may_load_async_asks(self) -> list[Callable[[Any], bool]]:
        built = self._built
        cached: tuple[object, list[Callable[[Any], bool]]] | None = vars(self).get("_capkv_async_asks")
        if cached is None or cached[0] is not built:
            asks: list[Callable[[Any], bool]] = []
            for leaf in leaves(built):
                target: object = wrapped_vllm(leaf) or leaf
                own: Any = getattr(target, MAY_LOAD_ASYNC, None)
                ask = cast("Callable[[Any], bool]", own) if callable(own) else _base_rule
                asks.append(ask)
            cached = (built, asks)
            vars(self)["_capkv_async_asks"] = cached
        return cached[1]


def check_told(host: str, cls: type[Any], transfer: KVTransferConfig | None, built: object) -> None:
    """A built capkv leaf whose class could not answer KV-cache access or lookahead hashes answers now; it
    must need nothing its host class did not tell vLLM (:class:`~capkv.ConflictError` naming it)."""
    if transfer is None:
        return
    told_access = int(cls.kv_cache_access(transfer))
    told_lookahead = bool(cls.supports_lookahead_block_hashes(transfer))
    for leaf in leaves(built):
        if wrapped_vllm(leaf) is not None:
            continue  # vLLM's classes answered for their own entries
        for fact in (ACCESS, LOOKAHEAD):
            if class_answer(type(leaf), fact) is not NEEDS_INSTANCE:
                continue
            answer: object = getattr(leaf, fact)()
            if fact == ACCESS and int(_int(answer)) & ~told_access:
                _conflict(host, leaf, fact, answer, told_access)
            if fact == LOOKAHEAD and told_lookahead and answer is not True:
                _conflict(host, leaf, fact, answer, told_lookahead)


def _int(answer: object) -> int:
    return answer if isinstance(answer, int) else 0


def _conflict(host: str, leaf: object, fact: ConfigFact, answer: object, told: object) -> None:
    name = type(leaf).__name__
    raise ConflictError(
        f"{host}: {name}.{fact}() answers {answer!r}, but the stack's classes told vLLM {told!r} when vLLM "
        f"allocated its KV cache; declare it class-level (@capkv.class_level) in {name}",
        connector=name, method=fact, value=answer,
    )
