"""What a connector that reads token ids needs from a request, checked in production.

An engine object without them would otherwise fail as an ``AttributeError`` deep inside a store, naming no
one.
"""

from __future__ import annotations

from collections.abc import Sequence

from capkv.contracts._violation import contract_error

__all__ = ["check_token_request"]

_MISSING = object()


def check_token_request(request: object, *, connector: str, method: str) -> None:
    """Raise :class:`~capkv.ContractError` unless ``request`` has a ``str`` ``request_id`` and a
    sequence of token ids ``all_token_ids`` (element types are the hash's concern: only the container is read here).

    A :class:`~capkv.TokenRequest`'s ``all_token_ids`` is a list, or vLLM's read-only ``ConstantList``.
    """
    request_id = getattr(request, "request_id", _MISSING)
    if not isinstance(request_id, str):
        problem = "has no request_id" if request_id is _MISSING else f"has a {type(request_id).__name__} request_id"
        raise contract_error(
            connector, method, "request", value=request, problem=problem,
            expected="a request with a str request_id and all_token_ids (capkv.TokenRequest)",
        )
    tokens = getattr(request, "all_token_ids", _MISSING)
    if tokens is _MISSING or not isinstance(tokens, Sequence) or isinstance(tokens, str | bytes):
        problem = "has no all_token_ids" if tokens is _MISSING else f"has a {type(tokens).__name__} all_token_ids"
        raise contract_error(
            connector, method, f"request {request_id!r}", value=request if tokens is _MISSING else tokens,
            problem=problem, expected="all_token_ids, a sequence of int token ids (capkv.TokenRequest)",
        )
