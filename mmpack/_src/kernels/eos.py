"""Kernels over flat token arrays: finding document separators."""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["find_eos"]


@njit
def find_eos(tokens: np.ndarray, eos: int, base: int, out: np.ndarray) -> int:
    """Write ``base + i`` for every ``tokens[i] == eos`` into ``out`` (in order); return the count.

    The caller allocates ``out`` (int64) with ``out.shape[0] >= tokens.shape[0]`` so no write can
    fall outside it, and passes an ``eos`` that fits ``tokens.dtype``.
    """
    n = 0
    for i in range(tokens.shape[0]):
        if tokens[i] == eos:
            out[n] = base + i
            n += 1
    return n
