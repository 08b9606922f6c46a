"""A request as the engine tracks it, and the prefix hash every token position has.

The hash covers everything that feeds a position, so a block loaded for the wrong prefix, tenant, adapter,
image or embedding cannot match.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence

from capkv.contracts._arguments import require_instance, require_int, require_str
from capkv.contracts._key_inputs import KeyInputs, MultimodalItem
from capkv.errors import ConfigError

__all__ = ["Request", "RequestStatus", "chain_hash"]

_ROOT = b"capkv-prefix"


def chain_hash(parent: int | None, token: int, extra: bytes = b"", *, root: bytes = _ROOT) -> int:
    """The prefix hash after ``token`` (and ``extra``, what else feeds its position), given the hash
    of the prefix before it (``None`` at the start, where ``root`` is used).

    ``prefix_hash(p)`` identifies the whole input up to position ``p``: it is a chained hash, so it changes
    when *any* earlier token changes — or any of the request's inputs besides its tokens
    (:class:`~capkv.KeyInputs`: its cache salt and adapter change every position, a multimodal item or a
    prompt embedding the positions it feeds). The engine uses it twice — as the key of a full block in the
    local prefix cache (the hash at the block's last token), and as the seed of the deterministic KV the
    worker writes at position ``p``. (In a real model the salt changes no KV; here it does, so a store that
    hands one tenant's KV to another is caught bit for bit.)
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(root if parent is None else parent.to_bytes(8, "little"))
    digest.update(token.to_bytes(8, "little", signed=True))
    if extra:
        digest.update(extra)
    return int.from_bytes(digest.digest(), "little")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting for an async load"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """A prompt, the tokens "sampled" so far, and how far its KV has been computed.

    Satisfies :class:`capkv.KeyedRequest`: connectors see ``request_id``,
    ``all_token_ids`` (prompt then output tokens), ``num_computed_tokens`` and
    ``key_inputs`` — the inputs besides its tokens that change its KV, given as
    ``cache_salt``, ``adapter``, ``multimodal`` (items within the prompt) and
    ``prompt_embeds`` (a digest per prompt position from 0, at most the prompt's length).
    """

    __slots__ = (
        "request_id",
        "num_prompt_tokens",
        "max_tokens",
        "num_computed_tokens",
        "status",
        "_tokens",
        "_hashes",
        "_inputs",
        "_root",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cache_salt: str | None = None,
        adapter: str | None = None,
        multimodal: Sequence[MultimodalItem] = (),
        prompt_embeds: Sequence[bytes] = (),
    ) -> None:
        require_str(request_id, "Request", "request_id", empty=False)
        require_instance(prompt_token_ids, (list, tuple), "Request", "prompt_token_ids", "a non-empty list of int token ids")
        if not all(type(token) is int and token >= 0 for token in prompt_token_ids):
            for index, token in enumerate(prompt_token_ids):  # name the first bad one
                require_int(token, "Request", f"prompt_token_ids[{index}]", minimum=0)
        require_int(max_tokens, "Request", "max_tokens", minimum=1)
        if not prompt_token_ids:
            raise ConfigError(
                f"request {request_id!r} needs a non-empty prompt and max_tokens >= 1", method="Request", value=request_id
            )
        self.request_id: str = request_id
        self.num_prompt_tokens: int = len(prompt_token_ids)
        self.max_tokens: int = max_tokens
        self.num_computed_tokens: int = 0
        """Positions whose KV is in the paged cache (computed, cached or loaded)."""
        self.status: RequestStatus = RequestStatus.WAITING
        self._tokens = list(prompt_token_ids)
        self._hashes: list[int] = []
        inputs = KeyInputs(cache_salt, adapter, tuple(multimodal), tuple(prompt_embeds))
        beyond = [item for item in inputs.multimodal if item.offset + item.length > self.num_prompt_tokens]
        if beyond or len(inputs.prompt_embeds) > self.num_prompt_tokens:
            raise ConfigError(
                f"request {request_id!r}: its multimodal items and prompt embeddings must lie within its "
                f"{self.num_prompt_tokens} prompt positions",
                method="Request", value=beyond[0] if beyond else len(inputs.prompt_embeds),
            )
        self._inputs = None if inputs.empty else inputs
        self._root = _ROOT if self._inputs is None else _ROOT + repr((inputs.cache_salt or None, inputs.adapter or None)).encode()

    @property
    def key_inputs(self) -> KeyInputs | None:
        """The inputs besides its tokens that change its KV (``None``: none)."""
        return self._inputs

    @property
    def all_token_ids(self) -> Sequence[int]:
        return self._tokens

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def num_output_tokens(self) -> int:
        return len(self._tokens) - self.num_prompt_tokens

    @property
    def is_done(self) -> bool:
        return self.num_output_tokens >= self.max_tokens

    def append_output_token(self, token: int) -> None:
        self._tokens.append(token)

    def prefix_hash(self, position: int) -> int:
        """The hash of ``all_token_ids[0..position]`` (computed lazily, then remembered)."""
        hashes = self._hashes
        while len(hashes) <= position:
            index = len(hashes)
            extra = self._position_inputs(index) if self._inputs is not None else b""
            hashes.append(chain_hash(hashes[-1] if hashes else None, self._tokens[index], extra, root=self._root))
        return hashes[position]

    def _position_inputs(self, position: int) -> bytes:
        """What feeds ``position`` besides its token: the multimodal item covering it, its embedding."""
        inputs = self._inputs
        if inputs is None:
            return b""
        parts: list[tuple[object, ...]] = [
            ("mm", item.identifier, position - item.offset)
            for item in inputs.multimodal
            if item.offset <= position < item.offset + item.length
        ]
        if position < len(inputs.prompt_embeds):
            parts.append(("embeds", inputs.prompt_embeds[position]))
        return repr(parts).encode() if parts else b""

    def prefix_hashes(self, start: int, stop: int) -> list[int]:
        """``prefix_hash(p)`` for ``p`` in ``range(start, stop)``."""
        if stop > start:
            self.prefix_hash(stop - 1)
        return self._hashes[start:stop]

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens})"
