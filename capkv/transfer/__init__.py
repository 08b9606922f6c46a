"""Block copy ops: paged per-layer KV tensors <-> host rows, for every KV-cache group."""

from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import CopyHandle, CudaEventCopy, FinishedCopy
from capkv.transfer._layout import GroupRuns, KVLayout, spec_block_nbytes
from capkv.transfer._runs import LayerRuns, layer_runs

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
