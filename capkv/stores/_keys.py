"""What a stored block's key names: everything that determines its bytes, and nothing else.

Two requests share a key exactly when all of it agrees, by construction (the key's parts and its injective
encoding: docs/internals.md, "What a key names").
"""

from __future__ import annotations

import hashlib
import os
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

    __slots__ = ("_block_sizes", "_owner", "_roots", "_spec", "_namespace")

    def __init__(self, spec: KVSpec, namespace: str = "", *, owner: str) -> None:
        self._owner = owner
        self._spec = spec
        self._namespace = namespace
        self._block_sizes = tuple(group.block_size or 0 for group in spec.groups)
        self._roots = self._rooted(None)

    def _rooted(self, generation: bytes | None) -> tuple[bytes, ...]:
        spec = self._spec
        return tuple(
            framed_digest((
                "capkv.prefix.v2", self._namespace, index, group.block_size, tuple(group.layer_names),
                _without(group.kv_shape, spec.block_dim), str(spec.dtype),
                *(() if generation is None else (generation,)),
            ))
            for index, group in enumerate(spec.groups)
        )

    def reset(self) -> None:
        """A new generation of keys (a cache reset): no digest from now on equals one from before."""
        self._roots = self._rooted(os.urandom(16))

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
