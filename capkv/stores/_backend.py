"""The backend contract: what a store needs of the place its blocks live.

A backend only stores and returns bytes, and says only what it is sure of; the shared layer does everything
else (guide § 16; docs/internals.md, "Stores").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from capkv._homes import publish
from capkv.stores._keys import BlockKey

__all__ = ["Backend", "PinningBackend", "ReadsInto", "StoreKey"]


@dataclass(frozen=True, slots=True)
class StoreKey:
    """The full physical key of one stored value.

    ``block`` names the logical block — its KV-cache group and the chained
    digest of everything that determines its KV (namespace, model layout,
    token prefix, request inputs; see :mod:`capkv.stores._keys`); ``layout``
    (16 bytes) names how its bytes are laid out and which shard of the KV cache
    they are (tensor- and pipeline-parallel rank and size), so two workers of
    one engine, or engines with other memory layouts, never share a value.
    ``nbytes`` is the value's length, fixed by the layout: a backend may use it
    to tell a whole value from a cut one without reading it.
    """

    block: BlockKey
    layout: bytes
    nbytes: int

    @property
    def group(self) -> int:
        return self.block.group

    @property
    def digest(self) -> bytes:
        return self.block.digest

    @property
    def name(self) -> str:
        """A name unique per key, safe as a file name and as a Redis key: ``<layout>-g<group>-<digest>``."""
        return f"{self.layout.hex()}-g{self.block.group}-{self.block.digest.hex()}"


@runtime_checkable
class Backend(Protocol):
    """Where a store's values live: batched ``contains``/``get``/``put``/``delete``, sure or a miss."""

    def contains(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        """Per key, whether a whole value is stored (``False`` when unsure)."""
        ...

    def get(self, keys: Sequence[StoreKey], /) -> Sequence[bytes | bytearray | memoryview | None]:
        """Per key, the stored value as it was put, or ``None``."""
        ...

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> Sequence[bool]:
        """Store each value under its key (replacing one there); per item, whether it is now stored.

        The memory of a value is the store's and is reused after the call: copy what you keep.
        """
        ...

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        """Forget the values under ``keys`` (absent ones are fine)."""
        ...

    def close(self) -> None:
        """Release connections, files, memory; called once, when the store closes."""
        ...


@runtime_checkable
class ReadsInto(Protocol):
    """An optional fast path: a backend that reads values straight into the store's buffers."""

    def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> Sequence[int | None]:
        """Per key, how many bytes of its value were read into its buffer (``key.nbytes`` long), or
        ``None`` when it is absent or could not be read (a miss). A count other than ``key.nbytes`` (a
        value cut short, or too long for the buffer) makes the shared layer treat the value as damaged."""
        ...


@runtime_checkable
class ReadsIntoParts(Protocol):
    """An optional fast path past :class:`ReadsInto`: a backend that reads each value into several buffers
    in order — the header into the store's, the payload straight into the engine's KV cache, run by run —
    so a load copies its bytes once (a file's ``preadv``)."""

    def get_into_parts(
        self, keys: Sequence[StoreKey], parts: Sequence[Sequence[memoryview]], /,
        *, landed: Callable[[int, int], None] | None = None,
    ) -> Sequence[int | None]:
        """Per key, how many bytes of its value were read into ``parts[i]`` (filled in order, ``key.nbytes``
        in all), or ``None`` (a miss), as :meth:`ReadsInto.get_into` answers. ``landed(i, count)`` is
        called as each value arrives, before the next read: the caller checks it while its bytes are
        still in the CPU's cache (a read straight into memory leaves them there, a pass after the last
        read finds them evicted — three times slower on the file store's loads)."""
        ...


@runtime_checkable
class PinningBackend(Protocol):
    """An optional capability: a backend that can keep values from being evicted while a load is planned."""

    def pin(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        """Per key, whether it is stored and now kept until :meth:`unpin`."""
        ...

    def unpin(self, keys: Sequence[StoreKey], /) -> None: ...


def reads_slowly(backend: object) -> bool:
    """Whether ``backend`` declares its reads slow (``slow = True``): only ``True`` itself counts, so
    a backend that says nothing, or something else, keeps the synchronous loads."""
    return getattr(backend, "slow", False) is True


publish(__name__)
