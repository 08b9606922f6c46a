"""A step's loads, chunk by chunk: read into reused host rows, check while hot, scatter.

Every backend's loads take this one path, so a damaged value never reaches the KV cache as KV, and a load
passes over the bytes as often as a plain read (docs/internals.md, "Loads").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from capkv.engine._diagnosis import explain
from capkv.errors import CapkvError, ContractError
from capkv.stores._backend import Backend, ReadsInto, ReadsIntoParts, StoreKey
from capkv.stores._causes import backend_fault
from capkv.stores._keys import BlockKey
from capkv.stores._metadata import BlockMove
from capkv.stores._staging import StagingRing
from capkv.stores._value import HEADER_SIZE, ValueCheck, check_bytes, check_memory, check_part, why_damaged
from capkv.stores._write_guard import WriteGuard

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import capkv.transfer._copier
    import capkv.transfer._handle

__all__ = ["Chunk", "LoadOutcome", "check_answers", "load_chunks", "plan_chunks"]

_EMPTY = memoryview(b"")


class Chunk:
    """Blocks of one group loaded together: engine block ids (distinct), their keys, their requests."""

    __slots__ = ("block_ids", "group", "keys", "requests")

    def __init__(self, group: int) -> None:
        self.group = group
        self.block_ids: list[int] = []
        self.keys: list[StoreKey] = []
        self.requests: list[str] = []


class LoadOutcome:
    """What a step's loads did: per group the blocks that failed, the requests they belong to, the
    values to delete (damaged), the values lost (damaged or absent), what a backend raised, the first
    failure's cause in words, and counts."""

    __slots__ = (
        "cause", "damaged", "errors", "failed_requests", "handles", "loaded", "loaded_bytes", "lost", "read_failure",
    )

    def __init__(self) -> None:
        self.errors: dict[int, set[int]] = {}
        self.failed_requests: set[str] = set()
        self.damaged: list[StoreKey] = []
        self.lost: list[StoreKey] = []
        """Damaged or absent: the values the scheduler side must stop offering (``SaveReport.lost``)."""
        self.loaded = 0
        self.loaded_bytes = 0
        self.read_failure: BaseException | None = None
        self.cause: tuple[str, str] | None = None
        """The first value that failed: its kind (``"absent"``, ``"damaged"``) and why, in words."""
        self.handles = cast("list[capkv.transfer._handle.CopyHandle]", [])

    def why(self) -> tuple[str, str]:
        """The kind of the first failure and its cause in words: what was raised (the backend's fault,
        noted with its member), else the first value that failed."""
        if self.read_failure is not None:
            return "raised", explain(self.read_failure)
        return self.cause if self.cause is not None else ("unknown", "no cause recorded")


def plan_chunks(
    loads: Sequence[BlockMove], store_key: Callable[[BlockKey], StoreKey], value_sizes: Sequence[int], ring: StagingRing
) -> list[Chunk]:
    """The step's loads as chunks: per group in the order the moves list them, each at most a ring
    chunk (one value at least), never one engine block twice in a chunk (one scatter call)."""
    chunks: list[Chunk] = []
    current: dict[int, tuple[Chunk, set[int], int]] = {}
    for move in loads:
        group = move.group
        entry = current.get(group)
        for block_id, key in zip(move.block_ids, move.keys, strict=True):
            if entry is None or len(entry[0].keys) == entry[2] or block_id in entry[1]:
                entry = (Chunk(group), set[int](), ring.rows_per_chunk(value_sizes[group]))
                current[group] = entry
                chunks.append(entry[0])
            chunk = entry[0]
            entry[1].add(block_id)
            chunk.block_ids.append(block_id)
            chunk.keys.append(store_key(key))
            chunk.requests.append(move.request_id)
    return chunks


