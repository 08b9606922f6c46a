"""``MultiConnector``: stack connectors, with capabilities inferred from the children.

``MultiConnector(a, b, ...)`` is HMA-capable — in its static type and at run
time — exactly when every child is. Statically, overloads of ``__new__`` bind
one type variable per child and pick :class:`HMAMultiConnector` when every child
is an :class:`~capkv.HMAConnector`. At run time, ``__new__`` applies the same
rule (:func:`capkv.supports_hma`) and builds an instance of the matching class,
so a non-HMA stack has no ``request_finished_all_groups`` at all and structural
checks (``hasattr``, ``isinstance(stack, SupportsHMA)``) agree with the types.

Children typed ``Any`` are unknown, so the stack is not *proven* HMA-capable:
pyright (and mypy with ``capkv.mypy``) types it as a plain ``MultiConnector``;
plain mypy answers ``Any`` by its overload rules. At run time the real children
decide, and :func:`capkv.check_stack` rejects a non-HMA stack before serving.

Subclasses inherit the overloads, so their static type is the base composite's;
at run time they get an HMA variant of their own class.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from types import new_class
from typing import Any, Generic, cast, overload

import torch
from typing_extensions import TypeVar, TypeVarTuple, Unpack

from capkv.capabilities._facts import StaticFact
from capkv.capabilities._hma import StackNode, describe, explain_not_hma, non_hma_children, supports_hma
from capkv.composite._agreement import agreed_finished_count, agreed_layout, child_label, piecewise_needed
from capkv.composite._completion import ReceiveFromLoader, SendCountdown
from capkv.composite._metadata import MultiConnectorMetadata, MultiWorkerMetadata
from capkv.contracts._connector import HMAConnector, KVConnector, missing_members
from capkv.contracts._engine import (
    AttentionMetadata,
    BlockIds,
    ConnectorMetadata,
    ForwardContext,
    HandshakeMetadata,
    KVConnectorOutput,
    KVTransferParams,
    LoadErrors,
    Request,
    SchedulerOutput,
)
from capkv.errors import CapabilityError, ConfigError, ConflictError, ContractError, MetadataError

__all__ = ["HMAMultiConnector", "MultiConnector", "answers_by_agreement", "stack_class"]

_Ts = TypeVarTuple("_Ts")
_H1 = TypeVar("_H1", bound=HMAConnector)
_H2 = TypeVar("_H2", bound=HMAConnector)
_H3 = TypeVar("_H3", bound=HMAConnector)
_H4 = TypeVar("_H4", bound=HMAConnector)
_H5 = TypeVar("_H5", bound=HMAConnector)
_H6 = TypeVar("_H6", bound=HMAConnector)
_H7 = TypeVar("_H7", bound=HMAConnector)
_H8 = TypeVar("_H8", bound=HMAConnector)
_C1 = TypeVar("_C1", bound=KVConnector)
_C2 = TypeVar("_C2", bound=KVConnector)
_C3 = TypeVar("_C3", bound=KVConnector)
_C4 = TypeVar("_C4", bound=KVConnector)
_C5 = TypeVar("_C5", bound=KVConnector)
_C6 = TypeVar("_C6", bound=KVConnector)
_C7 = TypeVar("_C7", bound=KVConnector)
_C8 = TypeVar("_C8", bound=KVConnector)

_M = TypeVar("_M", MultiConnectorMetadata, MultiWorkerMetadata)
_FinishResult = tuple[bool, KVTransferParams | None]
_Finisher = Callable[[Request, Any], _FinishResult]


class MultiConnector(StackNode, Generic[Unpack[_Ts]]):
    """A stack of connectors: load from the first child with a hit, save to all."""

    __slots__ = (
        "_children",
        "_names",
        "_load_child",
        "_extra_async_saves",
        "_send_countdown",
        "_loads_started",
        "_receives",
        "_single_finishers",
        "_hma_finishers",
    )

    _children: tuple[KVConnector, ...]
    _names: tuple[str, ...]
    _load_child: dict[str, int]
    _extra_async_saves: dict[str, int]
    _send_countdown: SendCountdown
    _loads_started: dict[str, int]
    _receives: ReceiveFromLoader
    _single_finishers: tuple[_Finisher, ...]
    _hma_finishers: tuple[_Finisher, ...]

    @overload
    def __new__(cls, c1: _H1, /) -> HMAMultiConnector[_H1]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, /) -> HMAMultiConnector[_H1, _H2]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, /) -> HMAMultiConnector[_H1, _H2, _H3]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, /) -> HMAMultiConnector[_H1, _H2, _H3, _H4]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, /) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, /) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, c7: _H7, /) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6, _H7]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, c7: _H7, c8: _H8, /) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6, _H7, _H8]: ...
    @overload
    def __new__(cls, c1: _C1, /) -> MultiConnector[_C1]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, /) -> MultiConnector[_C1, _C2]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, /) -> MultiConnector[_C1, _C2, _C3]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, /) -> MultiConnector[_C1, _C2, _C3, _C4]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, /) -> MultiConnector[_C1, _C2, _C3, _C4, _C5]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, /) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, c7: _C7, /) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6, _C7]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, c7: _C7, c8: _C8, /) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8]: ...
    @overload
    def __new__(
        cls, first: HMAConnector, /, *rest: HMAConnector
    ) -> HMAMultiConnector[Unpack[tuple[Any, ...]]]: ...
    @overload
    def __new__(
        cls, first: KVConnector, /, *rest: KVConnector
    ) -> MultiConnector[Unpack[tuple[Any, ...]]]: ...
    def __new__(cls, *children: object) -> MultiConnector[Unpack[tuple[Any, ...]]]:
        """Build the stack; its class (plain or HMA) is decided here, from the children."""
        # ``object``: the children are checked here, with a CapabilityError that names the
        # offender — also in dev mode, where beartype would otherwise refuse them first.
        if not children:
            raise CapabilityError(
                f"{cls.__name__}() needs at least one sub-connector",
                connector=cls.__name__,
                method="__new__",
                value=children,
            )
        for position, child in enumerate(children, start=1):
            missing = missing_members(child)
            if missing:
                raise CapabilityError(
                    f'{cls.__name__}: sub-connector #{position} "{describe(child)}" is not a '
                    f"KVConnector (missing {', '.join(missing)})",
                    connector=f"#{position} {describe(child)}",
                    method="__new__",
                    value=child,
                )
        _refuse_shared_children(cls.__name__, children)
        hma = all(supports_hma(child) for child in children)
        if not hma and issubclass(cls, HMAMultiConnector):
            offenders = explain_not_hma(non_hma_children(_Children(children)))
            raise CapabilityError(
                f"{cls.__name__} needs every child to be HMA-capable: {offenders}",
                connector=cls.__name__,
                method="__new__",
                value=children,
            )
        target: type[MultiConnector[Unpack[tuple[Any, ...]]]] = stack_class(cls, children)
        self = object.__new__(target)
        self._children = cast("tuple[KVConnector, ...]", children)
        self._names = tuple(child_label(i, describe(c)) for i, c in enumerate(children, start=1))
        self._load_child = {}
        self._extra_async_saves = {}
        self._send_countdown = SendCountdown()
        self._loads_started = {}
        self._receives = ReceiveFromLoader()
        self._single_finishers = tuple(c.request_finished for c in self._children)
        self._hma_finishers = (
            tuple(getattr(c, "request_finished_all_groups") for c in children) if hma else ()
        )
        return self

    # ---- structure -------------------------------------------------------------

    @property
    def children(self) -> tuple[Unpack[_Ts]]:
        """The sub-connectors, in stack order."""
        return cast("tuple[Unpack[_Ts]]", self._children)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._children))})"

    def with_children(self, first: KVConnector, /, *rest: KVConnector) -> MultiConnector[Unpack[tuple[Any, ...]]]:
        """A fresh stack of this class over new children — e.g. these, instrumented.

        Nothing of this stack's state is carried over, so do it before serving. A
        subclass whose constructor takes more than the children overrides this.
        """
        stack: MultiConnector[Unpack[tuple[Any, ...]]] = type(self)(first, *rest)  # mypy: Any, by overload rules
        return stack

    # ---- scheduler side ----------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]:
        """Ask every child; the first with a hit loads. Any ``None`` means "ask again"."""
        request_id = request.request_id
        self._load_child.pop(request_id, None)
        chosen: tuple[int, bool] = (0, False)
        for index, child in enumerate(self._children):
            tokens, load_async = child.get_num_new_matched_tokens(request, num_computed_tokens)
            if tokens is not None and (type(tokens) is not int or tokens < 0):
                raise ContractError(
                    f"{self._names[index]}.get_num_new_matched_tokens returned {tokens!r} tokens for "
                    f"{request_id!r}; expected a non-negative int, or None to be asked again",
                    connector=self._names[index],
                    method="get_num_new_matched_tokens",
                    value=tokens,
                )
            if tokens is None:
                self._load_child.pop(request_id, None)
                return None, False
            if chosen[0] == 0 and tokens > 0:
                self._load_child[request_id] = index
                chosen = (tokens, load_async)
        return chosen

    def update_state_after_alloc(
        self, request: Request, blocks: BlockIds, num_external_tokens: int, /
    ) -> None:
        """The loading child gets the external token count; the others get the blocks and 0."""
        loader = self._load_child.get(request.request_id, -1)
        if loader >= 0 and num_external_tokens > 0:
            self._loads_started[request.request_id] = loader
        for index, child in enumerate(self._children):
            child.update_state_after_alloc(
                request, blocks, num_external_tokens if index == loader else 0
            )

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> MultiConnectorMetadata:
        """Children's metadata in order, plus what the worker side must know: save counts, loaders."""
        metadata = MultiConnectorMetadata(
            tuple(child.build_connector_meta(scheduler_output) for child in self._children),
            self._extra_async_saves,
            self._loads_started,
        )
        self._extra_async_saves = {}
        self._loads_started = {}
        return metadata

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        """Each child sees the step's output with its own worker metadata."""
        worker_meta = connector_output.worker_meta
        if worker_meta is None:
            for child in self._children:
                child.update_connector_output(connector_output)
            return
        per_child = self._expect(worker_meta, MultiWorkerMetadata, "update_connector_output")
        for child, meta in zip(self._children, per_child.children, strict=True):
            child.update_connector_output(replace(connector_output, worker_meta=meta))

    def request_finished(self, request: Request, block_ids: list[int], /) -> _FinishResult:
        """Single-group finish, aggregated over every child."""
        return self._aggregate_finished(request, self._single_finishers, block_ids, "request_finished")

    def _aggregate_finished(
        self,
        request: Request,
        finishers: tuple[_Finisher, ...],
        block_ids: object,
        method: str,
    ) -> _FinishResult:
        """The one finish routine: count async saves, merge transfer params.

        The blocks stay allocated until every child that saves asynchronously has
        reported; the extra count travels to the worker side in the next metadata.
        When a child raises or params clash, the saves already accepted are still
        recorded, and the error says whether the engine must keep the blocks
        (``ConflictError.delay_free``, or a note on a child's own exception) — an
        engine that frees them anyway would free them under a running copy.
        (A per-request hot path: the common case touches no dict but the bookkeeping.)
        """
        async_saves = 0
        returned: list[tuple[_Finisher, KVTransferParams]] | None = None
        try:
            for finish in finishers:
                delay_free, params = finish(request, block_ids)
                if delay_free:
                    async_saves += 1
                if params:
                    if returned is None:
                        returned = [(finish, params)]
                    else:
                        returned.append((finish, params))
        except Exception as exc:
            if async_saves:
                exc.add_note(
                    f"{type(self).__name__}.{method}: {async_saves} sub-connector(s) had already accepted "
                    f"an asynchronous save of {request.request_id!r}; keep its blocks until it is "
                    "reported in finished_sending"
                )
            raise
        finally:
            if async_saves > 1:
                self._extra_async_saves[request.request_id] = async_saves - 1
            if self._load_child:
                self._load_child.pop(request.request_id, None)
        if returned is None:
            return async_saves > 0, None
        try:
            return async_saves > 0, self._merge_params(returned, finishers, method)
        except ConflictError as exc:
            exc.delay_free = async_saves > 0
            raise

    def _merge_params(
        self,
        returned: list[tuple[_Finisher, KVTransferParams]],
        finishers: tuple[_Finisher, ...],
        method: str,
    ) -> KVTransferParams:
        """Merge the children's ``kv_transfer_params``; a key given twice is a conflict."""
        merged: KVTransferParams = {}
        owners: dict[str, int] = {}
        for finish, params in returned:
            index = next(i for i, f in enumerate(finishers) if f is finish)
            for key, value in params.items():
                if key in merged:
                    raise ConflictError(
                        f"{self._names[index]}.{method} returned kv_transfer_params key "
                        f"{key!r}, already returned by {self._names[owners[key]]}",
                        connector=self._names[index],
                        method=method,
                        value=key,
                    )
                merged[key] = value
                owners[key] = index
        return merged

    def take_events(self) -> list[object]:
        """Every child's events, in child order (drained eagerly: none are lost)."""
        return [event for child in self._children for event in child.take_events()]

    def get_required_kvcache_layout(self) -> str | None:
        """The layout the children need; children asking for different layouts conflict."""
        answers = [c.get_required_kvcache_layout() for c in self._children]
        return agreed_layout(type(self).__name__, list(zip(self._names, answers, strict=True)))

    def get_finished_count(self) -> int | None:
        """The children's finished count; they must all give the same answer."""
        answers = [c.get_finished_count() for c in self._children]
        return agreed_finished_count(type(self).__name__, list(zip(self._names, answers, strict=True)))

    def requires_piecewise_for_cudagraph(self) -> bool:
        """Needed when any child needs it."""
        return piecewise_needed(child.requires_piecewise_for_cudagraph() for child in self._children)

    def set_xfer_handshake_metadata(self, metadata: Mapping[int, HandshakeMetadata], /) -> None:
        """Every child learns the peers' metadata."""
        for child in self._children:
            child.set_xfer_handshake_metadata(metadata)

    # ---- worker side -------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        for child in self._children:
            child.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        """Bind each child's share; take over the save counts the scheduler side sent."""
        metadata = self._expect(connector_metadata, MultiConnectorMetadata, "bind_connector_metadata")
        self._send_countdown.expect(metadata.extra_async_saves)
        self._receives.expect(metadata.loaders)
        for child, meta in zip(self._children, metadata.children, strict=True):
            child.bind_connector_metadata(meta)

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        metadata = self._expect(connector_metadata, MultiConnectorMetadata, "handle_preemptions")
        for child, meta in zip(self._children, metadata.children, strict=True):
            child.handle_preemptions(meta)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        for child in self._children:
            child.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        for child in self._children:
            child.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        for child in self._children:
            child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        for child in self._children:
            child.wait_for_save()

    def get_finished(
        self, finished_req_ids: set[str], /
    ) -> tuple[set[str] | None, set[str] | None]:
        """A send is finished when its last saving child says so; a receive when its loader does."""
        sending: set[str] = set()
        recving_by_child: list[set[str]] = []
        for index, child in enumerate(self._children):
            child_sending, child_recving = child.get_finished(finished_req_ids)
            if child_sending:
                self._expect_ids(index, "get_finished", child_sending)
                sending.update(r for r in child_sending if self._send_countdown.report(r))
            if child_recving:
                self._expect_ids(index, "get_finished", child_recving)
                recving_by_child.append(child_recving)
            else:
                recving_by_child.append(set())
        recving = self._receives.reports(recving_by_child, finished_req_ids)
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        """The union of the children's failed block ids, group by group."""
        errors: LoadErrors = {}
        for index, child in enumerate(self._children):
            reported = self._per_group(index, child.get_block_ids_with_load_errors())
            for group, block_ids in reported.items():
                if block_ids:
                    errors.setdefault(group, set()).update(block_ids)
        return errors

    def build_connector_worker_meta(self) -> MultiWorkerMetadata | None:
        metas = tuple(child.build_connector_worker_meta() for child in self._children)
        if all(meta is None for meta in metas):
            return None
        return MultiWorkerMetadata(metas)

    def clear_connector_metadata(self) -> None:
        for child in self._children:
            child.clear_connector_metadata()

    def get_handshake_metadata(self) -> object:
        """The first child's handshake metadata that is not ``None``."""
        for child in self._children:
            metadata = child.get_handshake_metadata()
            if metadata is not None:
                return metadata
        return None

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        """The KV cache lives in one pool, so at most one child may provide it."""
        found = [(i, ctx) for i, c in enumerate(self._children) if (ctx := c.get_mem_pool_context()) is not None]
        if len(found) > 1:
            names = ", ".join(self._names[i] for i, _ in found)
            raise ConflictError(
                f"{type(self).__name__}.get_mem_pool_context: several sub-connectors provide a "
                f"KV-cache memory pool ({names}); the KV cache can live in only one",
                connector=names,
                method="get_mem_pool_context",
                value=[ctx for _, ctx in found],
            )
        return found[0][1] if found else None

    def get_kv_connector_stats(self) -> dict[int, object] | None:
        """Each child's statistics, by child index (children without any are left out)."""
        stats = {i: s for i, c in enumerate(self._children) if (s := c.get_kv_connector_stats()) is not None}
        return stats or None

    def shutdown(self) -> None:
        """Shut down every child, even when one fails; then raise what failed."""
        failures: list[Exception] = []
        for index, child in enumerate(self._children):
            try:
                child.shutdown()
            except Exception as exc:
                exc.add_note(f"while shutting down {self._names[index]} of {type(self).__name__}")
                failures.append(exc)
        if len(failures) == 1:
            raise failures[0]
        if failures:
            raise ExceptionGroup(
                f"{type(self).__name__}.shutdown: {len(failures)} sub-connectors failed", failures
            )

    # ---- helpers -------------------------------------------------------------------

    def _per_group(self, index: int, reported: object) -> LoadErrors:
        """A child's load errors must be per group (vLLM's flat set is ambiguous with several groups)."""
        if not isinstance(reported, Mapping):
            raise ContractError(
                f"{self._names[index]}.get_block_ids_with_load_errors returned "
                f"{type(reported).__name__} {reported!r}; capkv reports failed block ids per "
                "KV-cache group: {group index: set of block ids}",
                connector=self._names[index],
                method="get_block_ids_with_load_errors",
                value=reported,
            )
        return cast("LoadErrors", reported)

    def _expect_ids(self, index: int, method: str, ids: object) -> None:
        """A child's request-id report must be a set (a string or list is a porting slip)."""
        if not isinstance(ids, (set, frozenset)):
            raise ContractError(
                f"{self._names[index]}.{method} reported request ids as "
                f"{type(ids).__name__} {ids!r}; expected a set of request ids (or None)",
                connector=self._names[index],
                method=method,
                value=ids,
            )

    def _expect(self, metadata: object, kind: type[_M], method: str) -> _M:
        """``metadata`` as the composite's own kind, or a :class:`~capkv.MetadataError`."""
        if not isinstance(metadata, kind) or len(metadata.children) != len(self._children):
            raise MetadataError(
                f"{type(self).__name__}.{method}: expected {kind.__name__} with "
                f"{len(self._children)} children, got {metadata!r}",
                connector=type(self).__name__,
                method=method,
                value=metadata,
            )
        return metadata


