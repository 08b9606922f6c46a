"""Reference connectors that move real KV for every KV-cache group.

- :class:`CPUOffloadConnector`: a host block pool with LRU eviction;
- :class:`FileStoreConnector`: one crash-safe file per block in a directory;
- :class:`SingleGroupOffloadConnector`: single-group on purpose, the
  counter-example that type checkers and :func:`capkv.check_stack` reject on
  multi-group models.

All key blocks by group and a chained content hash of the token prefix, so the
two stores interoperate in a ``MultiConnector`` stack.
"""

from capkv.connectors._base import PrefixStoreConnector
from capkv.connectors._cpu_offload import CPUOffloadConnector, HostPoolConnector
from capkv.connectors._file_store import FileStoreConnector
from capkv.connectors._hits import GroupGeometry, longest_hit
from capkv.connectors._keys import BlockKey, PrefixHasher
from capkv.connectors._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.connectors._single_group import SingleGroupOffloadConnector

__all__ = [
    "BlockKey",
    "BlockMove",
    "CPUOffloadConnector",
    "HostPoolConnector",
    "FileStoreConnector",
    "GroupGeometry",
    "PrefixHasher",
    "PrefixStoreConnector",
    "SaveReport",
    "SingleGroupOffloadConnector",
    "StoreMetadata",
    "longest_hit",
]
