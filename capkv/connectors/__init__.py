"""Reference connectors that move real KV for every KV-cache group.

- :class:`CPUOffloadConnector`: a host block pool that evicts prefix chains from the tail;
- :class:`FileStoreConnector`: crash-safe pack files in a directory, bounded, shared by processes;
- :class:`RedisStoreConnector`: blocks in Redis (a server or a cluster), shared
  by every engine that uses it (``pip install 'capkv[redis]'``; imported on
  first use, so ``import capkv.connectors`` never imports ``redis``);
- :class:`SingleGroupOffloadConnector`: single-group on purpose, the
  counter-example that type checkers and :func:`capkv.check_stack` reject on
  multi-group models.

All key blocks by group and a chained content hash of the token prefix, so the
stores interoperate in a ``MultiConnector`` stack, and save each block in
the step that fills it (read from the scheduler output by vLLM's field names).
:class:`PrefixStoreConnector` is their common base, for stores of your own
(:class:`StoreMetadata` and :class:`SaveReport` are what its two sides exchange);
:func:`longest_hit` is the rule for which blocks of each group (sliding windows
included) a prefix hit needs.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.connectors._base import PrefixStoreConnector
    from capkv.connectors._cpu_offload import CPUOffloadConnector
    from capkv.connectors._file_store import FileStoreConnector
    from capkv.connectors._hits import GroupGeometry, longest_hit
    from capkv.connectors._keys import BlockKey, PrefixHasher
    from capkv.connectors._metadata import SaveReport, StoreMetadata
    from capkv.connectors._redis_store import RedisStoreConnector
    from capkv.connectors._single_group import SingleGroupOffloadConnector

    # Deprecated (capkv._deprecations): names that left this front; each read warns with its new home.
    from capkv.connectors._cpu_offload import HostPoolConnector as HostPoolConnector
    from capkv.connectors._metadata import BlockMove as BlockMove

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
            "capkv.connectors._base": ["PrefixStoreConnector"],
            "capkv.connectors._cpu_offload": ["CPUOffloadConnector"],
            "capkv.connectors._file_store": ["FileStoreConnector"],
            "capkv.connectors._hits": ["GroupGeometry", "longest_hit"],
            "capkv.connectors._keys": ["BlockKey", "PrefixHasher"],
            "capkv.connectors._metadata": ["SaveReport", "StoreMetadata"],
            "capkv.connectors._redis_store": ["RedisStoreConnector"],
            "capkv.connectors._single_group": ["SingleGroupOffloadConnector"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