class HMAMultiConnector(MultiConnector[Unpack[_Ts]]):
    """A stack whose every child is HMA-capable, so the stack is too."""

    __slots__ = ()

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> _FinishResult:
        """Every child gets every group; the same aggregation as ``request_finished``."""
        return self._aggregate_finished(
            request, self._hma_finishers, block_ids, "request_finished_all_groups"
        )


class _Children(StackNode):
    """A bare tuple of children, to reuse the stack walk in error messages."""

    __slots__ = ("_items",)

    def __init__(self, items: tuple[object, ...]) -> None:
        self._items = items

    @property
    def children(self) -> tuple[object, ...]:
        return self._items


def _refuse_shared_children(stack: str, children: tuple[object, ...]) -> None:
    """One connector object may sit at one place in a stack only.

    Its per-step state (bound metadata, planned saves) would be overwritten by
    its second position's calls, and the blocks it was to release would leak.
    """
    seen: dict[int, str] = {}
    pending: list[tuple[str, object]] = [(f"#{i}", c) for i, c in enumerate(children, start=1)]
    while pending:
        position, node = pending.pop(0)
        first = seen.setdefault(id(node), position)
        if first != position:
            raise ConfigError(
                f'{stack}: sub-connector {position} "{describe(node)}" is the same object as {first}; '
                "give each position its own connector",
                connector=f"{position} {describe(node)}",
                method="__new__",
                value=node,
            )
        if isinstance(node, StackNode):
            pending += [(f"{position}.{i}", c) for i, c in enumerate(node.children, start=1)]


