"""The MLM corruption kernel: one call per batch of rows, in place, with counter-based draws.

Every random number is a splitmix64 hash of the row's key and the token position, so a row's
corruption is a pure function of its key (see :mod:`mmpack._src.packing.masking` for the rule).

Per row the kernel runs branch-free passes that LLVM vectorises (hashes; "not selectable" flags
from the mask and one compare per excluded id, or a bit table / binary search when there are more
than 16; labels and masks as selects), then the random replacements behind one rarely taken
branch (a single unsigned compare: LLVM splits ``a & b`` of bools into unpredictable jumps).
The draw ``u = (h >> 11) * 2**-53`` is compared as the integer ``h >> 11`` against
``ceil(p * 2**53)``: the same test, exactly (tests/packing/test_masking.py).

Cost: O(tokens) per batch; ``python -m benchmarks.bench_packed --quick`` prints the mlm rows
(figures in ``docs/benchmarks.md``).
"""

from __future__ import annotations

import math

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["mix64", "mlm_hashed_rows", "mlm_indexed_rows", "sample_key", "sample_keys"]


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
_LINEAR_MAX = 16  # up to this many excluded ids: one compare each, else a bit table
_MAX_WORDS = 1 << 14  # the bit table spans at most 2**20 ids (128 KiB), else a binary search


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
def _allowed_id(rank: int, excluded: np.ndarray) -> int:
    """The ``rank``-th id not excluded: ``rank`` plus the number of ``j`` with
    ``excluded[j] - j <= rank`` (``excluded`` sorted and unique, so that is non-decreasing)."""
    lo, hi = 0, excluded.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if excluded[mid] - mid <= rank:
            lo = mid + 1
        else:
            hi = mid
    return rank + lo


@njit
def _excluded_bits(excluded: np.ndarray, max_words: int) -> np.ndarray:
    """A bitset of ``excluded`` (sorted, non-empty) relative to ``excluded[0]``: bit ``j`` of
    word ``w`` set iff ``excluded[0] + 64 w + j`` is excluded; empty when it would take more
    than ``max_words`` words (the caller then searches ``excluded``)."""
    base = excluded[0]
    n_words = (excluded[excluded.shape[0] - 1] - base) // 64 + 1
    if n_words > max_words:
        return np.zeros(0, dtype=np.uint64)
    bits = np.zeros(n_words, dtype=np.uint64)
    for e in excluded:
        off = e - base
        bits[off >> 6] |= np.uint64(1) << np.uint64(off & 63)
    return bits


@njit
def _threshold(p: float) -> np.uint64:
    """The least integer ``m`` with ``m * 2**-53 >= p`` for ``p`` in ``[0, 1]``: so for a 53-bit
    ``m``, ``m < _threshold(p)`` iff ``m * 2**-53 < p``, exactly (``p * 2**53`` is exact)."""
    return np.uint64(math.ceil(p * 9007199254740992.0))


@njit
def _flag_unselectable(
    row: np.ndarray, can: np.ndarray, excluded: np.ndarray, bits: np.ndarray, out: np.ndarray
) -> None:
    """``out[t] = can[t] == 0 or row[t] in excluded``: one vectorised compare per excluded id
    when they are few, else a lookup in ``bits`` (:func:`_excluded_bits`; empty: a search)."""
    n = row.shape[0]
    for t in range(n):
        out[t] = can[t] == 0
    n_ex = excluded.shape[0]
    if n_ex <= _LINEAR_MAX:
        for e in excluded:
            for t in range(n):
                out[t] |= row[t] == e
    elif bits.shape[0] == 0:
        for t in range(n):
            out[t] |= _contains(excluded, row[t])
    else:
        base = excluded[0]
        span = bits.shape[0] * 64
        for t in range(n):
            off = np.int64(row[t]) - base
            if 0 <= off < span:
                out[t] |= (bits[off >> 6] >> np.uint64(off & 63)) & np.uint64(1) == np.uint64(1)


@njit
def mlm_hashed_rows(
    ids: np.ndarray,
    maskable: np.ndarray,
    keys: np.ndarray,
    excluded: np.ndarray,
    n_allowed: int,
    mask_prob: float,
    mask_id: int,
    ignore_index: int,
    labels: np.ndarray,
) -> None:
    """Corrupt each row ``r`` of ``ids`` (k, L) in place and write its ``labels``.

    Position ``t`` draws ``u = (mix64(keys[r] + (t + 1) * golden) >> 11) * 2**-53``; it is
    selected when ``u < mask_prob``, ``maskable[r, t] != 0`` and ``ids[r, t]`` is not in
    ``excluded`` (int64, sorted, unique); a selected token becomes ``mask_id`` when
    ``u < 0.8 mask_prob``, else the allowed id of rank ``floor(u2 * n_allowed)`` (``u2`` from
    ``mix64(h ^ replace)``) when ``u < 0.9 mask_prob``, else stays.  Branch-free passes per
    row, then the random replacements behind one branch taken for ~0.1 p of the tokens (see the
    module docstring).
    """
    t_sel = _threshold(mask_prob)
    t_mask = _threshold(0.8 * mask_prob)
    t_rand = _threshold(0.9 * mask_prob)
    bits = np.zeros(0, dtype=np.uint64)
    if excluded.shape[0] > _LINEAR_MAX:
        bits = _excluded_bits(excluded, _MAX_WORDS)
    length = ids.shape[1]
    hs = np.empty(length, dtype=np.uint64)
    off = np.empty(length, dtype=np.bool_)  # not selectable: padding or an excluded id
    width = t_rand - t_mask  # 0.9 p >= 0.8 p in floating point too
    for r in range(ids.shape[0]):
        row = ids[r]
        lab = labels[r]
        key = keys[r]
        for t in range(length):
            hs[t] = mix64(key + np.uint64(t + 1) * _GOLDEN)
        _flag_unselectable(row, maskable[r], excluded, bits, off)
        for t in range(length):
            m = hs[t] >> np.uint64(11)
            tok = row[t]
            sel = (m < t_sel) & (not off[t])
            lab[t] = tok if sel else ignore_index
            row[t] = mask_id if sel & (m < t_mask) else tok
        for t in range(length):  # one rarely taken branch: t_mask <= m < t_rand (wraps)
            if (hs[t] >> np.uint64(11)) - t_mask < width and not off[t]:
                h2 = mix64(hs[t] ^ _REPLACE)
                rank = int(float(h2 >> np.uint64(11)) * _INV53 * n_allowed)
                row[t] = _allowed_id(min(rank, n_allowed - 1), excluded)


@njit
def sample_keys(seed: np.uint64, epoch: np.uint64, indices: np.ndarray, out: np.ndarray) -> None:
    """:func:`sample_key` for every index."""
    for r in range(indices.shape[0]):
        out[r] = sample_key(seed, epoch, indices[r])


@njit
def mlm_indexed_rows(
    ids: np.ndarray,
    maskable: np.ndarray,
    seed: np.uint64,
    epoch: np.uint64,
    indices: np.ndarray,
    excluded: np.ndarray,
    n_allowed: int,
    mask_prob: float,
    mask_id: int,
    ignore_index: int,
    labels: np.ndarray,
) -> None:
    """:func:`mlm_hashed_rows` with the keys of samples ``indices`` (int64, (k,)) under
    (``seed``, ``epoch``): one call instead of two on the single-sample path."""
    keys = np.empty(indices.shape[0], dtype=np.uint64)
    sample_keys(seed, epoch, indices, keys)
    mlm_hashed_rows(
        ids, maskable, keys, excluded, n_allowed, mask_prob, mask_id, ignore_index, labels
    )
