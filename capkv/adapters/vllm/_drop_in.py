"""``capkv.vllm.MultiConnector``: vLLM's ``MultiConnector`` configuration, served by capkv's composite.

An operator switches by adding one line (``kv_connector_module_path = "capkv.vllm"``) and changes nothing else
(docs/vllm.md, "The drop-in").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, ClassVar, cast

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector as VllmMultiConnector
from vllm.v1.request import Request

from capkv._homes import publish
from capkv.adapters.vllm._child import wrap
from capkv.adapters.vllm._host import CapkvConnector
from capkv.adapters.vllm._members import complete
from capkv.adapters.vllm._stack import Engine, build_hosted, load_hosted
from capkv.adapters.vllm._visibility import warn_hidden
from capkv.adapters.vllm._vllm_calls import load_plans, wrapped_vllm
from capkv.capabilities._hma import StackNode, explain_not_hma, non_hma_children, supports_hma
from capkv.composite._multi import MultiConnector as CapkvMultiConnector
from capkv.composite._plan import Plan
from capkv.config._hosts import DROP_IN, STACK_KEY, drop_in_stack
from capkv.config._loader import ConfiguredNode
from capkv.contracts._base import KVConnectorBase
from capkv.contracts._engine import BlockIds, KVTransferParams

__all__ = ["MultiConnector"]

_log = logging.getLogger("capkv.vllm")
_said: set[str] = set()


class _Idle(KVConnectorBase[Any]):
    """The stack of an empty ``connectors`` list: vLLM's composite with no child does nothing."""

    capkv_no_leaves: ClassVar[bool] = True
    """Not a leaf: vLLM's composite rules see no child."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: BlockIds, num_external_tokens: int, /) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        return None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def reset_cache(self) -> bool:
        return True  # holds nothing


class MultiConnector(CapkvConnector, SupportsHMA):
    """vLLM's ``MultiConnector`` configuration (``kv_connector_extra_config.connectors``), served by capkv."""

    HOST: ClassVar[str] = DROP_IN
    INHERIT_ROLE: ClassVar[bool] = False  # a child's kv_role is its own entry's, as vLLM builds children

    @classmethod
    def _configured(cls, extra: Mapping[str, Any] | None) -> ConfiguredNode | None:
        """The children as vLLM's composite reads them; ``None`` for an empty list (a composite of none)."""
        connectors: object = None if extra is None else extra.get("connectors")
        if isinstance(connectors, list) and not connectors and STACK_KEY not in (extra or {}):
            return None
        if isinstance(connectors, list) and STACK_KEY not in (extra or {}):
            extra = {**(extra or {}), "connectors": [_nested(entry) for entry in cast("list[object]", connectors)]}
        return load_hosted(drop_in_stack(extra))

    def _check_configured(self, configured: ConfiguredNode | None) -> None:
        """vLLM decided HMA from the children already; say which child turned it off (once), and which
        connector vLLM checks by name sits where it does not look."""
        warn_hidden(DROP_IN, configured, top_level_visible=True)
        if configured is None or supports_hma(configured):
            return
        message = (
            f"{DROP_IN} (capkv.vllm): vLLM's hybrid KV-cache allocator is off for this stack: "
            f"{explain_not_hma(non_hma_children(configured))}; host the stack with CapkvHMAConnector to "
            "require the allocator (a child that cannot serve it is then refused at start)"
        )
        if message not in _said:
            _said.add(message)
            _log.warning("%s", message)

    def _check_built(self, built: object) -> None:
        return None  # vLLM refused a non-HMA child under an explicit HMA already; the group count decides below

    def _build(self, configured: ConfiguredNode | None, engine: Engine) -> object:
        return _Idle() if configured is None else build_hosted(configured, engine)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """Every group's blocks to the stack (one group when vLLM's allocator is off)."""
        return self._finish(request, tuple(list(ids) for ids in block_ids))

    @classmethod
    def all_children_support_hma(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """vLLM's configuration-time rule for the name ``"MultiConnector"``: every configured child
        supports HMA (an empty list: no)."""
        return VllmMultiConnector.all_children_support_hma(kv_transfer_config)

    # ---- vLLM's composite's children -------------------------------------------------------

    @property
    def sub_connectors(self) -> list[object]:
        """The children, in order: vLLM's connectors as vLLM built them, capkv's as capkv built them."""
        built: object = self._built
        if isinstance(built, _Idle):
            return []
        tops: tuple[object, ...] = built.children if isinstance(built, StackNode) else (built,)
        return [_unwrapped(child) for child in tops]

    @property
    def _connectors(self) -> list[object]:
        """vLLM's composite's private list of children (read, and replaced, by vLLM's tests and tools)."""
        return self.sub_connectors

    @_connectors.setter
    def _connectors(self, children: list[object]) -> None:
        """Serve these children from now on, as vLLM's composite would once its list is replaced."""
        parts: list[Any] = [wrap(child) if isinstance(child, KVConnectorBase_V1) else child for child in children]
        self._bind_stack(cast("object", CapkvMultiConnector(parts[0], *parts[1:])) if parts else _Idle())

    @property
    def _all_support_hma(self) -> bool:
        """Whether every child supports HMA (vLLM's composite's private flag)."""
        return not isinstance(self._built, _Idle) and supports_hma(self._built)

    @property
    def _requests_to_connector(self) -> MutableMapping[str, int]:
        """Request id -> the index of the child chosen to load it (vLLM's composite's private map)."""
        return _ChoiceView(self.stack)  # the stack served (under dev mode, the instrumented one)


class _ChoiceView(MutableMapping[str, int]):
    """The composite's load plans as vLLM's ``_requests_to_connector`` (request id -> the index of the
    child loading the hit's first part). Setting an index makes that child load the whole hit."""

    __slots__ = ("_plans",)

    def __init__(self, stack: object) -> None:
        plans = load_plans(stack)
        self._plans: dict[str, Plan] = {} if plans is None else plans

    def __getitem__(self, request_id: str) -> int:
        return self._plans[request_id][1][0][0]

    def __setitem__(self, request_id: str, index: int) -> None:
        held = self._plans.get(request_id)
        if held is None:
            self._plans[request_id] = (0, ((index, 0, _WHOLE_HIT, False),))
            return
        local, slices = held
        tokens = sum(item[2] for item in slices)
        self._plans[request_id] = (local, ((index, local, tokens, any(item[3] for item in slices)),))

    def __delitem__(self, request_id: str) -> None:
        del self._plans[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plans)

    def __len__(self) -> int:
        return len(self._plans)


_WHOLE_HIT = 1 << 62
"""A slice's tokens where they are not known (a choice set from outside): every token of the hit."""


def _nested(entry: object) -> object:
    """In vLLM's shape, a child named ``"MultiConnector"`` is a composite as vLLM builds one (its own
    ``VllmConfig``, its own children): the drop-in again, built and served as one vLLM child."""
    if not isinstance(entry, Mapping):
        return entry
    fields = cast("Mapping[str, object]", entry)
    if fields.get("kv_connector") == DROP_IN and not fields.get("kv_connector_module_path"):
        return {**fields, "kv_connector_module_path": _FRONT}
    return fields


_FRONT = "capkv.vllm"
"""Where vLLM's factory finds the drop-in."""


def _unwrapped(child: object) -> object:
    found = wrapped_vllm(child)
    return child if found is None else found


complete(MultiConnector, own=True)  # every member its own, as vLLM's composite defines them
publish(__name__, "capkv.vllm")
