"""``SingleGroupOffloadConnector``: a deliberately single-group host-pool connector.

The counter-example capkv's checks exist for: type checkers, ``MultiConnector`` and :func:`capkv.check_stack`
all refuse it where several KV-cache groups are served.
"""

from __future__ import annotations

from capkv._homes import publish
from capkv.connectors._cpu_offload import HostPoolConnector
from capkv.contracts._engine import BlockIds, ComputedTokenRequest
from capkv.errors import CapabilityError

__all__ = ["SingleGroupOffloadConnector"]


class SingleGroupOffloadConnector(HostPoolConnector):
    """A host-pool prefix cache that handles exactly one KV-cache group.

    It implements only the single-group ``request_finished`` (no ``SupportsHMA``), so a type checker refuses
    it where an HMA connector is needed, ``MultiConnector`` with it is not HMA-capable, and
    :func:`capkv.check_stack` rejects such a stack before serving when the engine has several KV-cache groups.
    Should it be driven on several groups anyway, it raises :class:`~capkv.CapabilityError` instead of serving
    group 0 alone. On a one-group model it is a working host-pool cache.
    """

    def get_num_new_matched_tokens(self, request: ComputedTokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self._one_group("get_num_new_matched_tokens")
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: ComputedTokenRequest, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._one_group("update_state_after_alloc")
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def _one_group(self, method: str) -> None:
        if self.spec.num_groups != 1:
            raise CapabilityError(
                f"{self._name}.{method}: this connector handles one KV-cache group and the engine has "
                f"{self.spec.num_groups}; check_stack rejects such a stack before serving",
                connector=self._name, method=method, group=1, value=self.spec.num_groups,
            )


publish(__name__)
