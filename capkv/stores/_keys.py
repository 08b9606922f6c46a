"""Content keys for stored blocks: a chained hash of the token prefix, per group.

Block ``i`` of group ``g`` is keyed by the hash of its tokens chained onto the
key of block ``i - 1``, so a key names the whole prefix up to the block's end:
two requests share a key exactly when they share that prefix. Each group chains
with its own block size from its own root, and the root folds in the group's
layout (layers, per-layer block shape, dtype, block size) and a caller-chosen
namespace (name the model there), so blocks of different models or layouts
never collide in a shared store. BLAKE2b from :mod:`hashlib`: the same key in
every process, unlike ``hash()``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NamedTuple

from capkv._homes import publish
from capkv.contracts._spec import KVSpec
from capkv.errors import ContractError

__all__ = ["DIGEST_SIZE", "BlockKey", "PrefixHasher", "RequestKeys"]

DIGEST_SIZE = 16
"""Bytes per block digest (128 bits)."""


class BlockKey(NamedTuple):
    """Where a stored block belongs: its group and the digest of its token prefix."""

    group: int
    digest: bytes

    @property
    def name(self) -> str:
        """A file-system-safe name, unique per key."""
        return f"g{self.group}-{self.digest.hex()}"


class PrefixHasher:
    """Computes block digests for a spec's groups."""

    __slots__ = ("_block_sizes", "_owner", "_roots")

    def __init__(self, spec: KVSpec, namespace: str = "", *, owner: str) -> None:
        self._owner = owner
        self._block_sizes = tuple(group.block_size or 0 for group in spec.groups)
        self._roots = tuple(
            hashlib.blake2b(
                repr((
                    "capkv.prefix.v1", namespace, index, group.block_size, group.layer_names,
                    _without(group.kv_shape, spec.block_dim), str(spec.dtype),
                )).encode(),
                digest_size=DIGEST_SIZE,
            ).digest()
            for index, group in enumerate(spec.groups)
        )

    def block_size(self, group: int) -> int:
        return self._block_sizes[group]

    def extend(self, group: int, tokens: Sequence[int], digests: list[bytes], count: int, *, method: str) -> None:
        """Append digests to ``digests`` (group ``group``'s chain over ``tokens``) until it has ``count``."""
        size = self._block_sizes[group]
        previous = digests[-1] if digests else self._roots[group]
        for index in range(len(digests), count):
            chunk = tokens[index * size : (index + 1) * size]
            try:
                packed = struct.pack(f"<{size}q", *chunk)
            except struct.error as exc:
                raise ContractError(
                    f"{self._owner}.{method}: tokens {list(chunk)!r} of block {index} (group {group}) "
                    f"are not 64-bit integer token ids ({exc})",
                    connector=self._owner, method=method, group=group, value=list(chunk),
                ) from exc
            previous = hashlib.blake2b(previous + packed, digest_size=DIGEST_SIZE).digest()
            digests.append(previous)


class RequestKeys:
    """One request's block keys per group, computed lazily and extended as its tokens grow."""

    __slots__ = ("_chains", "_hasher", "_tokens")

    def __init__(self, hasher: PrefixHasher, tokens: Sequence[int]) -> None:
        self._hasher = hasher
        self._tokens = tokens
        self._chains: dict[int, list[bytes]] = {}

    def update(self, tokens: Sequence[int]) -> None:
        """The request's current tokens (a prefix of them may already be hashed)."""
        self._tokens = tokens

    def key(self, group: int, index: int, *, method: str) -> BlockKey:
        """The key of block ``index`` of ``group``; the block must be full of tokens."""
        chain = self._chains.setdefault(group, [])
        if index >= len(chain):
            self._hasher.extend(group, self._tokens, chain, index + 1, method=method)
        return BlockKey(group, chain[index])


def _without(shape: tuple[int, ...] | None, dim: int) -> tuple[int, ...] | None:
    return None if shape is None else shape[:dim] + shape[dim + 1 :]


publish(__name__, "capkv.connectors")