_HMA_VARIANTS: dict[type[Any], type[Any]] = {}


def stack_class(cls: type[Any], children: Iterable[object]) -> type[Any]:
    """The class ``cls(*children)`` builds: a stack's HMA variant when every child is HMA-capable.

    ``children`` may be connectors, connector classes or stack nodes, so a stack
    read from configuration is named as the built one will be. A class that is
    not a :class:`MultiConnector` builds itself.
    """
    if MultiConnector not in cls.__mro__:
        return cls
    stack = cast("type[MultiConnector[Unpack[tuple[Any, ...]]]]", cls)
    return _hma_variant(stack) if all(supports_hma(child) for child in children) else stack


def answers_by_agreement(cls: type[Any], fact: StaticFact) -> bool:
    """Whether ``cls`` answers ``fact`` from its children by :mod:`capkv.composite._agreement`.

    True for :class:`MultiConnector` and subclasses that keep its member; a
    subclass that overrides it has a rule of its own, which only an instance knows.
    """
    if not issubclass(cls, MultiConnector):
        return False
    member: object = inspect.getattr_static(cast("type[object]", cls), fact)
    return member is vars(MultiConnector)[fact]


def _hma_variant(cls: type[MultiConnector[Unpack[tuple[Any, ...]]]]) -> type[MultiConnector[Unpack[tuple[Any, ...]]]]:
    """The HMA class to build for ``cls``: itself, ``HMAMultiConnector``, or a cached mix-in of both."""
    if issubclass(cls, HMAMultiConnector):
        return cls
    if cls is MultiConnector:
        return HMAMultiConnector
    variant = _HMA_VARIANTS.get(cls)
    if variant is None:
        def body(namespace: dict[str, Any]) -> None:
            namespace.update(__slots__=(), __module__=cls.__module__, __qualname__=cls.__qualname__)

        variant = new_class(cls.__name__, (cls, HMAMultiConnector), exec_body=body)
        _HMA_VARIANTS[cls] = variant
    return variant