def load_chunks(
    chunks: Sequence[Chunk], backend: Backend, copier: capkv.transfer._copier.BlockCopier, ring: StagingRing,
    *, owner: str, guard: WriteGuard | None = None,
) -> LoadOutcome:
    """Read, check and scatter ``chunks``; the scatters' handles are in the outcome (order the engine's
    stream after them). A backend that raises fails every block not read yet (kept in the outcome).
    Every write into the KV cache goes through ``guard`` (a background load's, which may be given up:
    :mod:`capkv.stores._write_guard`)."""
    outcome = LoadOutcome()
    guard = WriteGuard() if guard is None else guard
    on_cpu = copier.device.type == "cpu"
    in_place = on_cpu and isinstance(backend, ReadsIntoParts)
    reads = _Reads(backend, owner, outcome)
    if in_place:
        with guard.reading():  # the backend reads straight into the engine's blocks
            _load_in_place(chunks, reads, copier, outcome)
        return outcome
    if on_cpu and not isinstance(backend, ReadsInto):
        _load_from_values(chunks, reads, copier, outcome, guard)
        return outcome
    for chunk in chunks:
        size = HEADER_SIZE + copier.block_nbytes(chunk.group)
        count = len(chunk.keys)
        rows, memory = ring.take(count, size)
        lengths = reads.next(chunk, memory, size)
        results = check_memory(memory, size, chunk.keys, lengths)
        good = [index for index, result in enumerate(results) if result is ValueCheck.OK]
        if len(good) != count:
            _tally_failures(chunk, results, outcome, lambda i: why_damaged(
                chunk.keys[i], lengths[i], memory[i * size : i * size + HEADER_SIZE]
            ), reads.member)
        if good:
            payloads = (rows if len(good) == count else rows[good])[:, HEADER_SIZE:]
            with guard:
                handle = copier.scatter(chunk.group, [chunk.block_ids[i] for i in good], payloads)
                guard.keep(handle)
            ring.hold(handle)
            outcome.handles.append(handle)
            outcome.loaded += len(good)
            outcome.loaded_bytes += len(good) * (size - HEADER_SIZE)
    return outcome


def _load_in_place(
    chunks: Sequence[Chunk], reads: _Reads, copier: capkv.transfer._copier.BlockCopier, outcome: LoadOutcome
) -> None:
    """Every chunk's values read straight into the engine's blocks in one backend call — one round trip
    per load, as a step's ``get`` is, whatever its groups and size (no staging rows bound it: only the
    headers are read aside) — each checked as it lands, then tallied chunk by chunk."""
    keys: list[StoreKey] = []
    parts: list[list[memoryview]] = []
    for chunk in chunks:
        keys += chunk.keys
        parts += cast("list[list[memoryview]]", copier.block_memory(chunk.group, chunk.block_ids))  # on the CPU
    headers = memoryview(bytearray(len(keys) * HEADER_SIZE))
    results, lengths = _read_checked(reads, keys, headers, parts)
    start = 0
    for chunk in chunks:
        count = len(chunk.keys)
        mine = results[start : start + count]
        good = sum(result is ValueCheck.OK for result in mine)
        if good != count:
            _tally_failures(chunk, mine, outcome, _why_in_place(keys, lengths, headers, start), "get_into_parts")
        start += count
        outcome.loaded += good
        outcome.loaded_bytes += good * copier.block_nbytes(chunk.group)


def _why_in_place(keys: list[StoreKey], lengths: list[int | None], headers: memoryview, first: int) -> Callable[[int], str]:
    """Why value ``first + i`` of an in-place read is damaged (its header aside, its length as read)."""
    def why(index: int) -> str:
        at = first + index
        return why_damaged(keys[at], lengths[at], headers[at * HEADER_SIZE : (at + 1) * HEADER_SIZE])
    return why


