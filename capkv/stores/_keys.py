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
   :func:`~capkv.stores._fingerprint.layout_fingerprints`): ``StoreKey.layout``.
   Each worker stores and loads its own shard's values only, and the
   scheduler side offers a block only when every shard's value is there.

Two requests share a key exactly when all of these agree — and only then, by
construction: every digest is BLAKE2b (:mod:`hashlib`) of one structure in one
encoding, :func:`frame`, in which every variable-length part carries its length,
so no two different structures are the same bytes (no split point moves bytes
from one part to the next: positions ``(b"ab", b"c")`` are not ``(b"a", b"bc")``).
The encoding, a value at a time:

- ``None``: ``N``;
- an ``int`` (a token id, a size, an offset: signed 64-bit): ``I`` + 8 bytes, little-endian;
- a ``str``: ``S`` + its UTF-8 length (8 bytes, little-endian) + its UTF-8 bytes;
- ``bytes``: ``B`` + its length (8 bytes) + the bytes;
- a ``tuple`` or ``list``: ``T`` + its item count (8 bytes) + each item's encoding.

Every encoding says where it ends, so a sequence of them reads back one way
only: the encoding is injective. The digests it frames:

- a group's root: ``("capkv.prefix.v2", namespace, group, block size, layer
  names, per-layer block shape, dtype)``;
- a request's root: ``("capkv.request", group root, cache salt, adapter)``
  (``None`` for an absent or empty salt, and for no adapter);
- block ``i``: ``("capkv.block", digest of block i - 1 (block 0: the request's
  root), the block's token ids (packed as signed 64-bit, one ``bytes``),
  ((identifier, offset from the block's start, length) of each multimodal item
  it overlaps, ...), (the prompt-embedding digest of each of its positions that
  has one, ...))``;
- the layout fingerprint (:func:`~capkv.stores._fingerprint.layout_fingerprints`):
  ``("capkv.layout.v3", value format version, dtype, per layer (run bytes,
  inner dims, outer dims), (tp rank, tp size, pp rank, pp size))`` — the value
  format version (:data:`~capkv.stores._value.FORMAT_VERSION`) is in it, so a
  value of another format is another key, never offered to this one.

:class:`~capkv.stores.StoreKey` names join fixed-width hex fields and the
group number with separators (``<layout>-g<group>-<digest>``), injective too.
The same key in every process and on every machine — unlike ``hash()``, or
vLLM's own ``request.block_hashes``, which depend on the engine's hash settings
(``prefix_caching_hash_algo``; a random per-process seed for the ``xxhash`` ones
unless ``PYTHONHASHSEED`` is set) and on its hash block size, so capkv derives
its keys from the same *inputs* instead.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from capkv._homes import publish
from capkv.contracts._arguments import argument_error
from capkv.contracts._key_inputs import KeyInputs
from capkv.contracts._spec import KVSpec
from capkv.errors import ContractError

__all__ = ["DIGEST_SIZE", "BlockKey", "PrefixHasher", "RequestKeys", "frame", "framed_digest"]

DIGEST_SIZE = 16
"""Bytes per block digest (128 bits)."""

Framed = None | int | str | bytes | tuple[object, ...] | list[object]
"""What :func:`frame` encodes: ``None``, ints, strings, bytes, and tuples or lists of them (nested:
their items are checked as they are encoded)."""

_LENGTH = struct.Struct("<Q")
_INT = struct.Struct("<q")


class BlockKey(NamedTuple):
    """Where a stored block belongs: its group and the digest of its token prefix (and request inputs)."""

    group: int
    digest: bytes

    @property
    def name(self) -> str:
        """A file-system-safe name, unique per key."""
        return f"g{self.group}-{self.digest.hex()}"


def frame(value: Framed) -> bytes:
    """``value`` in the one key encoding (the module's docstring): injective, every part length-framed."""
    parts: list[bytes] = []
    _encode(value, parts.append)
    return b"".join(parts)


def framed_digest(value: Framed, *, size: int = DIGEST_SIZE) -> bytes:
    """The ``size``-byte BLAKE2b digest of ``frame(value)`` (fed to the hash a part at a time)."""
    hasher = hashlib.blake2b(digest_size=size)
    _encode(value, hasher.update)
    return hasher.digest()


def _encode(value: object, write: Callable[[bytes], object]) -> None:
    # bool is an int to Python; keys never hold one, and True must not frame as 1.
    if value is None:
        write(b"N")
    elif type(value) is int:
        write(b"I" + _INT.pack(value))
    elif isinstance(value, str):
        data = value.encode()
        write(b"S" + _LENGTH.pack(len(data)))
        write(data)
    elif isinstance(value, bytes):
        write(b"B" + _LENGTH.pack(len(value)))
        write(value)
    elif isinstance(value, (tuple, list)):
        items = cast("Sequence[object]", value)
        write(b"T" + _LENGTH.pack(len(items)))
        for item in items:
            _encode(item, write)
    else:
        raise argument_error("frame", "value", value, "a key part: None, an int, str or bytes, or a tuple or list of them")


class PrefixHasher:
    """Computes block digests for a spec's groups."""

    __slots__ = ("_block_sizes", "_owner", "_roots")

    def __init__(self, spec: KVSpec, namespace: str = "", *, owner: str) -> None:
        self._owner = owner
        self._block_sizes = tuple(group.block_size or 0 for group in spec.groups)
        self._roots = tuple(
            framed_digest((
                "capkv.prefix.v2", namespace, index, group.block_size, tuple(group.layer_names),
                _without(group.kv_shape, spec.block_dim), str(spec.dtype),
            ))
            for index, group in enumerate(spec.groups)
        )

    def block_size(self, group: int) -> int:
        return self._block_sizes[group]

    def root(self, group: int, inputs: KeyInputs | None = None) -> bytes:
        """The digest a request's chain of ``group`` starts from: the group's root, with the request's
        salt and adapter folded in."""
        salt, adapter = (None, None) if inputs is None else (inputs.cache_salt or None, inputs.adapter or None)
        return framed_digest(("capkv.request", self._roots[group], salt, adapter))

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
            items, embeds = _block_inputs(inputs, start, end)
            previous = framed_digest(("capkv.block", previous, packed, items, embeds))
            digests.append(previous)


_NO_INPUTS: tuple[tuple[Framed, ...], tuple[Framed, ...]] = ((), ())


def _block_inputs(inputs: KeyInputs | None, start: int, end: int) -> tuple[tuple[Framed, ...], tuple[Framed, ...]]:
    """What of the request's inputs feeds positions ``[start, end)``: the multimodal items that overlap
    them (identifier, offset from ``start``, length) and the embedding digests at those positions."""
    if inputs is None:
        return _NO_INPUTS
    items: tuple[Framed, ...] = tuple(
        (item.identifier, item.offset - start, item.length)
        for item in inputs.multimodal
        if item.offset < end and item.offset + item.length > start
    )
    return items, tuple(inputs.prompt_embeds[start:end])


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
