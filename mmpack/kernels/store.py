"""Kernels over the document index (``offsets``)."""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["first_decrease"]


@njit
def first_decrease(offsets: np.ndarray) -> int:
    """Index ``j`` of the first ``offsets[j + 1] < offsets[j]``, or -1 if non-decreasing."""
    for j in range(offsets.shape[0] - 1):
        if offsets[j + 1] < offsets[j]:
            return j
    return -1
