"""Reference connectors that move real KV for every KV-cache group.

- :class:`CPUOffloadConnector`: a host block pool that evicts prefix chains from the tail;
- :class:`FileStoreConnector`: crash-safe pack files in a directory, bounded, shared by processes;
- :class:`RedisStoreConnector`: blocks in Redis (a server or a cluster), shared
  by every engine that uses it (``pip install 'capkv[redis]'``; imported on
  first use, so ``import capkv.connectors`` never imports ``redis``);
- :class:`SingleGroupOffloadConnector`: single-group on purpose, the
  counter-example that type checkers and :func:`capkv.check_stack` reject on
  multi-group models.

The three stores are backends under one shared layer (:mod:`capkv.stores`):
they key blocks alike (group, and a chained digest of everything that
determines a block's KV), so they interoperate in a ``MultiConnector`` stack,
check every value they load, and save each block in the step that fills it
(read from the scheduler output by vLLM's field names). For a store of your
own, write a :class:`capkv.stores.Backend`; :class:`PrefixStoreConnector` is
the common base (:class:`StoreMetadata` and :class:`SaveReport` are what its
two sides exchange); :func:`longest_hit` is the rule for which blocks of each
group (sliding windows included) a prefix hit needs.
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
