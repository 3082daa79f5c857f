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

:func:`cp_batch_fields` writes the padded boundaries and a batch's token fields in that
layout, or one rank's share, in one pass of a kernel (:mod:`mmpack._src.kernels.cp_layout`), for a
batch its caller has checked, its options in one array (:func:`field_params`, made once per set
of options): collate's per-batch path, where a check, an allocation or a call more is a visible
share of the cost.

Cost: :func:`cp_layout` ``O(segments)``; :func:`cp_batch_fields` ``O(fields * (segments +
tokens written))``, contiguous copies per chunk; :func:`zigzag_indices` ``O(ranks * (segments +
T / C))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mmpack._src.core.validation import check_positive_int
from mmpack._src.kernels.cp_layout import lay_out_fields, pad_boundaries, zigzag_into

__all__ = [
    "CPLayout",
    "cp_batch_fields",
    "cp_layout",
    "field_params",
    "zigzag_indices",
]


class CPLayout(NamedTuple):
    """The padded layout of a batch (see the module docstring).

    ``cu_seqlens``, ``cu_seqlens_padded`` (int64, (n + 1,)); ``max_seqlen`` (int), the longest
    padded segment (0 for none); ``T = cu_seqlens_padded[-1]``."""

    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    max_seqlen: int

    @property
    def padding(self) -> int:
        """Tokens of padding the layout adds."""
        return int(self.cu_seqlens_padded[-1] - self.cu_seqlens[-1])


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
    if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or (cu[1:] < cu[:-1]).any():
        raise ValueError(f"cu_seqlens must rise from 0, got {cu.tolist()[:16]}")
    cu_padded = np.empty_like(cu)
    longest = pad_boundaries(cu, 2 * cp_size, cu_padded)
    return CPLayout(cu, cu_padded, int(longest))


def field_params(
    cp_size: int,
    rank: int,
    fills: Sequence[int],
    positions: int,
    masked: int,
    from_first: Sequence[bool],
) -> np.ndarray:
    """The options of :func:`cp_batch_fields` (and its kernel's) in one array (int64,
    (4 + 2 F,), read only), from checked values: ``rank``, ``positions`` and ``masked``
    ``-1`` for none, ``fills`` one per field, ``from_first`` the fields each of whose segments
    follows from its first token (empty: none)."""
    flags = [bool(x) for x in from_first] or [False] * len(fills)
    params = np.array([cp_size, rank, positions, masked, *fills, *flags], dtype=np.int64)
    params.flags.writeable = False
    return params


