"""Numbers every layer agrees on, defined once."""

from __future__ import annotations

__all__ = ["IGNORE_INDEX", "INT32_MAX", "UINT64_LIMIT", "WINDOW_BLOCKS"]

IGNORE_INDEX = -100
"""Label of a position that takes no loss (PyTorch's ``CrossEntropyLoss`` default)."""

INT32_MAX = 2**31 - 1
"""Largest ``cu_seqlens`` value (FlashAttention takes int32 boundaries)."""

UINT64_LIMIT = 2**64
"""Seeds and epochs are keys in ``[0, UINT64_LIMIT)``."""

WINDOW_BLOCKS = 256
"""Default blocks per window of the block-window order (:mod:`mmpack.sampling.block_order`):
two samples of a window then share a block with probability below ``1 / 256``."""
