"""Stores: the shared layer under capkv's stores, and the contract a backend implements.

A backend only keeps bytes by key; :class:`StoreConnector` does everything else (keys, checked values, saves
as blocks fill, pins, a background writer). Open ``_connector.py`` first; the guide's § 16 writes a backend.
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
