"""Reference connectors that move real KV for every KV-cache group.

Three stores (host memory, pack files, Redis) are backends under one layer, :mod:`capkv.stores`, so they key
blocks alike and interoperate in a stack; open ``_file_store.py`` first.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.stores._base import PrefixStoreConnector
    from capkv.connectors._cpu_offload import CPUOffloadConnector
    from capkv.connectors._file_store import FileStoreConnector
    from capkv.stores._hits import GroupGeometry, longest_hit
    from capkv.stores._keys import BlockKey, PrefixHasher
    from capkv.stores._metadata import SaveReport, StoreMetadata
    from capkv.connectors._redis_store import RedisStoreConnector
    from capkv.connectors._single_group import SingleGroupOffloadConnector

__all__ = [
    "BlockKey",
    "CPUOffloadConnector",
    "FileStoreConnector",
    "GroupGeometry",
    "PrefixHasher",
    "PrefixStoreConnector",
    "RedisStoreConnector",
    "SaveReport",
    "SingleGroupOffloadConnector",
    "StoreMetadata",
    "longest_hit",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.stores._base": ["PrefixStoreConnector"],
            "capkv.connectors._cpu_offload": ["CPUOffloadConnector"],
            "capkv.connectors._file_store": ["FileStoreConnector"],
            "capkv.stores._hits": ["GroupGeometry", "longest_hit"],
            "capkv.stores._keys": ["BlockKey", "PrefixHasher"],
            "capkv.stores._metadata": ["SaveReport", "StoreMetadata"],
            "capkv.connectors._redis_store": ["RedisStoreConnector"],
            "capkv.connectors._single_group": ["SingleGroupOffloadConnector"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