def _load_from_values(
    chunks: Sequence[Chunk], reads: _Reads, copier: capkv.transfer._copier.BlockCopier, outcome: LoadOutcome,
    guard: WriteGuard,
) -> None:
    """Each chunk's values from one ``get``, each checked where the backend put it and, if it passes, copied
    straight into its engine block, run by run: one copy per load on a CPU (no host row between). A chunk's
    values are dropped before the next chunk's are gotten."""
    for chunk in chunks:
        places = cast("list[list[memoryview]]", copier.block_memory(chunk.group, chunk.block_ids))  # on the CPU
        results, values = reads.values_checked(chunk)
        good = 0
        with guard:
            for result, value, parts in zip(results, values, places, strict=True):
                if result is not ValueCheck.OK:
                    continue
                start = HEADER_SIZE
                for part in parts:
                    end = start + len(part)
                    part[:] = value[start:end]
                    start = end
                good += 1
        if good != len(results):
            _tally_failures(chunk, results, outcome, lambda i: why_damaged(
                chunk.keys[i], len(values[i]) if results[i] is not ValueCheck.ABSENT else None, values[i]
            ), "get")
        outcome.loaded += good
        outcome.loaded_bytes += good * copier.block_nbytes(chunk.group)
        values.clear()  # the chunk's values go before the next chunk's come


def _read_checked(
    reads: _Reads, keys: list[StoreKey], headers: memoryview, parts: list[list[memoryview]]
) -> tuple[list[ValueCheck], list[int | None]]:
    """Read ``keys`` in place, each value checked as it lands (in the CPU's cache); a value the read's
    final answer reports otherwise (a miss after a later fault, another length) is judged by that answer.
    The verdicts, and the read's answers (the lengths read)."""
    early: dict[int, tuple[int, ValueCheck]] = {}

    def landed(index: int, length: int) -> None:
        early[index] = (length, check_part(headers, index, keys[index], length, parts[index]))

    lengths = reads.into_parts(keys, headers, parts, landed)
    results: list[ValueCheck] = []
    for index, length in enumerate(lengths):
        checked = early.get(index)
        if checked is not None and checked[0] == length:
            results.append(checked[1])
        else:
            results.append(check_part(headers, index, keys[index], length, parts[index]))
    return results, lengths


def _tally_failures(
    chunk: Chunk, results: list[ValueCheck], outcome: LoadOutcome, why: Callable[[int], str], member: str
) -> None:
    """Record ``chunk``'s values that failed; the first failure's cause (``why(index)``, for a damaged value)
    when none is recorded yet."""
    failed = outcome.errors.setdefault(chunk.group, set())
    for index, result in enumerate(results):
        if result is ValueCheck.OK:
            continue
        if outcome.cause is None and outcome.read_failure is None:
            outcome.cause = (
                ("absent", f"a value the store had found was absent when read (the backend's {member} answered "
                 f"none for group {chunk.group}, digest {chunk.keys[index].digest.hex()[:12]})")
                if result is ValueCheck.ABSENT
                else ("damaged", f"a value read back was damaged and is deleted (the backend's {member} answered "
                      f"for group {chunk.group}, digest {chunk.keys[index].digest.hex()[:12]}: {why(index)})")
            )
        failed.add(chunk.block_ids[index])
        outcome.failed_requests.add(chunk.requests[index])
        if outcome.read_failure is None:  # a read that raised says nothing about the value
            outcome.lost.append(chunk.keys[index])
        if result is ValueCheck.DAMAGED:
            outcome.damaged.append(chunk.keys[index])


