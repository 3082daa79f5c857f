"""A subset's token ranges mapped onto its parent's tokens (:mod:`mmpack.store.subset`).

:func:`parent_starts`: for each range ``[s, s + n)`` of a subset's flat tokens, the document
holding ``s`` (binary search over the subset's offsets, O(log docs)) and, when the range ends
inside it, the parent position of ``s`` (``s + shift[doc]``).  O(k log docs) for k ranges, no
allocation; the caller validates every input.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = ["parent_starts"]


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
