"""Numbers every layer agrees on, defined once."""

from __future__ import annotations

__all__ = ["IGNORE_INDEX", "INT32_MAX", "UINT64_LIMIT"]

IGNORE_INDEX = -100
"""Label of a position that takes no loss (PyTorch's ``CrossEntropyLoss`` default)."""

INT32_MAX = 2**31 - 1
"""Largest ``cu_seqlens`` value (FlashAttention takes int32 boundaries)."""

UINT64_LIMIT = 2**64
"""Seeds and epochs are keys in ``[0, UINT64_LIMIT)``."""
