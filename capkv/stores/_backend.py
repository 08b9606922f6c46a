"""The backend contract: what a store needs of the place its blocks live.

A backend only stores and returns bytes, and says only what it is sure of; the shared layer does everything
else (guide § 16; docs/internals.md, "Stores"). Every backend declares ``slow``
(a member of the contract): whether its loads run on the store's reader thread.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from capkv._homes import publish
from capkv.errors import ConfigError
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
    """Where a store's values live: batched ``contains``/``get``/``put``/``delete``, sure or a miss, and
    whether its reads are ``slow``."""

    if TYPE_CHECKING:  # run-time checks (isinstance, dev mode) accept a backend without it until capkv 0.4, warned

        @property
        def slow(self) -> bool:
            """Whether reads take long (a disk, a network): ``True`` loads on the store's reader thread
            (hits answered ``load_async=True``), ``False`` in the engine's step. A class or instance attribute
            (``slow = True``) satisfies it."""
            ...

    def contains(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        """Per key, whether a whole value is stored (``False`` when unsure)."""
        ...

    def get(self, keys: Sequence[StoreKey], /) -> Sequence[bytes | bytearray | memoryview | None]:
        """Per key, the stored value as it was put, or ``None``."""
        ...

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> Sequence[bool]:
        """Store each value under its key (replacing one there); per item, whether it is now stored
        (``True`` only for a value that is: a value dropped yet answered ``True`` is a hit that never loads).

        The memory of a value is the store's and is reused after the call: copy what you keep
        (``bytes(value)``); a backend that keeps the view stores whatever the store writes there next.
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


def reads_slowly(backend: object, owner: str = "") -> bool:
    """Whether ``backend`` declares its reads slow (``slow``, part of the contract).

    A backend without ``slow`` (written before capkv 0.3, or with the name misspelt) loads synchronously,
    with a ``DeprecationWarning`` naming it (capkv 0.4 refuses it); a ``slow`` that is not a ``bool`` is a
    :class:`~capkv.ConfigError`.
    """
    name = f"{owner}: " if owner else ""
    if not hasattr(backend, "slow"):
        warnings.warn(
            f"{name}the backend {type(backend).__name__} does not declare slow (part of the capkv.stores.Backend "
            "contract since capkv 0.3.0): its loads run synchronously, in the engine's step. Set slow = True for "
            "reads that take long (a disk, a network: loads then run on the store's reader thread) or slow = False; "
            "capkv 0.4 refuses a backend without it",
            DeprecationWarning, stacklevel=3,
        )
        return False
    slow: object = getattr(backend, "slow")
    if not isinstance(slow, bool):
        raise ConfigError(
            f"{name}the backend {type(backend).__name__} declares slow = {slow!r}; it must be True or False",
            connector=owner or None, method="__init__", value=slow,
        )
    return slow


publish(__name__)
