"""What a stored block's key names: everything that determines its bytes, and nothing else.

A block is stored under a :class:`~capkv.stores.StoreKey` made of

1. the **namespace** (caller-chosen: name the model there) and the **model
   layout** of the block's group — its index, block size, layer names,
   per-layer block shape and dtype — folded into the group's root digest;
2. the **token prefix**: block ``i`` of a group is the digest of its tokens
   chained onto the digest of block ``i - 1``, so a key names the whole prefix
   up to the block's end (each group chains with its own block size);
3. the request's **inputs besides its tokens** that change KV
   (:class:`~capkv.KeyInputs`, following vLLM's rule for its own block
   hashes): the cache salt and the adapter are folded into the request's root
   (so they reach every block, as vLLM's first-block salt does), each block
   folds in the multimodal items it overlaps (their content hash and offset
   from the block's start) and the digest of the prompt embeddings at its
   positions — together (1)-(3) are the :class:`BlockKey` the scheduler side
   plans with: ``(group, digest)``;
4. the **memory layout and shard** of the bytes (the worker's fingerprint:
   dtype, the order and sizes of a block's runs in the registered KV cache,
   and its tensor- and pipeline-parallel rank and size,
   :func:`~capkv.stores._worker.layout_fingerprints`): ``StoreKey.layout``.
   Each worker stores and loads its own shard's values only, and the
   scheduler side offers a block only when every shard's value is there.

Two requests share a key exactly when all of these agree. BLAKE2b from
:mod:`hashlib` and a fixed encoding (``repr`` of tuples of ``str``/``int``/
``bytes``): the same key in every process and on every machine — unlike
``hash()``, or vLLM's own ``request.block_hashes``, which depend on the
engine's hash settings (``prefix_caching_hash_algo``; a random per-process
seed for the ``xxhash`` ones unless ``PYTHONHASHSEED`` is set) and on its hash
block size, so capkv derives its keys from the same *inputs* instead.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NamedTuple

from capkv._homes import publish
from capkv.contracts._key_inputs import KeyInputs
from capkv.contracts._spec import KVSpec
from capkv.errors import ContractError

__all__ = ["DIGEST_SIZE", "BlockKey", "PrefixHasher", "RequestKeys"]

DIGEST_SIZE = 16
"""Bytes per block digest (128 bits)."""


class BlockKey(NamedTuple):
    """Where a stored block belongs: its group and the digest of its token prefix (and request inputs)."""

    group: int
    digest: bytes

    @property
    def name(self) -> str:
        """A file-system-safe name, unique per key."""
        return f"g{self.group}-{self.digest.hex()}"


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


class PrefixHasher:
    """Computes block digests for a spec's groups."""

    __slots__ = ("_block_sizes", "_owner", "_roots")

    def __init__(self, spec: KVSpec, namespace: str = "", *, owner: str) -> None:
        self._owner = owner
        self._block_sizes = tuple(group.block_size or 0 for group in spec.groups)
        self._roots = tuple(
            _digest(repr((
                "capkv.prefix.v1", namespace, index, group.block_size, group.layer_names,
                _without(group.kv_shape, spec.block_dim), str(spec.dtype),
            )).encode())
            for index, group in enumerate(spec.groups)
        )

    def block_size(self, group: int) -> int:
        return self._block_sizes[group]

    def root(self, group: int, inputs: KeyInputs | None = None) -> bytes:
        """The digest a request's chain of ``group`` starts from: the group's root, with the request's
        salt and adapter folded in."""
        root = self._roots[group]
        if inputs is None or not (inputs.cache_salt or inputs.adapter):
            return root
        return _digest(root + repr(("request", inputs.cache_salt or None, inputs.adapter or None)).encode())

    def extend(
        self,
        group: int,
        tokens: Sequence[int],
        digests: list[bytes],
        count: int,
        *,
        method: str,
        inputs: KeyInputs | None = None,
    ) -> None:
        """Append digests to ``digests`` (group ``group``'s chain over ``tokens``) until it has ``count``."""
        size = self._block_sizes[group]
        previous = digests[-1] if digests else self.root(group, inputs)
        for index in range(len(digests), count):
            start, end = index * size, (index + 1) * size
            chunk = tokens[start:end]
            try:
                packed = struct.pack(f"<{size}q", *chunk)
            except struct.error as exc:
                raise ContractError(
                    f"{self._owner}.{method}: tokens {list(chunk)!r} of block {index} (group {group}) "
                    f"are not 64-bit integer token ids ({exc})",
                    connector=self._owner, method=method, group=group, value=list(chunk),
                ) from exc
            if inputs is not None:
                packed += _block_inputs(inputs, start, end)
            previous = _digest(previous + packed)
            digests.append(previous)


def _block_inputs(inputs: KeyInputs, start: int, end: int) -> bytes:
    """What of the request's inputs feeds positions ``[start, end)`` (empty when nothing does)."""
    parts: list[tuple[object, ...]] = [
        ("mm", item.identifier, item.offset - start, item.length)
        for item in inputs.multimodal
        if item.offset < end and item.offset + item.length > start
    ]
    if start < len(inputs.prompt_embeds):
        parts.append(("embeds", _digest(b"".join(inputs.prompt_embeds[start:end]))))
    # A block's tokens are a fixed number of bytes, so anything appended makes another digest input.
    return repr(tuple(parts)).encode() if parts else b""


class RequestKeys:
    """One request's block keys per group, computed lazily and extended as its tokens grow."""

    __slots__ = ("_chains", "_hasher", "_inputs", "_tokens")

    def __init__(self, hasher: PrefixHasher, tokens: Sequence[int], inputs: KeyInputs | None = None) -> None:
        self._hasher = hasher
        self._tokens = tokens
        self._inputs = inputs
        self._chains: dict[int, list[bytes]] = {}

    def update(self, tokens: Sequence[int]) -> None:
        """The request's current tokens (a prefix of them may already be hashed)."""
        self._tokens = tokens

    def key(self, group: int, index: int, *, method: str) -> BlockKey:
        """The key of block ``index`` of ``group``; the block must be full of tokens."""
        chain = self._chains.setdefault(group, [])
        if index >= len(chain):
            self._hasher.extend(group, self._tokens, chain, index + 1, method=method, inputs=self._inputs)
        return BlockKey(group, chain[index])


def _without(shape: tuple[int, ...] | None, dim: int) -> tuple[int, ...] | None:
    return None if shape is None else shape[:dim] + shape[dim + 1 :]


publish(__name__, "capkv.connectors")
