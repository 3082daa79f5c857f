"""Context-parallel layout of a batch: every segment padded to a multiple of ``2 C``, zigzag shares.

Context parallelism over ``C`` ranks with TransformerEngine's THD attention (and Megatron's
packed sequences) splits every sequence of the batch into ``2 C`` equal chunks and gives rank
``r`` chunks ``r`` and ``2 C - 1 - r`` (the "zigzag" that gives every rank the same share of
causal work).  So each segment of length ``s`` is padded to ``p = ceil(s / 2C) * 2C`` tokens:

* ``cu_seqlens`` (the real boundaries, ``0, s_0, s_0 + s_1, ...``) and ``cu_seqlens_padded``
  (``0, p_0, p_0 + p_1, ...``), the pair TE's ``cu_seqlens_q`` / ``cu_seqlens_q_padded`` take;
  segment ``i`` starts at ``cu_seqlens_padded[i]`` of the padded batch, its padding after it;
* :func:`zigzag_indices`: rank ``r``'s positions in the padded batch, segment by segment,
  ``[o + r c, o + (r + 1) c)`` then ``[o + (2C - 1 - r) c, o + (2C - r) c)`` for a segment at
  ``o`` with chunks of ``c = p / 2C``: exactly TransformerEngine's
  ``thd_get_partitioned_indices(cu_seqlens_padded, total, C, r)``.

Worked example, ``C = 2``, segments of 3 and 5 tokens: padded to 4 and 8, ``cu_seqlens = [0, 3,
8]``, ``cu_seqlens_padded = [0, 4, 12]``; rank 0 holds positions ``0, 3, 4, 5, 10, 11``, rank 1
``1, 2, 6, 7, 8, 9``.

Cost: O(segments + padded tokens) numpy, no Python loop over segments (one over the ``C`` ranks
for :func:`zigzag_indices` of all ranks).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mmpack.core.validation import check_positive_int

__all__ = ["CPLayout", "cp_layout", "zigzag_indices"]


class CPLayout(NamedTuple):
    """The padded layout of a batch (see the module docstring).

    ``cu_seqlens``, ``cu_seqlens_padded`` (int64, (n + 1,)); ``source`` (int64, (T,)): the flat
    batch position each padded token takes, ``-1`` on padding; ``offset`` (int64, (T,)): each
    padded token's position inside its padded segment; ``start`` (int64, (T,)): the flat batch
    position of its segment's first token.  ``T = cu_seqlens_padded[-1]``."""

    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    source: np.ndarray
    offset: np.ndarray
    start: np.ndarray

    @property
    def padding(self) -> int:
        """Tokens of padding the layout adds."""
        return int(self.cu_seqlens_padded[-1] - self.cu_seqlens[-1])

    @property
    def max_seqlen(self) -> int:
        """The longest padded segment (0 for none)."""
        lens = np.diff(self.cu_seqlens_padded)
        return int(lens.max()) if lens.size else 0


def cp_layout(cu_seqlens: np.ndarray, cp_size: int) -> CPLayout:
    """The layout of a batch whose segments ``cu_seqlens`` delimits, padded for ``cp_size``.

    Parameters
    ----------
    cu_seqlens : numpy.ndarray, integer, shape (n + 1,)
        ``0 = c_0 <= c_1 <= ... <= c_n``: the batch's segments as one flat sequence.
    cp_size : int
        ``C >= 1``; every segment is padded to a multiple of ``2 C``.

    Returns
    -------
    CPLayout
    """
    cp_size = check_positive_int(cp_size, "cp_size")
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens must rise from 0, got {cu.tolist()[:16]}")
    real = np.diff(cu)
    unit = 2 * cp_size
    padded = -(-real // unit) * unit
    cu_padded = np.zeros_like(cu)
    np.cumsum(padded, out=cu_padded[1:])
    total = int(cu_padded[-1])
    offset = np.arange(total, dtype=np.int64) - np.repeat(cu_padded[:-1], padded)
    start = np.repeat(cu[:-1], padded)
    source = np.where(offset < np.repeat(real, padded), start + offset, -1)
    return CPLayout(cu, cu_padded, source, offset, start)


def zigzag_indices(
    cu_seqlens_padded: np.ndarray, cp_size: int, rank: int | None = None
) -> np.ndarray:
    """Rank ``rank``'s positions in the padded batch (int64, (T / C,)), or every rank's
    (``rank=None``: int64, (C, T / C), row ``r`` rank ``r``'s).

    Parameters
    ----------
    cu_seqlens_padded : numpy.ndarray, integer, shape (n + 1,)
        Padded boundaries, every segment a multiple of ``2 * cp_size``.
    cp_size : int
        ``C >= 1``.
    rank : int, optional
        ``0 <= rank < C``.
    """
    cp_size = check_positive_int(cp_size, "cp_size")
    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    lens = np.diff(cu)
    if (lens % (2 * cp_size)).any():
        raise ValueError(
            f"cu_seqlens_padded has a segment of {int(lens[lens % (2 * cp_size) != 0][0])} "
            f"tokens, not a multiple of 2 * cp_size = {2 * cp_size}"
        )
    if rank is not None and not 0 <= rank < cp_size:
        raise ValueError(f"rank must satisfy 0 <= rank < cp_size={cp_size}, got rank={rank}")
    chunk = lens // (2 * cp_size)
    share = 2 * chunk
    k = np.arange(int(share.sum()), dtype=np.int64) - np.repeat(np.cumsum(share) - share, share)
    c = np.repeat(chunk, share)
    first = k < c
    seg_start = np.repeat(cu[:-1], share)
    ranks = range(cp_size) if rank is None else [rank]
    rows = [
        seg_start + np.where(first, k + r * c, k - c + (2 * cp_size - 1 - r) * c) for r in ranks
    ]
    return np.stack(rows) if rank is None else rows[0]
