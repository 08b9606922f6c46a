"""Stores: the shared layer under capkv's stores, and the contract a backend implements.

A *backend* keeps values by key and says only what it is sure of
(:class:`Backend`: batched ``contains``/``get``/``put``/``delete``; optionally
:class:`ReadsInto`, reading into the store's buffers, and :class:`PinningBackend`,
holding what a lookup offered until it is loaded);
:class:`StoreConnector` puts one under a complete, HMA-capable connector: keys
that name everything that determines a block's bytes (:class:`StoreKey`),
self-checking values, saves as blocks fill, pins, a background writer, and the
reports its two sides exchange. capkv's host pool, file store and Redis store
are backends under it; :class:`MemoryBackend` is the smallest one, for tests.
See "Writing a backend" in ``docs/writing-a-connector.md``.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.stores._backend import Backend, PinningBackend, ReadsInto, StoreKey
    from capkv.stores._connector import StoreConnector
    from capkv.stores._memory import MemoryBackend

__all__ = ["Backend", "MemoryBackend", "PinningBackend", "ReadsInto", "StoreConnector", "StoreKey"]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.stores._backend": ["Backend", "PinningBackend", "ReadsInto", "StoreKey"],
            "capkv.stores._connector": ["StoreConnector"],
            "capkv.stores._memory": ["MemoryBackend"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
