"""The one finish routine behind ``request_finished`` and ``request_finished_all_groups``.

Every child is told, even when one raises: a child left untold would keep the request's hash chain and could
offer its KV to a reused request id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from capkv.composite._fanout import Failures, bad_answer
from capkv.composite._plan import Plan
from capkv.composite._settling import LoadSettling, unfilled_masked
from capkv.contracts._spec import KVSpec
from capkv.contracts._engine import KVTransferParams, Request
from capkv.errors import ConflictError, FinishError

__all__ = ["FinishResult", "FinishRoutine", "Finisher"]

FinishResult = tuple[bool, KVTransferParams | None]
_UNSET: Any = object()  # a child's answer before its call returned
Finisher = Callable[[Request, Any], FinishResult]
"""A child's finish member; the stack keeps each with its child's bit (``1 << index``)."""


class FinishRoutine:
    """Mixed into the stack: the finish aggregation over its children."""

    __slots__ = ()

    _names: tuple[str, ...]
    _savers: list[tuple[str, int]]
    _folds: list[tuple[str, int, int]]
    _plans: dict[str, Plan]
    _settling: LoadSettling
    _spec: KVSpec | None

    def _finish(
        self, request: Request, finishers: tuple[tuple[int, Finisher], ...], block_ids: object, method: str
    ) -> FinishResult:
        """Tell every child; record who saves; merge transfer params; one error if anything failed.

        From the first token of a load the engine has not heard the end of, every child gets the null
        block (:mod:`~capkv.composite._settling`): no tier saves what never arrived. A request whose
        asynchronous load the engine still waits for (aborted mid-load) is kept by the engine until that
        load's receive: the stack never keeps it too (``delay_free=False``), and the savers' sends are
        folded into the receive (docs/internals.md, "Folding saves into a receive")."""
        settling = self._settling
        awaited = settling.awaited(request.request_id)
        first = settling.finishing(request.request_id)
        if first is not None:
            if awaited is not None and settling.in_flight():
                first = 0  # a step in flight may report the receive before the fold arrives: nothing is saved
            block_ids = unfilled_masked(block_ids, first, self._spec, method == "request_finished")
        savers = 0
        returned: list[tuple[int, Any]] | None = None
        failures: Failures | None = None
        for bit, finish in finishers:
            answer: Any = _UNSET
            try:
                answer = finish(request, block_ids)
                delay_free, params = answer
            except Exception as exc:
                failures = self._finish_fault(failures, bit.bit_length() - 1, exc, answer, method)
                if isinstance(exc, FinishError):  # a nested stack: some of its children may be saving
                    if exc.delay_free:
                        savers |= bit
                    if exc.kv_transfer_params:
                        item = (bit.bit_length() - 1, exc.kv_transfer_params)
                        returned = [item] if returned is None else [*returned, item]
            else:
                if delay_free:
                    savers |= bit
                if params:
                    item = (bit.bit_length() - 1, params)
                    returned = [item] if returned is None else [*returned, item]
        if savers:
            if awaited is None:
                self._savers.append((request.request_id, savers))
            else:
                self._folds.append((request.request_id, awaited, savers))
        held = savers != 0 and awaited is None
        if self._plans:
            self._plans.pop(request.request_id, None)
        if returned is None and failures is None:
            return held, None
        merged: KVTransferParams | None = None
        if returned is not None:
            clashes: Failures = []
            merged = self._merge_params(returned, method, clashes)
            if clashes:
                failures = sorted([*(failures or []), *clashes], key=lambda item: item[0])
        if failures:
            raise self._finish_failed(request.request_id, method, failures, savers, held, merged)
        return held, merged

    def _finish_fault(
        self, failures: Failures | None, index: int, exc: Exception, answer: object, method: str
    ) -> Failures:
        """Record a child's failure: its own exception, or capkv's verdict on an answer that is not a pair."""
        if answer is not _UNSET and isinstance(exc, (TypeError, ValueError)):
            exc = bad_answer(self._names[index], method, answer, "a (delay_free, kv_transfer_params) pair")
        return [(index, exc)] if failures is None else [*failures, (index, exc)]

    def _merge_params(self, returned: list[tuple[int, Any]], method: str, clashes: Failures) -> KVTransferParams:
        """Merge the children's ``kv_transfer_params``; a key given twice is a conflict (first one wins)."""
        if len(returned) == 1 and isinstance(returned[0][1], dict):
            return dict(cast("KVTransferParams", returned[0][1]))
        merged: KVTransferParams = {}
        owners: dict[str, int] = {}
        for index, params in returned:
            if not isinstance(params, Mapping):
                clashes.append((index, bad_answer(self._names[index], method, params,
                                                  "kv_transfer_params as a dict, or None")))
                continue
            for key, value in cast("Mapping[str, object]", params).items():
                if key in merged:
                    clashes.append((index, ConflictError(
                        f"{self._names[index]}.{method} returned kv_transfer_params key "
                        f"{key!r}, already returned by {self._names[owners[key]]}",
                        connector=self._names[index],
                        method=method,
                        value=key,
                    )))
                    continue
                merged[key] = value
                owners[key] = index
        return merged

    def _finish_failed(
        self, request_id: str, method: str, failures: Failures, savers: int, held: bool,
        merged: KVTransferParams | None,
    ) -> FinishError:
        names = self._names
        detail = "; ".join(f"{names[index]}: {type(exc).__name__}: {exc}" for index, exc in failures)
        saving = ", ".join(names[i] for i in range(len(names)) if savers >> i & 1)
        if held:
            outcome = (f"keep its blocks (delay_free=True): {saving} accepted an asynchronous save, and "
                       "the request is reported in finished_sending once each of them has reported it")
        elif savers:
            outcome = (f"the engine keeps its blocks until its asynchronous load is reported (delay_free=False): "
                       f"{saving} accepted an asynchronous save, and the load is reported in finished_recving "
                       "once it is over and each of them has reported the save")
        else:
            outcome = "no sub-connector is saving it, so its blocks may be freed (delay_free=False)"
        error = FinishError(
            f"{type(self).__name__}.{method}({request_id!r}) failed ({detail}); every other sub-connector "
            f"was still told; {outcome}",
            tuple(exc for _, exc in failures),
            delay_free=held,
            kv_transfer_params=merged,
            connector=", ".join(names[index] for index, _ in failures),
            method=method,
        )
        error.__cause__ = failures[0][1]
        return error

