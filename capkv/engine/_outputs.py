"""What the scheduler hands the worker each step, and what comes back.

The engine's own classes: a connector receives them as opaque objects, exactly like vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from capkv._homes import publish
from capkv.contracts._engine import BlockIds, KVConnectorOutput
from capkv.engine._request import Request

__all__ = [
    "CachedRequestData",
    "ForwardContext",
    "LoadCheck",
    "Mismatch",
    "ModelRunnerOutput",
    "NewRequestData",
    "ScheduledRequest",
    "SchedulerOutput",
]


@dataclass(frozen=True)
class LoadCheck:
    """Positions whose KV a connector loaded, to compare with recomputation before they are used."""

    start: int
    stop: int


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: compute positions ``[start, stop)``."""

    request: Request
    start: int
    stop: int
    block_ids: BlockIds
    load_check: LoadCheck | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class NewRequestData:
    """A request scheduled for the first time (vLLM's name and fields, the ones capkv reads)."""

    req_id: str
    block_ids: BlockIds
    """The whole block table, per group."""
    num_computed_tokens: int
    """Before this step."""


@dataclass(frozen=True)
class CachedRequestData:
    """Requests scheduled before (vLLM's name and fields, the ones capkv reads)."""

    req_ids: list[str]
    resumed_req_ids: set[str]
    """Their ``new_block_ids`` replace the table (this engine never preempts: always empty)."""
    new_block_ids: list[BlockIds | None]
    """Per request, the ids appended to each group's table since it was last scheduled."""
    num_computed_tokens: list[int]
    """Per request, before this step."""


@dataclass
class SchedulerOutput:
    """One step's plan, from the scheduler to the worker."""

    step: int
    scheduled: list[ScheduledRequest]
    finished_req_ids: set[str]
    """Requests that finished since the previous step (``get_finished`` needs them)."""
    fresh_blocks: dict[int, list[int]] = field(default_factory=lambda: dict[int, list[int]]())
    """Blocks newly handed out, per group: poisoned before anything may write them (vLLM zeroes them)."""
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=lambda: list[NewRequestData]())
    scheduled_cached_reqs: CachedRequestData = field(
        default_factory=lambda: CachedRequestData([], set(), [], [])
    )
    kv_connector_metadata: object = None

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: s.stop - s.start for s in self.scheduled}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.stop - s.start for s in self.scheduled)


@dataclass(frozen=True)
class ForwardContext:
    """What ``start_load_kv`` receives: the step being run and the paged tensors it uses."""

    scheduler_output: SchedulerOutput
    layer_names: tuple[str, ...]


@dataclass(frozen=True)
class Mismatch:
    """The first position whose cached KV differs from recomputation."""

    request_id: str
    group: int
    layer: str
    block_id: int
    block_index: int
    """Index of the block in the request's table for the group."""
    position: int
    when: str
    """``"after load"`` or ``"at finish"``."""

    def describe(self) -> str:
        return (
            f"request {self.request_id}, group {self.group}, layer {self.layer}, "
            f"block {self.block_id} (#{self.block_index} of its table), token position {self.position}, "
            f"checked {self.when}"
        )


@dataclass(frozen=True)
class ModelRunnerOutput:
    """The worker's answer for one step."""

    sampled_token_ids: dict[str, int]
    kv_connector_output: KVConnectorOutput
    load_mismatches: list[Mismatch] = field(default_factory=lambda: list[Mismatch]())


publish(__name__, "capkv.testing")
