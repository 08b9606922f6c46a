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
two stores interoperate in a ``MultiConnector`` stack, and save each block in
the step that fills it (read from the scheduler output by vLLM's field names).
"""

from typing import TYPE_CHECKING

from capkv.connectors._base import PrefixStoreConnector
from capkv.connectors._cpu_offload import CPUOffloadConnector, HostPoolConnector
from capkv.connectors._file_store import FileStoreConnector
from capkv.connectors._hits import GroupGeometry, longest_hit
from capkv.connectors._keys import BlockKey, PrefixHasher
from capkv.connectors._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.connectors._single_group import SingleGroupOffloadConnector

if TYPE_CHECKING:
    from capkv.connectors._redis_store import RedisStoreConnector

__all__ = [
    "BlockKey",
    "BlockMove",
    "CPUOffloadConnector",
    "HostPoolConnector",
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


def __getattr__(name: str) -> object:
    """``RedisStoreConnector`` on first use (PEP 562), so importing the package stays cheap."""
    if name == "RedisStoreConnector":
        from capkv.connectors._redis_store import RedisStoreConnector

        globals()[name] = RedisStoreConnector
        return RedisStoreConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
