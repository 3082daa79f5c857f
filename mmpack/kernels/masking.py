"""The MLM corruption kernel: one pass over a batch of rows, in place, with counter-based draws.

Every random number is a splitmix64 hash of the row's key and the token position, so a row's
corruption is a pure function of its key (see :mod:`mmpack.views.masking` for the rule).
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["mix64", "mlm_hashed_rows", "sample_key", "sample_keys"]


@njit
def _contains(sorted_ids: np.ndarray, value: int) -> bool:
    lo, hi = 0, sorted_ids.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_ids[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo < sorted_ids.shape[0] and sorted_ids[lo] == value


# ------------------------------------------------------------------------------------------------
# Counter-based MLM: every random number is a hash of (seed, epoch, sample, position), so a packed
# sample's corruption is a pure function of those and a whole batch is one kernel call.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_REPLACE = np.uint64(0xD1B54A32D192ED03)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@njit
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijection on 64 bits with full avalanche."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit
def sample_key(seed: int | np.uint64, epoch: int | np.uint64, index: int) -> np.uint64:
    """The 64-bit key of sample ``index`` in ``epoch`` under ``seed`` (all >= 0)."""
    k = mix64(np.uint64(seed) + _GOLDEN)
    k = mix64(k ^ (np.uint64(epoch) + _GOLDEN))
    return mix64(k ^ (np.uint64(index) + _GOLDEN))


@njit
def _allowed_id(rank: int, shifted: np.ndarray) -> int:
    """The ``rank``-th id not excluded: ``rank`` plus the number of ``shifted`` entries
    (``excluded[j] - j``, non-decreasing) that are <= ``rank``."""
    lo, hi = 0, shifted.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if shifted[mid] <= rank:
            lo = mid + 1
        else:
            hi = mid
    return rank + lo


@njit
def mlm_hashed_rows(
    ids: np.ndarray,
    maskable: np.ndarray,
    keys: np.ndarray,
    excluded: np.ndarray,
    shifted: np.ndarray,
    n_allowed: int,
    mask_prob: float,
    mask_id: int,
    ignore_index: int,
    labels: np.ndarray,
) -> None:
    """Corrupt each row ``r`` of ``ids`` (k, L) in place and write its ``labels``, with the
    uniform draw of position ``t`` taken from ``mix64(keys[r] + (t + 1) * golden)`` (53 bits)
    and a random replacement's rank from a second hash of that value."""
    p8 = 0.8 * mask_prob
    p9 = 0.9 * mask_prob
    for r in range(ids.shape[0]):
        row = ids[r]
        lab = labels[r]
        can = maskable[r]
        key = keys[r]
        for t in range(row.shape[0]):
            lab[t] = ignore_index
            h = mix64(key + np.uint64(t + 1) * _GOLDEN)
            x = float(h >> np.uint64(11)) * _INV53
            tok = row[t]
            if x >= mask_prob or can[t] == 0 or _contains(excluded, tok):
                continue
            lab[t] = tok
            if x < p8:
                row[t] = mask_id
            elif x < p9:
                h2 = mix64(h ^ _REPLACE)
                rank = int(float(h2 >> np.uint64(11)) * _INV53 * n_allowed)
                row[t] = _allowed_id(min(rank, n_allowed - 1), shifted)


@njit
def sample_keys(seed: np.uint64, epoch: np.uint64, indices: np.ndarray, out: np.ndarray) -> None:
    """:func:`sample_key` for every index."""
    for r in range(indices.shape[0]):
        out[r] = sample_key(seed, epoch, indices[r])
