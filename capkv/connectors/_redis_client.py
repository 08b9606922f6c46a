"""Batched, bounded Redis commands over one server or a Redis Cluster.

A store asks about many blocks at once and must never hang on the network nor fail a step because one server
is gone: one pipeline per server, an answer per key.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, cast

from capkv.errors import ConfigError

__all__ = ["FAILED", "Failed", "RedisKV", "import_redis"]

_SLOTS: Final = 16384
_PIPELINE_COMMANDS: Final = 512
"""Commands per pipeline round trip: large enough to batch, small enough to bound one reply's size."""
_PIPELINE_REPLY_BYTES: Final = 1 << 20
"""Bytes of values per round trip of ``GET``s whose sizes are known (one command at least). Measured with
redis-py and hiredis on loopback, 32 KiB-2 MiB values: up to 1 MiB a trip 0.6-0.75 GB/s, 2 MiB or more of
several values 0.3-0.45 GB/s (512 commands of 32 KiB values: 0.41), whatever the value size."""


class Failed:
    """The answer for a key whose server could not be reached, timed out, or refused the command."""

    _instance: Failed | None = None

    def __new__(cls) -> Failed:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FAILED"


FAILED: Final = Failed()


def import_redis(owner: str) -> ModuleType:
    """The ``redis`` package, or an ImportError that says which extra installs it."""
    try:
        return importlib.import_module("redis")
    except ImportError as exc:
        raise ImportError(
            f"{owner} needs the 'redis' package: pip install 'capkv[redis]'", name="redis"
        ) from exc


@dataclass
class _Node:
    """One server: its client and when it may be contacted again after a failure."""

    address: tuple[str, int]
    client: Any
    down_until: float = 0.0
    failures: int = 0


@dataclass
class _Topology:
    """Which server owns each key: one server, or a cluster's slot table."""

    cluster: bool
    slots: list[_Node] = field(default_factory=lambda: list[_Node]())
    """Owner of each hash slot (cluster only; may miss slots no live node serves)."""
    slot_owner: dict[int, _Node] = field(default_factory=lambda: dict[int, _Node]())


def _round_trips(indices: list[int], sizes: Sequence[int] | None) -> list[list[int]]:
    """``indices`` cut into round trips: :data:`_PIPELINE_COMMANDS` at most, and with ``sizes`` (a reply's bytes
    per index) a trip ends once its replies reach :data:`_PIPELINE_REPLY_BYTES` (one command at least)."""
    if sizes is None:
        return [indices[start : start + _PIPELINE_COMMANDS] for start in range(0, len(indices), _PIPELINE_COMMANDS)]
    trips: list[list[int]] = []
    trip: list[int] = []
    nbytes = 0
    for index in indices:
        if trip and (len(trip) == _PIPELINE_COMMANDS or nbytes + sizes[index] > _PIPELINE_REPLY_BYTES):
            trips.append(trip)
            trip, nbytes = [], 0
        trip.append(index)
        nbytes += sizes[index]
    if trip:
        trips.append(trip)
    return trips


