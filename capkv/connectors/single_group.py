"""``SingleGroupOffloadConnector``: a deliberately single-group host-pool connector.

It is the counter-example of capkv's checks: it implements only the
single-group ``request_finished`` (no ``SupportsHMA``), so a type checker
refuses it where an HMA connector is needed, ``MultiConnector`` with it is not
HMA-capable, and :func:`capkv.check_stack` rejects such a stack before serving
when the engine has several KV-cache groups. Should it be driven on several
groups anyway, it raises :class:`~capkv.CapabilityError` instead of serving
group 0 alone. On a one-group model it is a working host-pool cache.
"""

from __future__ import annotations

from capkv.connectors.base import PrefixStoreConnector, require_store_spec
from capkv.connectors.cpu_offload import HostPoolWorker
from capkv.connectors.host_pool import HostPoolIndex
from capkv.contracts.engine import BlockIds, TokenRequest
from capkv.contracts.spec import KVSpec
from capkv.errors import CapabilityError, ConfigError

__all__ = ["SingleGroupOffloadConnector"]


class SingleGroupOffloadConnector(PrefixStoreConnector):
    """A host-pool prefix cache that handles exactly one KV-cache group."""

    def __init__(self, spec: KVSpec, *, capacity_blocks: int, namespace: str = "") -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        if capacity_blocks < 1:
            raise ConfigError(
                f"{name}: capacity_blocks must be at least 1, got {capacity_blocks!r}",
                connector=name, method="__init__", value=capacity_blocks,
            )
        super().__init__(spec, HostPoolIndex(capacity_blocks), HostPoolWorker(spec, capacity_blocks, owner=name), namespace=namespace)

    def get_num_new_matched_tokens(self, request: TokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self._one_group("get_num_new_matched_tokens")
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: TokenRequest, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._one_group("update_state_after_alloc")
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def _one_group(self, method: str) -> None:
        if self.spec.num_groups != 1:
            raise CapabilityError(
                f"{self._name}.{method}: this connector handles one KV-cache group and the engine has "
                f"{self.spec.num_groups}; check_stack rejects such a stack before serving",
                connector=self._name, method=method, group=1, value=self.spec.num_groups,
            )
