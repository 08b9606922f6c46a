"""The engine-side objects a connector is handed, as capkv sees them.

capkv names only what it reads, so each engine's own classes fit: what it merely passes through is opaque.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from capkv._homes import publish

__all__ = [
    "AttentionMetadata",
    "BlockIds",
    "ComputedTokenRequest",
    "ConnectorMetadata",
    "ForwardContext",
    "HandshakeMetadata",
    "KVConnectorOutput",
    "KVTransferParams",
    "LoadErrors",
    "Request",
    "SchedulerOutput",
    "TokenRequest",
    "WorkerMetadata",
]

# Aliases are implicit (no ``TypeAlias``): in dev mode capkv runs under beartype's
# claw, which warns on every PEP 613 alias before Python 3.12.

BlockIds = tuple[list[int], ...]
"""A request's block ids, one list per KV-cache group (the HMA shape)."""

LoadErrors = dict[int, set[int]]
"""Block ids that failed to load, keyed by KV-cache group index.

A flat set is ambiguous once there are several groups (the same id means a
different block in each group's table), so capkv always reports per group.
"""

KVTransferParams = dict[str, Any]
"""Free-form parameters a connector returns from ``request_finished``."""

SchedulerOutput = Any
"""The engine's scheduler output for one step. An alias of ``typing.Any``: opaque to capkv, so vLLM's
``SchedulerOutput`` (or your engine's) fits; it checks nothing."""

ForwardContext = Any
"""The engine's forward context handed to ``start_load_kv``. An alias of ``typing.Any``: opaque to capkv;
it checks nothing."""

AttentionMetadata = Any
"""The engine's attention metadata handed to ``save_kv_layer``. An alias of ``typing.Any``: opaque to capkv;
it checks nothing."""

ConnectorMetadata = Any
"""What a connector's scheduler side sends to its worker side. An alias of ``typing.Any``: each connector
defines its own; capkv checks nothing."""

HandshakeMetadata = Any
"""Out-of-band handshake data exchanged between peer engines. An alias of ``typing.Any``: opaque to capkv;
it checks nothing."""


@runtime_checkable
class Request(Protocol):
    """What capkv itself needs of a request: its id.

    A request needs a ``request_id``; everything the composite merely passes through (scheduler output,
    forward context, attention metadata, connector metadata, events) is *opaque* — typed ``Any`` where a
    connector receives it, so that each engine's own classes fit, and ``object`` where a connector returns it.
    """

    @property
    def request_id(self) -> str: ...


@runtime_checkable
class TokenRequest(Request, Protocol):
    """A request whose tokens are visible (as vLLM's ``Request.all_token_ids``).

    Connectors that key stored KV by token-prefix content need this much.
    """

    @property
    def all_token_ids(self) -> Sequence[int]: ...


@runtime_checkable
class ComputedTokenRequest(TokenRequest, Protocol):
    """A token request that also says how many of its tokens' KV the engine has computed
    (as vLLM's ``Request.num_computed_tokens``).

    A store that saves a finished request's KV needs this: only computed blocks
    hold real KV, and a request aborted before prefill has none.
    """

    @property
    def num_computed_tokens(self) -> int: ...


@runtime_checkable
class WorkerMetadata(Protocol):
    """Worker-to-scheduler metadata; the outputs of several workers are merged by ``aggregate``."""

    def aggregate(self, other: Any, /) -> WorkerMetadata: ...


@dataclass(frozen=True)
class KVConnectorOutput:
    """What the workers report back to the scheduler-side connector after a step."""

    finished_sending: frozenset[str] = frozenset()
    finished_recving: frozenset[str] = frozenset()
    worker_meta: WorkerMetadata | None = None
    invalid_block_ids: Mapping[int, frozenset[int]] = field(
        default_factory=lambda: dict[int, frozenset[int]]()
    )


publish(__name__)
