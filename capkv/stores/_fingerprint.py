"""A registered KV cache's layout fingerprint: what fixes the meaning of a stored block's bytes.

Two engines share a stored value only when its bytes mean the same to both; the fingerprint says so in
:data:`~capkv.stores._value.LAYOUT_SIZE` bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capkv.contracts._spec import KVSpec
from capkv.stores._keys import framed_digest
from capkv.stores._value import FORMAT_VERSION, LAYOUT_SIZE

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import capkv.transfer._copier

__all__ = ["layout_fingerprints"]


def layout_fingerprints(spec: KVSpec, copier: capkv.transfer._copier.BlockCopier) -> tuple[bytes, ...]:
    """Per group, what fixes the meaning of a stored block's bytes: the dtype, the order and sizes of
    the block's runs in the registered KV cache, and which shard of the model's KV cache they are
    (tensor- and pipeline-parallel rank and size: ``spec.shard``) — and the value format version, so
    values of another layout or format are other keys (capkv/stores/_keys.py says the encoding)."""
    shard = spec.shard
    where = (shard.tp_rank, shard.tp_size, shard.pp_rank, shard.pp_size)
    return tuple(
        framed_digest(("capkv.layout.v3", FORMAT_VERSION, str(spec.dtype), group.signature, where), size=LAYOUT_SIZE)
        for group in copier.layout.groups
    )
