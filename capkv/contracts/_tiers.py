"""What a connector declares to be one tier of a stack whose hits add up.

Loading a slice beyond the engine's local hit is safe only for a child written for it, so the capability is
declared, never assumed.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Protocol, runtime_checkable

from capkv.contracts._engine import Request
from capkv.errors import ContractError

__all__ = ["KnowsFailedLoads", "KnowsForeignLoads", "loads_slices"]


def loads_slices(connector: object) -> bool:
    """Whether ``connector`` may be asked for a slice beyond the engine's local hit.

    Read from its ``loads_slices()`` member (class-level where the class declares
    it so, see :func:`~capkv.class_level`); a connector without one does not.
    A composite answers for its children (every one must).

    A :class:`~capkv.MultiConnector` asks its children in order, each beyond what the earlier ones can load: a
    child is asked ``get_num_new_matched_tokens(request, local_hit + loaded_so_far)`` and loads only its own
    slice. That is safe only for a child that reads ``num_computed_tokens`` as "every token before this is in
    the engine's blocks, or will be by the time the request runs" and loads nothing before it. vLLM's own
    connectors do not promise that (several record the argument as the local hit, or load every block without
    a hash), so this is ``False`` unless the connector says ``True``. A child that does not load slices is
    asked at the local hit, as vLLM's ``MultiConnector`` asks it, and loads only when no child before it had a
    hit (the first-hit rule).
    """
    member: object = getattr(connector, "loads_slices", None)
    if member is None:
        return False
    answer: object = member() if callable(member) else member
    if type(answer) is not bool:
        name = type(connector).__name__
        raise ContractError(
            f"{name}.loads_slices returned {type(answer).__name__} {answer!r}; expected a bool",
            connector=name, method="loads_slices", value=answer,
        )
    return answer


@runtime_checkable
class KnowsForeignLoads(Protocol):
    """A connector told which of a request's tokens other children of its stack loaded.

    The optional second half of :func:`loads_slices`: a child that saves what the engine computes learns which
    token ranges other children loaded, and whether the stack wants them saved there too (promotion into a
    faster tier).
    """

    def loaded_elsewhere(self, request: Request, start: int, end: int, save: bool, /) -> None:
        """Tokens ``[start, end)`` of ``request`` were loaded into the engine by another child.

        Called after ``update_state_after_alloc``. ``save``: whether to save them as if the
        engine had computed them (the stack promotes them into this, earlier, tier); when
        ``False``, do not save them — the tier that loaded them has them.
        """
        ...


@runtime_checkable
class KnowsFailedLoads(Protocol):
    """A connector told, on the worker side, which requests' loads failed in the step being run.

    Another child's load of a request failed: the blocks that request computes this step were computed
    on KV it never got, and blocks it was to save from other tiers may not hold what they should. The
    stack says so after every child's ``start_load_kv`` (and layer loads) and before ``wait_for_save``;
    save nothing of these requests this step (the engine recomputes from the failed block on).
    """

    def loads_failed(self, request_ids: AbstractSet[str], /) -> None: ...
