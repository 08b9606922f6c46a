"""Block copy ops: paged per-layer KV tensors <-> host rows, for every KV-cache group."""

from capkv.transfer.copier import BlockCopier
from capkv.transfer.handle import CopyHandle, CudaEventCopy, FinishedCopy
from capkv.transfer.layout import GroupRuns, KVLayout, spec_block_nbytes
from capkv.transfer.runs import LayerRuns, layer_runs

__all__ = [
    "BlockCopier",
    "CopyHandle",
    "CudaEventCopy",
    "FinishedCopy",
    "GroupRuns",
    "KVLayout",
    "LayerRuns",
    "layer_runs",
    "spec_block_nbytes",
]
