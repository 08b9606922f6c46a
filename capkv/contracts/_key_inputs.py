"""What a request carries besides its tokens that decides its KV.

Stored KV may be reused only where all of it matches; capkv draws the line where vLLM's prefix cache does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from capkv._homes import publish
from capkv.contracts._arguments import argument_error, require_int
from capkv.contracts._engine import TokenRequest
from capkv.contracts._violation import contract_error

__all__ = ["KeyInputs", "KeyedRequest", "MultimodalItem", "register_key_inputs", "request_key_inputs"]


@dataclass(frozen=True, slots=True)
class MultimodalItem:
    """One multimodal input of a prompt: a hash of its content, and the prompt positions of its placeholders."""

    identifier: str
    """Identifies the item's content (vLLM: ``mm_feature.identifier``, a hash of the processed item)."""
    offset: int
    """The first prompt position of its placeholder tokens."""
    length: int
    """How many positions its placeholders take."""

    def __post_init__(self) -> None:
        owner = "MultimodalItem"
        identifier = cast(object, self.identifier)
        if not isinstance(identifier, str) or not identifier:
            raise argument_error(owner, "identifier", identifier, "a non-empty str (a hash of the item's content)")
        require_int(self.offset, owner, "offset", minimum=0)
        require_int(self.length, owner, "length", minimum=1)


@dataclass(frozen=True, slots=True)
class KeyInputs:
    """A request's inputs besides its tokens that change its KV.

    Two requests with the same tokens share KV only when nothing else that feeds the model differs. vLLM's
    prefix cache draws the line, and capkv follows it (``vllm/v1/core/kv_cache_utils.py``,
    ``generate_block_hash_extra_keys``):

    - ``cache_salt``: a tenant's salt; requests with different salts never share
      (vLLM folds it into the first block, so it reaches every block of the chain);
    - ``adapter``: the LoRA adapter (vLLM: its name and path; re-pointing a name at
      other weights is another adapter);
    - ``multimodal``: per item, a hash of its content and where its placeholder
      tokens sit in the prompt (the placeholder tokens are alike for any image);
    - ``prompt_embeds``: per prompt position fed an embedding instead of a token,
      a digest of that embedding (its token id is a placeholder).

    A request that carries any of these offers them as ``KeyInputs`` — as the ``key_inputs`` attribute
    (:class:`KeyedRequest`: capkv's engine and ``capkv.testing`` do), or through a reader registered for its
    class (:func:`register_key_inputs`). A plain token request has none. Values are checked: a wrong type is
    an :class:`~capkv.errors.ArgumentError` naming the field.
    """

    cache_salt: str | None = None
    """Keeps a tenant's KV apart: requests with other salts (or none) never share it. ``""`` is no salt."""
    adapter: str | None = None
    """Names the adapter's weights (vLLM: its name and path), or ``None`` for the base model."""
    multimodal: tuple[MultimodalItem, ...] = ()
    """The prompt's multimodal items, by position."""
    prompt_embeds: tuple[bytes, ...] = ()
    """A digest per prompt position, from position 0, of the embedding fed there instead of a token."""

    def __post_init__(self) -> None:
        owner = "KeyInputs"
        for name in ("cache_salt", "adapter"):
            value: object = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise argument_error(owner, name, value, "a str or None")
        items = _tuple(self.multimodal, owner, "multimodal", "a tuple of capkv.MultimodalItem")
        for index, item in enumerate(items):
            if not isinstance(item, MultimodalItem):
                raise argument_error(owner, f"multimodal[{index}]", item, "a capkv.MultimodalItem")
        digests = _tuple(self.prompt_embeds, owner, "prompt_embeds", "a tuple of bytes, one digest per position")
        for index, digest in enumerate(digests):
            if not isinstance(digest, bytes) or not digest:
                raise argument_error(owner, f"prompt_embeds[{index}]", digest, "a non-empty bytes digest")
        object.__setattr__(self, "multimodal", items)
        object.__setattr__(self, "prompt_embeds", digests)

    @property
    def empty(self) -> bool:
        """Nothing beyond the tokens: the request's KV is its tokens' KV."""
        return not (self.cache_salt or self.adapter or self.multimodal or self.prompt_embeds)


@runtime_checkable
class KeyedRequest(TokenRequest, Protocol):
    """A token request that says which of its inputs besides its tokens change its KV."""

    @property
    def key_inputs(self) -> KeyInputs | None: ...


KeyInputsReader = Callable[[object], "KeyInputs | None"]

_readers: dict[type, KeyInputsReader] = {}


def register_key_inputs(cls: type, reader: KeyInputsReader) -> None:
    """Read the key inputs of requests of class ``cls`` (and its subclasses) with ``reader``.

    For an engine whose request class capkv does not own: vLLM's, in :mod:`capkv.adapters.vllm`.
    """
    _readers[cls] = reader


def request_key_inputs(request: object, *, connector: str, method: str) -> KeyInputs | None:
    """``request``'s key inputs (``None`` when it has none), checked.

    A ``key_inputs`` that is not a :class:`KeyInputs` is a :class:`~capkv.ContractError` naming the connector,
    the method and the request.
    """
    reader = next((_readers[cls] for cls in type(request).__mro__ if cls in _readers), None)
    value: object = reader(request) if reader is not None else getattr(request, "key_inputs", None)
    if value is None:
        return None
    if not isinstance(value, KeyInputs):
        request_id: object = getattr(request, "request_id", "?")
        raise contract_error(
            connector, method, f"request {request_id!r} key_inputs", value=value,
            problem=f"is a {type(value).__name__}", expected="a capkv.KeyInputs or None (see capkv.KeyedRequest)",
        )
    return None if value.empty else value


def _tuple(value: object, owner: str, name: str, expected: str) -> tuple[object, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise argument_error(owner, name, value, expected)
    return tuple(cast("Sequence[object]", value))


publish(__name__)