def cp_batch_fields(
    fields: tuple[np.ndarray, ...],
    cu_seqlens: np.ndarray,
    padded: np.ndarray,
    cp_size: int,
    rank: int,
    masked: int,
    params: np.ndarray,
    dtype: np.dtype | None = None,
) -> tuple[int, np.ndarray, np.ndarray | None]:
    """:func:`cp_layout`'s boundaries and the token fields in the padded layout (the whole
    padded batch, or rank ``rank``'s share) at once, in one call of the kernel, for a batch its
    caller has checked (collate's per-batch path, where a check, an allocation or a call more is
    a visible share of the cost).

    Parameters
    ----------
    fields : tuple of F numpy.ndarray, one integer dtype, shape (N,)
        The fields over the flat batch, ``N >= cu_seqlens[-1]``.
    cu_seqlens : numpy.ndarray, int64, shape (n + 1,)
        Rising from 0.
    padded : numpy.ndarray, int32 or int64, shape (n + 1,)
        Written: the padded boundaries (``cu_seqlens_padded``).
    cp_size, rank, masked : int
        ``C >= 1``; ``0 <= rank < C`` for that rank's share, ``-1`` for the whole padded batch;
        the masked field's index, ``-1`` for none: as given in ``params``.
    params : numpy.ndarray, int64, shape (4 + 2 F,)
        :func:`field_params` of those options.
    dtype : numpy.dtype, optional
        An integer dtype of the block, the fields' values cast to it as they are copied (as
        ``astype`` casts); default the fields'.

    Returns
    -------
    max_seqlen : int
        The longest padded segment (0 for none).
    block : numpy.ndarray, the fields' dtype or ``dtype``, shape (F, 1, T) or (F, 1, T / C)
        Field ``f`` in ``block[f]``, ``T = padded[-1]``: each segment's real tokens, then its
        padding (the field's fill, or for the positions field its positions continued).
    mask : numpy.ndarray, float32, shape (1, T) or (1, T / C), or None
        With a masked field: 1.0 where its value differs from its fill, else 0.0.
    """
    count = len(fields)
    # each row's length allocated: a bound on T (or T / C) from cu_seqlens, so the block is
    # allocated before the kernel finds T (each row contiguous, the rows room apart)
    room = int(cu_seqlens[-1]) + (cu_seqlens.shape[0] - 1) * (2 * cp_size - 1)
    room = room if rank < 0 else room // cp_size
    dtype = fields[0].dtype if dtype is None else dtype  # a numpy.dtype
    # One allocation for the block and the mask (rows of the block's dtype after the fields'):
    # arrays allocated apart fault in fresh pages on every batch (the allocator gives them
    # back to the system between batches).
    if masked < 0:
        whole = np.empty((count, 1, room), dtype)
        longest = lay_out_fields(fields, cu_seqlens, params, whole[:, 0], _NO_MASK, padded)
        size = int(padded[-1]) if rank < 0 else int(padded[-1]) // cp_size
        return longest, whole[:, :, :size], None
    whole = np.empty((count + -(-4 // dtype.itemsize), 1, room), dtype)
    # the mask in the first bytes of the row after the fields', or over the rows after them
    mask = (whole[count, 0] if dtype.itemsize >= 4 else whole[count:].reshape(-1)).view(np.float32)
    longest = lay_out_fields(fields, cu_seqlens, params, whole[:, 0], mask, padded)
    size = int(padded[-1]) if rank < 0 else int(padded[-1]) // cp_size
    return longest, whole[:count, :, :size], mask[None, :size]


_NO_MASK = np.empty(0, dtype=np.float32)


def zigzag_indices(
    cu_seqlens_padded: np.ndarray, cp_size: int, rank: int | None = None
) -> np.ndarray:
    """Rank ``rank``'s positions in the padded batch (int64, (T / C,)), or every rank's
    (``rank=None``: int64, (C, T / C), row ``r`` rank ``r``'s).

    Parameters
    ----------
    cu_seqlens_padded : numpy.ndarray, integer, shape (n + 1,)
        Padded boundaries rising from 0, every segment a multiple of ``2 * cp_size``.
    cp_size : int
        ``C >= 1``.
    rank : int, optional
        ``0 <= rank < C``.
    """
    cp_size = check_positive_int(cp_size, "cp_size")
    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    if cu.ndim != 1 or cu.size < 1 or cu[0] != 0:
        raise ValueError(f"cu_seqlens_padded must rise from 0, got {cu.tolist()[:16]}")
    lens = cu[1:] - cu[:-1]
    if (lens % (2 * cp_size)).any() or (lens < 0).any():
        bad = lens[(lens % (2 * cp_size) != 0) | (lens < 0)][0]
        raise ValueError(
            f"cu_seqlens_padded has a segment of {int(bad)} tokens, not a non-negative multiple "
            f"of 2 * cp_size = {2 * cp_size}"
        )
    if rank is not None and not 0 <= rank < cp_size:
        raise ValueError(f"rank must satisfy 0 <= rank < cp_size={cp_size}, got rank={rank}")
    out = np.empty((cp_size if rank is None else 1, int(cu[-1]) // cp_size), dtype=np.int64)
    zigzag_into(cu, cp_size, 0 if rank is None else rank, out)
    return out if rank is None else out[0]
