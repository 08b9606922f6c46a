import enum
from collections.abc import Callable, Mapping
from typing import Any

from vllm.v1.utils import ConstantList

class RequestStatus(enum.IntEnum):
    WAITING = ...
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = ...
    WAITING_FOR_REMOTE_KVS = ...
    WAITING_FOR_STREAMING_REQ = ...
    RUNNING = ...
    PREEMPTED = ...
    FINISHED_STOPPED = ...
    FINISHED_LENGTH_CAPPED = ...
    FINISHED_ABORTED = ...
    FINISHED_IGNORED = ...
    FINISHED_ERROR = ...
    FINISHED_REPETITION = ...
    @staticmethod
    def is_finished(status: RequestStatus) -> bool: ...

class Request:
    request_id: str
    status: RequestStatus
    prompt_token_ids: list[int] | None
    num_computed_tokens: int
    all_token_ids: ConstantList[int]
    block_hashes: list[Any]
    kv_transfer_params: dict[str, Any] | None
    cache_salt: str | None
    lora_request: Any
    mm_features: list[Any]
    prompt_embeds: Any
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        sampling_params: Any,
        pooling_params: Any,
        client_index: int = 0,
        arrival_time: float | None = None,
        prompt_embeds: Any = None,
        prompt_is_token_ids: list[bool] | None = None,
        mm_features: list[Any] | None = None,
        lora_request: Any = None,
        cache_salt: str | None = None,
        priority: int = 0,
        trace_headers: Mapping[str, str] | None = None,
        block_hasher: Callable[[Request], list[Any]] | None = None,
        resumable: bool = False,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        abort_immediately: bool = False,
        kv_hints: Any = None,
    ) -> None: ...
    @property
    def num_tokens(self) -> int: ...
