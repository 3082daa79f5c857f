"""The MLM selection kernel: one pass over the tokens and their uniform draws.

Replaces eight whole-array numpy temporaries (each a fresh, page-faulting allocation for a
batch-sized array) with one loop; the random draws stay numpy's, so results are unchanged.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit


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


@njit
def mlm_select(
    ids: np.ndarray,
    u: np.ndarray,
    maskable: np.ndarray,
    use_maskable: int,
    excluded: np.ndarray,
    mask_prob: float,
    mask_id: int,
    ignore_index: int,
    out_ids: np.ndarray,
    out_labels: np.ndarray,
    random_pos: np.ndarray,
) -> int:
    """For every position ``t`` (all arrays 1-D, same length; ``excluded`` sorted): a token that
    is maskable, not excluded and has ``u[t] < mask_prob`` is selected (its label is the token);
    ``u < 0.8 p`` becomes ``mask_id``, ``0.8 p <= u < 0.9 p`` is recorded in ``random_pos`` for a
    random replacement, the rest keep their token.  Returns the number of random positions."""
    p8 = 0.8 * mask_prob
    p9 = 0.9 * mask_prob
    n_random = 0
    for t in range(ids.shape[0]):
        tok = ids[t]
        out_ids[t] = tok
        out_labels[t] = ignore_index
        x = u[t]
        if x >= mask_prob or (use_maskable and not maskable[t]) or _contains(excluded, tok):
            continue
        out_labels[t] = tok
        if x < p8:
            out_ids[t] = mask_id
        elif x < p9:
            random_pos[n_random] = t
            n_random += 1
    return n_random
