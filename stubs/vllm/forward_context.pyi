from typing import Any

from vllm.v1.attention.backend import AttentionMetadata

class ForwardContext:
    no_compile_layers: dict[str, Any]
    attn_metadata: dict[str, AttentionMetadata] | list[dict[str, AttentionMetadata]]
    # Built by vLLM's model runner; its other fields are opaque here.
    def __init__(
        self,
        no_compile_layers: Any,
        attn_metadata: Any,
        slot_mapping: Any,
        dp_metadata: Any = None,
        cudagraph_runtime_mode: Any = ...,
        batch_descriptor: Any = None,
        ubatch_slices: Any = None,
        is_padding: Any = None,
        skip_compiled: Any = False,
        all_moe_layers: Any = None,
        moe_layer_index: Any = 0,
        additional_kwargs: Any = ...,
    ) -> None: ...