class RedisKV:
    """GET / SET / STRLEN / DEL for many keys at once, per server, never raising for a server fault.

    ``url`` is a ``redis://`` (or ``rediss://``) URL of the server, or of
    cluster nodes — one, or several separated by commas, so the cluster's map
    can be learnt while one of them is down; ``cluster=None`` asks the server
    which one it is.
    Errors that are not the server's fault (a bad URL) raise :class:`~capkv.ConfigError`.

    Every call takes a list of keys, sends one pipeline per server (keys routed by cluster hash slot when the
    server is a cluster), and answers per key: a result, or :data:`FAILED` for the keys whose server could not
    answer. Each socket operation is bounded by ``timeout_s``; a server that failed is not contacted again for
    ``retry_interval_s`` (its keys fail at once), then tried afresh, so a restarted server is picked up by
    itself. The ``redis`` package is imported when a client is made, never before: ``import capkv`` works
    without it.
    """

    def __init__(
        self,
        url: str,
        *,
        owner: str,
        timeout_s: float = 1.0,
        retry_interval_s: float = 1.0,
        cluster: bool | None = None,
    ) -> None:
        self._redis = import_redis(owner)
        self._owner = owner
        if not timeout_s > 0 or not retry_interval_s >= 0:
            raise ConfigError(
                f"{owner}: timeout_s must be positive and retry_interval_s non-negative, "
                f"got {timeout_s!r} and {retry_interval_s!r}",
                connector=owner, method="__init__", value=(timeout_s, retry_interval_s),
            )
        seeds: list[tuple[str, int]] = []
        options: dict[str, Any] = {}
        for part in url.split(","):
            try:
                options = dict(self._redis.connection.parse_url(part.strip()))
            except ValueError as exc:
                raise ConfigError(
                    f"{owner}: bad Redis URL {part.strip()!r} ({exc})", connector=owner, method="__init__", value=url
                ) from exc
            seeds.append((str(options.pop("host", "localhost")), int(options.pop("port", 6379))))
        options.pop("decode_responses", None)  # values are bytes
        self.url = url
        self.timeout_s = timeout_s
        self.retry_interval_s = retry_interval_s
        self._seeds = seeds
        self._seed = seeds[0]
        self._options = options
        self._want_cluster = cluster
        self._nodes: dict[tuple[str, int], _Node] = {}
        self._topology: _Topology | None = None
        self._refresh_after = 0.0
        self._lock = threading.Lock()
        self._closed = False

    # ---- commands ----------------------------------------------------------------------

    def strlen(self, keys: Sequence[bytes]) -> list[int | Failed]:
        """Each key's value length (0 when absent)."""
        return cast("list[int | Failed]", self._batch(keys, lambda i: ("STRLEN", keys[i])))

    def get(self, keys: Sequence[bytes], sizes: Sequence[int] | None = None) -> list[bytes | None | Failed]:
        """Each key's value (``None`` when absent); ``sizes``, the values' expected lengths, keeps each round
        trip's replies near :data:`_PIPELINE_REPLY_BYTES`."""
        return cast("list[bytes | None | Failed]", self._batch(keys, lambda i: ("GET", keys[i]), sizes))

    def set(self, keys: Sequence[bytes], values: Sequence[object]) -> list[bool | Failed]:
        """Store ``values[i]`` (bytes-like) under ``keys[i]``; whether each landed."""
        if len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys, {len(values)} values")
        answers = self._batch(keys, lambda i: ("SET", keys[i], values[i]))
        return [a if isinstance(a, Failed) else a is True or a == b"OK" for a in answers]

    def delete(self, keys: Sequence[bytes]) -> None:
        """Remove ``keys`` where their server answers; others are left."""
        self._batch(keys, lambda i: ("DEL", keys[i]))

    def ping(self) -> bool:
        """Whether every server that owns keys answers now."""
        topology = self._topology_now()
        if topology is None:
            return False
        nodes = {id(n): n for n in topology.slots} if topology.cluster else {0: self._node(self._seed)}
        return bool(nodes) and all(self._call(node, lambda c: c.ping()) is True for node in nodes.values())

    def close(self) -> None:
        """Drop every connection; later calls fail (never raise)."""
        with self._lock:
            self._closed = True
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.client.close()

    # ---- batching ----------------------------------------------------------------------

    def _batch(
        self, keys: Sequence[bytes], command: Callable[[int], tuple[object, ...]], sizes: Sequence[int] | None = None
    ) -> list[object]:
        """``command(i)`` (the words of a command on ``keys[i]``) for every key, pipelined per server, in round
        trips of :data:`_PIPELINE_COMMANDS` (and, with ``sizes``, about :data:`_PIPELINE_REPLY_BYTES` of replies)."""
        answers: list[object] = [FAILED] * len(keys)
        if not keys:
            return answers
        topology = self._topology_now()
        if topology is None:
            return answers
        by_node: dict[tuple[str, int], tuple[_Node, list[int]]] = {}
        key_slot = self._redis.crc.key_slot
        for index, key in enumerate(keys):
            node = topology.slot_owner.get(key_slot(key)) if topology.cluster else self._node(self._seed)
            if node is None:  # no live node serves that slot
                continue
            by_node.setdefault(node.address, (node, []))[1].append(index)
        for node, indices in by_node.values():
            for chunk in _round_trips(indices, sizes):
                replies = self._pipeline(node, [command(i) for i in chunk])
                for index, reply in zip(chunk, replies, strict=True):
                    answers[index] = reply
        return answers

    def _pipeline(self, node: _Node, commands: list[tuple[object, ...]]) -> list[object]:
        """One round trip to ``node``; per command its reply, or :data:`FAILED`."""

        def run(client: Any) -> list[object]:
            pipe = client.pipeline(transaction=False)
            for words in commands:
                pipe.execute_command(*words)
            return cast("list[object]", pipe.execute(raise_on_error=False))

        replies = self._call(node, run)
        if isinstance(replies, Failed):
            return [FAILED] * len(commands)
        answers: list[object] = []
        for reply in replies:
            if isinstance(reply, self._redis.exceptions.ResponseError):
                if isinstance(reply, (self._redis.exceptions.MovedError, self._redis.exceptions.AskError)):
                    self._refresh_after = 0.0  # the cluster moved slots: learn its map again
                answers.append(FAILED)
            else:
                answers.append(reply)
        return answers

    def _call(self, node: _Node, action: Callable[[Any], Any]) -> Any:
        """``action(client)``, or :data:`FAILED` when the node is down or fails now (it is then down for a while)."""
        if self._closed or time.monotonic() < node.down_until:
            return FAILED
        errors = self._redis.exceptions
        try:
            result = action(node.client)
        except (errors.ConnectionError, errors.TimeoutError, OSError):
            node.failures += 1
            node.down_until = time.monotonic() + self.retry_interval_s
            self._refresh_after = 0.0
            try:
                node.client.connection_pool.disconnect()
            except Exception:  # a broken pool is dropped either way
                pass
            return FAILED
        except errors.RedisError:  # the server refused the whole batch (e.g. authentication)
            return FAILED
        node.failures = 0
        return result

    # ---- topology ----------------------------------------------------------------------

    def _node(self, address: tuple[str, int]) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            retry = self._redis.retry.Retry(self._redis.backoff.NoBackoff(), 0)
            client = self._redis.Redis(
                host=address[0], port=address[1], socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s, retry=retry, health_check_interval=0,
                **self._options,
            )
            node = self._nodes[address] = _Node(address, client)
        return node

    def _topology_now(self) -> _Topology | None:
        """The current map of servers, learnt (again) when unknown or stale, at most once per retry interval."""
        with self._lock:
            if self._closed:
                return None
            topology = self._topology
            if topology is not None and not topology.cluster:
                return topology
            if topology is None and self._want_cluster is False:
                self._topology = _Topology(cluster=False)
                return self._topology
            now = time.monotonic()
            if now < self._refresh_after:
                return topology
            self._refresh_after = now + max(self.retry_interval_s, 0.05)
            learnt = self._learn(topology)
            if learnt is not None:
                self._topology = learnt
            return self._topology

    def _learn(self, known: _Topology | None) -> _Topology | None:
        """Ask the seeds, then every known node, for the cluster's slot map (``None``: nobody answered)."""
        candidates = list(dict.fromkeys([*self._seeds, *self._nodes]))
        for address in candidates:
            node = self._node(address)
            if known is None and address in self._seeds:  # first contact: try every seed now
                node.down_until = 0.0
            reply = self._call(node, lambda c: c.execute_command("CLUSTER SLOTS"))  # refused by a standalone server
            if isinstance(reply, Failed):
                if known is None and self._want_cluster is None and self._is_standalone(node):
                    return _Topology(cluster=False)
                continue
            return self._slot_table(reply, address)
        return None

    def _is_standalone(self, node: _Node) -> bool:
        info = self._call(node, lambda c: c.info("cluster"))
        return isinstance(info, dict) and not cast("dict[str, object]", info).get("cluster_enabled")

    def _slot_table(self, reply: Any, asked: tuple[str, int]) -> _Topology:
        topology = _Topology(cluster=True)
        parsed = isinstance(reply, dict)
        entries: list[Any] = list(cast("dict[Any, Any]", reply).items()) if parsed else list(reply)
        for entry in entries:
            if parsed:  # redis-py's parsed form: {(start, end): {"primary": (host, port), ...}}
                (start, end), owner = entry
                host, port = owner["primary"]
            else:  # the raw form: [start, end, [host, port, id], replicas...]
                start, end, (host, port, *_), *_ = entry
            host = host.decode() if isinstance(host, bytes) else str(host)
            node = self._node((host or asked[0], int(port)))
            for slot in range(int(start), int(end) + 1):
                topology.slot_owner[slot] = node
        topology.slots = list({id(n): n for n in topology.slot_owner.values()}.values())
        return topology

    @property
    def servers(self) -> list[tuple[str, int]]:
        """The servers that own keys, as last learnt (empty before the first call)."""
        topology = self._topology
        if topology is None:
            return []
        return [n.address for n in topology.slots] if topology.cluster else [self._seed]

    def server_of(self, key: bytes) -> tuple[str, int] | None:
        """The server ``key`` goes to, as last learnt."""
        topology = self._topology_now()
        if topology is None:
            return None
        if not topology.cluster:
            return self._seed
        node = topology.slot_owner.get(self._redis.crc.key_slot(key))
        return None if node is None else node.address
