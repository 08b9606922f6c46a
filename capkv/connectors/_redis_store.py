"""``RedisStoreConnector``: the store's values in Redis, so engines on many machines share them.

Redis failing is routine, not an error: what cannot be answered is a miss, a load error the engine recomputes,
or a dropped save, and every call is bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar
from urllib.parse import quote

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._redis_client import RedisKV
from capkv.contracts._arguments import argument_error, is_finite_number, require_instance, require_str
from capkv.contracts._spec import KVSpec
from capkv.stores._backend import StoreKey
from capkv.stores._base import require_store_spec
from capkv.stores._connector import StoreConnector
from capkv.stores._keys import BlockKey

__all__ = ["RedisBackend", "RedisKeys", "RedisStoreConnector"]


class RedisKeys:
    """Redis key names: ``capkv:<namespace>:<layout>:g<group>:<digest>``.

    ``<layout>`` is the value's layout fingerprint, all 16 bytes (the order and
    sizes of the bytes a block is stored as, the worker's shard, the value
    format version), so engines whose layouts or formats differ keep separate
    values under one namespace, and
    ``SCAN capkv:<namespace>:*`` finds a model's blocks. The namespace is
    percent-encoded where it would split the name or, in a cluster, pin every
    key to one hash slot (``:``, ``{``, ``}``).
    """

    __slots__ = ("_prefix",)

    def __init__(self, namespace: str) -> None:
        self._prefix = f"capkv:{quote(namespace, safe='')}:"

    def __call__(self, key: StoreKey) -> bytes:
        return f"{self._prefix}{key.layout.hex()}:g{key.group}:{key.digest.hex()}".encode()


class RedisBackend:
    """Redis (a server or a cluster) as a backend: every call one pipeline per server, bounded.

    A lookup is one ``STRLEN`` per value, all of a step's in one pipeline (a value of the wrong length is a
    miss); a step's loads are one pipeline of ``GET``s per server; the writer sends every value sealed since
    its last write in one pipeline of ``SET``s, while the next values are being sealed. Key names carry the
    namespace, the memory layout (with the worker's shard), the group and the block's digest
    (:class:`RedisKeys`).

    A lookup that cannot be answered is a miss, a load that cannot be read is a per-group load error (the
    engine recomputes), a save that cannot be written is dropped and counted (``failed_save_blocks``), and
    every call is bounded by ``timeout_s`` (:mod:`capkv.connectors._redis_client`). Evictions (``maxmemory``)
    are misses.
    """

    slow: bool = True
    """Reads cross a network: the store loads in the background (``load_async``)."""

    def __init__(self, kv: RedisKV, *, namespace: str) -> None:
        self.kv: RedisKV = kv
        self.names: RedisKeys = RedisKeys(namespace)
        self.unanswered: int = 0
        """Keys whose lookup failed (server down or slow): taken as misses."""

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        lengths = self.kv.strlen([self.names(key) for key in keys])
        self.unanswered += sum(1 for length in lengths if not isinstance(length, int))
        return [isinstance(length, int) and length == key.nbytes for key, length in zip(keys, lengths, strict=True)]

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        values = self.kv.get([self.names(key) for key in keys], [key.nbytes for key in keys])
        return [value if isinstance(value, bytes) else None for value in values]

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        landed = self.kv.set([self.names(key) for key, _ in items], [value for _, value in items])
        return [ok is True for ok in landed]

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        self.kv.delete([self.names(key) for key in keys])

    def close(self) -> None:
        self.kv.close()


class RedisStoreConnector(StoreConnector):
    """A prefix cache in Redis for every KV-cache group (HMA-capable), shared by every engine that uses it.

    ``url``: a ``redis://`` URL of a server, or of any node of a Redis Cluster
    (``cluster=None`` asks the server which it is). ``namespace`` separates
    models that share layer names and shapes. ``timeout_s`` bounds every
    network operation; a server that failed is left alone for
    ``retry_interval_s``, then tried again. Needs ``pip install 'capkv[redis]'``.
    Use it as a context manager, or call ``close()`` (``shutdown``) when done.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        url=Option(str, help="redis:// URL of the server, or of cluster nodes separated by ','"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
        timeout_s=Option(float, minimum=0.001, help="bound on every network operation, in seconds"),
        retry_interval_s=Option(float, minimum=0, help="how long a failed server is left alone, in seconds"),
        cluster=Option(bool, help="whether url names a Redis Cluster (default: ask the server)"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""
    default_loads_async: ClassVar[bool | None] = RedisBackend.slow

    def __init__(
        self,
        spec: KVSpec,
        *,
        url: str = "redis://127.0.0.1:6379",
        namespace: str = "",
        timeout_s: float = 1.0,
        retry_interval_s: float = 1.0,
        cluster: bool | None = None,
    ) -> None:
        name = type(self).__name__
        method = "__init__"
        require_store_spec(spec, name)
        require_str(url, name, "url", empty=False, connector=name, method=method)
        require_str(namespace, name, "namespace", connector=name, method=method)
        for parameter, seconds, least in (("timeout_s", timeout_s, "> 0"), ("retry_interval_s", retry_interval_s, ">= 0")):
            if not is_finite_number(seconds) or not (seconds > 0 if least == "> 0" else seconds >= 0):
                raise argument_error(
                    name, parameter, seconds, f"a finite number {least} (seconds)", connector=name, method=method
                )
        require_instance(cluster, (bool, type(None)), name, "cluster", "True, False or None", connector=name, method=method)
        self.kv: RedisKV = RedisKV(
            url, owner=name, timeout_s=timeout_s, retry_interval_s=retry_interval_s, cluster=cluster
        )
        """The batched client (its ``servers``, ``server_of``, ``ping``)."""
        self.url: str = url
        self.redis: RedisBackend = RedisBackend(self.kv, namespace=namespace)
        """The backend: key names and batched commands."""
        super().__init__(spec, self.redis, namespace=namespace, background=True)

    def key_name(self, key: BlockKey) -> bytes:
        """``key``'s Redis key name, in this engine's memory layout (after ``register_kv_caches``)."""
        return self.redis.names(self._store.store_key(key))


publish(__name__)