class _Reads:
    """The backend's side of a load: ``get_into`` per chunk, or one ``get`` per chunk.

    A chunk's values are gotten, checked, copied and dropped before the next chunk's arrive, never the whole
    step's at once: a step of an 8B-shaped model holds hundreds of MiB, which the allocator hands back to the
    OS and takes again, page-faulting, on every load (measured on Redis: 0.21-0.26 GB/s with a step's values
    held, against 0.44-0.68 GB/s for the same GETs dropped value by value)."""

    __slots__ = ("_backend", "_into", "_outcome", "_owner")

    def __init__(self, backend: Backend, owner: str, outcome: LoadOutcome) -> None:
        self._backend = backend
        self._owner = owner
        self._outcome = outcome
        self._into = isinstance(backend, ReadsInto)

    def _got(self, keys: list[StoreKey]) -> list[bytes | bytearray | memoryview | None] | None:
        """The backend's values for ``keys`` (one ``get``), or ``None`` once a read of this step raised (kept in
        the outcome: every key not read yet is a miss)."""
        if self._outcome.read_failure is not None:
            return None
        try:
            values = list(self._backend.get(keys))
            check_answers(self._owner, "get", values, keys)
        except Exception as error:  # noqa: BLE001 (a backend fault is this step's load error)
            self._fail(error, "get")
            return None
        return values

    @property
    def member(self) -> str:
        """The backend's member a load into the store's rows reads with."""
        return "get_into" if self._into else "get"

    def _fail(self, error: Exception, member: str) -> None:
        if isinstance(error, CapkvError):  # capkv's finding about the answer: it says so itself
            error.__traceback__ = None
        else:
            backend_fault(error, member)
        self._outcome.read_failure = error

    def into_parts(
        self, keys: list[StoreKey], headers: memoryview, payloads: list[list[memoryview]],
        landed: Callable[[int, int], None],
    ) -> list[int | None]:
        """Per key, the bytes of its value read into its header row of ``headers`` and then its
        payload's parts, in place (``None``: a miss); ``landed`` hears of each value as it arrives."""
        backend = cast("ReadsIntoParts", self._backend)
        return self._answered(keys, "get_into_parts", lambda: backend.get_into_parts(keys, [
            [headers[i * HEADER_SIZE : (i + 1) * HEADER_SIZE], *payload] for i, payload in enumerate(payloads)
        ], landed=landed))

    def _answered(self, keys: Sequence[StoreKey], method: str, read: Callable[[], Sequence[int | None]]) -> list[int | None]:
        """What ``read`` (one of the backend's reads into buffers) answered per key; every key a miss once
        a read of this step raised (kept in the outcome)."""
        if self._outcome.read_failure is not None:
            return [None] * len(keys)
        try:
            lengths = list(read())
            check_answers(self._owner, method, lengths, keys)
        except Exception as error:  # noqa: BLE001 (a backend fault is this step's load error)
            self._fail(error, method)
            return [None] * len(keys)
        return [length if type(length) is int else None for length in lengths]

    def values_checked(self, chunk: Chunk) -> tuple[list[ValueCheck], list[memoryview]]:
        """Per key of ``chunk``, its value from the chunk's ``get`` judged where it lies, and the value as
        bytes (a miss's: empty); every key absent once a ``get`` of this step raised."""
        keys = chunk.keys
        values = self._got(keys)
        if values is None:
            return [ValueCheck.ABSENT] * len(keys), [_EMPTY] * len(keys)
        views: list[memoryview] = []
        results: list[ValueCheck] = []
        for key, value in zip(keys, values, strict=True):
            if value is None:
                views.append(_EMPTY)
                results.append(ValueCheck.ABSENT)
                continue
            data = memoryview(value).cast("B")
            views.append(data)
            results.append(check_bytes(data, key))
        return results, views

    def next(self, chunk: Chunk, memory: memoryview, size: int) -> list[int | None]:
        """Per key of ``chunk``, how many bytes of its value are in its row of ``memory`` (``None``: a miss)."""
        keys = chunk.keys
        if self._into:
            backend = cast("ReadsInto", self._backend)
            return self._answered(keys, "get_into", lambda: backend.get_into(
                keys, [memory[i * size : (i + 1) * size] for i in range(len(keys))]
            ))
        values = self._got(keys)
        if values is None:
            return [None] * len(keys)
        read: list[int | None] = []
        for index, value in enumerate(values):
            if value is None:
                read.append(None)
                continue
            data = memoryview(value).cast("B")
            count = min(len(data), size)
            start = index * size
            memory[start : start + count] = data[:count]
            read.append(len(data))
        return read


def check_answers(owner: str, method: str, answers: Sequence[object], keys: Sequence[object]) -> None:
    """A backend answered one result per key, or it broke the contract."""
    if len(answers) != len(keys):
        raise ContractError(
            f"{owner}: the backend's {method} answered {len(answers)} results for {len(keys)} keys",
            connector=owner, method=method, value=len(answers),
        )
