"""Mixture weights as integer quotas out of a period: the arithmetic by which a
:class:`~mmpack.Mixture` draws its sources.

Weights are normalized without overflow (:func:`normalize_weights`, scaled by the largest first)
and quantized to integer quotas ``c_k`` out of ``RESOLUTION = 10**6`` draws by largest-remainder
rounding (:func:`quantize_weights`): a positive weight never rounds to 0 (the forced ones are
taken back from quotas > 1, smallest remainder first), then ``c`` and the period are divided by
their gcd, so ``[0.7, 0.3]`` has period 10.  Cost O(K log K).  :func:`chairman_table` builds the
period of Tijdeman's chairman sequence for a quota vector with a checkpoint of prefix counts
every :data:`STRIDE` draws (O(P K); callers cache them): the table every mixture lookup reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mmpack._src.core.validation import check_weights
from mmpack._src.kernels.mixture import build_period

__all__ = ["RESOLUTION", "STRIDE", "chairman_table", "normalize_weights", "quantize_weights"]

RESOLUTION = 10**6
"""Weights are quantized to multiples of ``1 / RESOLUTION``."""

STRIDE = 64
"""The checkpoint stride: draws between two checkpoints of a period (a lookup scans at most this
many)."""


def chairman_table(quotas: tuple[int, ...], period: int) -> tuple[np.ndarray, np.ndarray]:
    """``(seq, ckpt)``, read-only: ``seq`` (uint8, or int32 above 256 sources; (period,)) the
    source of each draw of one period of the chairman sequence of ``quotas`` (summing to
    ``period``), ``ckpt`` (int32, (period // STRIDE + 1, K)) the draws of each source before every
    :data:`STRIDE`-th draw (:func:`mmpack._src.kernels.mixture.build_period`)."""
    c = np.asarray(quotas, dtype=np.int64)
    seq = np.empty(period, dtype=np.uint8 if c.size <= 256 else np.int32)
    ckpt = np.empty((period // STRIDE + 1, c.size), dtype=np.int32)
    build_period(c, period, STRIDE, seq, ckpt)
    seq.flags.writeable = False
    ckpt.flags.writeable = False
    return seq, ckpt


def quantize_weights(
    weights: Sequence[float] | np.ndarray, resolution: int = RESOLUTION
) -> tuple[np.ndarray, int]:
    """Integer quotas out of a period for non-negative weights.

    Parameters
    ----------
    weights : sequence of float, shape (K,)
        Finite, non-negative, not all zero (validated; ``ValueError`` otherwise).
    resolution : int, default RESOLUTION
        Quotas are out of ``resolution`` draws before the gcd reduction.

    Returns
    -------
    quotas : numpy.ndarray, int64, shape (K,)
        ``quotas[k] > 0`` exactly where ``weights[k] > 0``; ``quotas.sum() == period``.
    period : int
        ``resolution`` divided by the gcd of the quotas.
    """
    w = check_weights(weights)
    positive = w > 0  # before normalizing, which may underflow a tiny weight to 0
    w = normalize_weights(w)
    if positive.sum() > resolution:
        raise ValueError(
            f"at most {resolution} sources may have a positive weight, got {int(positive.sum())}"
        )
    raw = w * resolution
    quotas = np.floor(raw).astype(np.int64)
    quotas[positive & (quotas == 0)] = 1
    remainder = raw - quotas
    short = resolution - int(quotas.sum())
    if short > 0:
        order = np.lexsort((np.arange(w.size), -remainder))
        quotas[order[:short]] += 1
    while (
        short < 0
    ):  # the forced ones overshot: take back from quotas > 1, smallest remainder first
        donors = np.flatnonzero(quotas > 1)
        donors = donors[np.lexsort((donors, -quotas[donors], remainder[donors]))][:-short]
        quotas[donors] -= 1
        short += donors.size
    g = math.gcd(*quotas.tolist())
    return quotas // g, resolution // g


def normalize_weights(w: np.ndarray) -> np.ndarray:
    """``w / w.sum()`` without overflow: scaled by the largest weight first (``[1e308, 1e308,
    3e307]`` sums to inf in float64)."""
    w = w / w.max()
    return w / w.sum()
