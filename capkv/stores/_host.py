"""The bytes of host tensors as memoryviews, without copying: what backends read into and checksums run over.

A memoryview made from a tensor's address does not keep the tensor alive: whoever holds the view holds the
tensor too.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["dense_rows", "row_memory", "rows_memory"]


def row_memory(rows: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU ``uint8`` tensor (or one row), without copying (keep the tensor alive)."""
    buffer = (ctypes.c_char * rows.numel()).from_address(rows.data_ptr())
    return memoryview(buffer).cast("B")


def dense_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` (2-D), or a copy of it when its rows are not each contiguous and apart."""
    count, width = rows.shape
    if (width > 1 and rows.stride(1) != 1) or (count > 1 and rows.stride(0) < width):
        return rows.contiguous()
    return rows


def rows_memory(rows: torch.Tensor) -> tuple[memoryview, int]:
    """One memoryview over every row of a 2-D ``uint8`` CPU tensor whose rows are contiguous (see
    :func:`dense_rows`), and the distance between rows in it: row ``i`` is
    ``memory[i * stride : i * stride + width]`` (keep the tensor alive)."""
    if dense_rows(rows) is not rows:
        raise ValueError(f"rows of shape {tuple(rows.shape)} and strides {rows.stride()} are not contiguous rows")
    count, width = rows.shape
    stride = int(rows.stride(0)) if count > 1 else width
    span = (count - 1) * stride + width if count and width else 0
    return memoryview((ctypes.c_char * span).from_address(rows.data_ptr())).cast("B"), stride
