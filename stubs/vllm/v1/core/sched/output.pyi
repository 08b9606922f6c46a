from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

class SchedulerOutput:
    scheduled_new_reqs: list[Any]
    scheduled_cached_reqs: Any
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None
    kv_connector_metadata: KVConnectorMetadata | None
    # Built by vLLM's scheduler; its many other fields are opaque here. Past the first eight, every
    # parameter is keyword-only here: vLLM 0.33 put encoder_input_updates ninth (positions moved).
    def __init__(
        self,
        scheduled_new_reqs: Any,
        scheduled_cached_reqs: Any,
        num_scheduled_tokens: Any,
        total_num_scheduled_tokens: Any,
        scheduled_spec_decode_tokens: Any,
        scheduled_encoder_inputs: Any,
        finished_req_ids: Any,
        free_encoder_mm_hashes: Any,
        *,
        encoder_input_updates: Any = ...,  # vLLM 0.33
        scheduled_encoder_input_stats: Any = None,
        preempted_req_ids: Any = None,
        has_structured_output_requests: Any = False,
        pending_structured_output_tokens: Any = False,
        num_invalid_spec_tokens: Any = None,
        kv_connector_metadata: Any = None,
        has_sync_kv_loads: Any = False,
        aux_output_connector_metadata: Any = None,
        ec_connector_metadata: Any = None,
        ec_manager_metadata: Any = None,
        new_block_ids_to_zero: Any = None,
        kv_cache_block_copies: Any = None,
        kv_connector_block_state: Any = None,
        num_spec_tokens_to_schedule: Any = 0,
        num_common_prefix_blocks: Any = ...,
        skip_drafts: bool = False,  # vLLM 0.33
    ) -> None: ...
