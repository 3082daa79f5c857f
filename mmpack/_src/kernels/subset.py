"""Subsets (:mod:`mmpack._src.store.subset`): their token ranges mapped onto the parent's tokens,
and the parts of ``split``.

:func:`parent_starts`: for each range ``[s, s + n)`` of a subset's flat tokens, the document
holding ``s`` (binary search over the subset's offsets, O(log docs)) and, when the range ends
inside it, the parent position of ``s`` (``s + shift[doc]``).  O(k log docs) for k ranges.
:func:`split_parts`: the part of every document id, by its keyed hash (two rounds of
SplitMix64's finaliser, keyed) against the parts' upper thresholds: O(ids * parts), one pass.
No allocation; the callers validate every input.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = ["parent_starts", "split_parts"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit
def parent_starts(
    offsets: np.ndarray, shift: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray
) -> int:
    """Fill ``out[k] = starts[k] + shift[d]`` (``d``: the document holding token ``starts[k]``,
    the last document for ``starts[k] == offsets[-1]``) for every range that lies in one
    document; return the index of the first range that does not (it continues into the next
    document), or -1.

    Parameters
    ----------
    offsets : int64, shape (docs + 1,), docs >= 1, non-decreasing from 0
    shift : int64, shape (docs,)
    starts, lengths : int64, shape (k,), ``0 <= starts``, ``starts + lengths <= offsets[-1]``
    out : int64, shape (k,), written
    """
    last = offsets.shape[0] - 2
    for k in range(starts.shape[0]):
        s = starts[k]
        lo, hi = 0, last  # the largest d in [0, last] with offsets[d] <= s
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if offsets[mid] <= s:
                lo = mid
            else:
                hi = mid - 1
        if s + lengths[k] > offsets[lo + 1]:
            return k
        out[k] = s + shift[lo]
    return -1


@njit
def split_parts(ids: np.ndarray, keys: np.ndarray, thresholds: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the first part ``p`` with ``h(ids[i]) <= thresholds[p]``, where ``h(d)`` is
    ``d ^ keys[0]`` passed twice through ``z -> mix(z + golden) ^ key`` (``keys[1]``, then
    ``keys[2]``; ``mix`` SplitMix64's finaliser).

    Parameters
    ----------
    ids : int64, shape (n,), non-negative
    keys : uint64, shape (>= 3,)
    thresholds : uint64, shape (parts,), non-decreasing, the last ``2**64 - 1``
    out : int64, shape (n,), written
    """
    last = thresholds.shape[0] - 1
    for i in range(ids.shape[0]):
        z = np.uint64(ids[i]) ^ keys[0]
        for r in range(1, 3):
            z = z + _GOLDEN
            z = (z ^ (z >> _S30)) * _M1
            z = (z ^ (z >> _S27)) * _M2
            z = (z ^ (z >> _S31)) ^ keys[r]
        p = 0
        while p < last and z > thresholds[p]:
            p += 1
        out[i] = p
