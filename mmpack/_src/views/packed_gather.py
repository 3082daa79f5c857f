"""Reading bins of a packing plan as packed rows: the kernel calls of ``PackedDataset``.

:func:`piece_ranges` turns a batch of bins into the flat token ranges of their pieces, checked
against the store's documents (a corrupt plan is a :class:`~mmpack.errors.FormatError`, never an
out-of-bounds read); :func:`gather_rows` reads those ranges through ``store.read_ranges`` (so
every backend works) and writes the ``(B, seqlen)`` columns in one kernel call into pooled
buffers (a single bin of the memmap backend is one call of
:func:`~mmpack._src.kernels.packed_rows.one_bin`, both rules in one).  Kernels in
:mod:`mmpack._src.kernels.packed_rows`.  Cost: O(B * seqlen) plus O(pieces) bookkeeping per batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.kernels.packed_rows import fill_rows, mask_pieces, select_pieces
from mmpack._src.packing.plan import PackingPlan
from mmpack._src.views.buffers import BufferPool
from mmpack.errors import FormatError

__all__ = [
    "gather_rows",
    "mlm_targets",
    "piece_ranges",
]


def piece_ranges(
    plan: PackingPlan,
    offsets: np.ndarray,
    seqlen: int,
    eot: bool,
    idx: np.ndarray,
    doc_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """``(starts, lengths, has_eot, row_ptr, counts)`` of the pieces of bins ``idx`` (checked
    indices): token ranges, eot flags, the prefix sum of the pieces per row and the pieces
    per row.  The ranges are flat positions of the store ``offsets`` delimits, or, with
    ``doc_starts`` (int64, shape (>= docs,): where each document starts in the store holding
    its tokens, :func:`mmpack._src.store.subset.token_source`), positions in that store.
    ``FormatError`` when the plan does not fit the documents ``offsets`` delimit."""
    if doc_starts is None:
        doc_starts = offsets
    elif doc_starts.shape[0] < offsets.shape[0] - 1:  # never read out of bounds
        raise ValueError(
            f"doc_starts has {doc_starts.shape[0]} entries for {offsets.shape[0] - 1} documents"
        )
    k = idx.shape[0]
    lo = plan.bin_ptr[idx]
    hi = plan.bin_ptr[idx + 1]
    counts = hi - lo
    if k and (counts.min() < 0 or lo.min() < 0 or hi.max() > plan.n_pieces):
        raise FormatError("the packing plan's bin_ptr is corrupt; delete <store>/cache")
    row_ptr = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    total = int(row_ptr[-1])
    starts = np.empty(total, dtype=np.int64)
    lengths = np.empty(total, dtype=np.int64)
    has_eot = np.empty(total, dtype=np.int64)  # as one_bin's scratch: one compile of the kernels
    bad = select_pieces(
        plan.bin_ptr,
        plan.piece_ref,
        plan.piece_len,
        plan.regions,
        plan.split,
        offsets,
        doc_starts,
        seqlen,
        int(eot),
        idx,
        row_ptr,
        starts,
        lengths,
        has_eot,
    )
    if bad >= 0:
        raise FormatError(
            f"bin {int(idx[bad])} of the packing plan does not fit the store's documents; "
            "delete <store>/cache to rebuild it"
        )
    return starts, lengths, has_eot, row_ptr, counts


def gather_rows(
    store: Any,
    ranges: tuple[np.ndarray, ...],
    pool: BufferPool,
    seqlen: int,
    eot_id: int,
    pad_id: int,
    label_mode: int,
    ignore: int,
    dtype: np.dtype | type = np.int64,
    mask: Any = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """``(columns, cu_seqlens, n_segments)`` of the rows whose pieces are ``ranges`` (from
    :func:`piece_ranges`): ``input_ids``, ``labels``, ``position_ids``, ``attention_mask``
    (``dtype``, int64 or int32, (B, seqlen), from ``pool``) and ``max_seqlen``; ``cu_seqlens`` (int32, (B, C)), row
    ``r``'s boundaries being its first ``n_segments[r] + 1`` entries.  With ``mask`` (the
    store's ``loss_mask``), read with the same ranges, a causal label is ``ignore`` (the label
    of no loss) where the token it predicts is not a target (in the same pass)."""
    starts, lengths, has_eot, row_ptr, counts = ranges
    k = counts.shape[0]
    total = int(row_ptr[-1])
    src, src_starts = _checked_read(store, starts, lengths, total)
    if mask is not None:
        mask_src, mask_starts = _checked_read(mask, starts, lengths, total)
    else:
        mask_src, mask_starts = np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
    ids = pool.empty((k, seqlen), dtype)
    pos = pool.empty((k, seqlen), dtype)
    labels = pool.empty((k, seqlen), dtype)
    attn = pool.empty((k, seqlen), dtype)
    cu = np.empty((k, int(counts.max(initial=0)) + 2), dtype=np.int32)
    n_seg = np.empty(k, dtype=np.int64)
    max_len = np.empty(k, dtype=np.int64)
    if k:
        fill_rows(
            src,
            src_starts,
            lengths,
            has_eot,
            row_ptr,
            eot_id,
            pad_id,
            label_mode,
            ignore,
            ids,
            pos,
            labels,
            attn,
            cu,
            n_seg,
            max_len,
            mask_src,
            mask_starts,
        )
    columns = {
        "input_ids": ids,
        "labels": labels,
        "position_ids": pos,
        "attention_mask": attn,
        "max_seqlen": max_len,
    }
    return columns, cu, n_seg


def _checked_read(
    store: Any, starts: np.ndarray, lengths: np.ndarray, total: int
) -> tuple[np.ndarray, np.ndarray]:
    """``store.read_ranges(starts, lengths)``, its answer checked to lie inside its buffer."""
    src, src_starts = store.read_ranges(starts, lengths)
    src_starts = np.asarray(src_starts, dtype=np.int64)
    if total and (
        src_starts.shape != (total,)
        or src_starts.min() < 0
        or (src_starts + lengths).max() > src.shape[0]
    ):
        raise FormatError("store.read_ranges returned ranges outside its buffer")
    return src, src_starts


def mlm_targets(mask: Any, ranges: tuple[np.ndarray, ...], attn: np.ndarray) -> np.ndarray:
    """A copy of the rows' attention mask ``attn`` ((B, seqlen)) with 0 on every token whose
    loss mask (``mask``: the store's ``loss_mask``) is 0: what MLM may select.  One
    ``read_ranges`` of the pieces' masks, one pass of
    :func:`~mmpack._src.kernels.packed_rows.mask_pieces`."""
    starts, lengths, has_eot, row_ptr, _ = ranges
    src, at = _checked_read(mask, starts, lengths, int(row_ptr[-1]))
    maskable = attn.copy()
    mask_pieces(src, at, lengths, has_eot, row_ptr, 0, 0, maskable)
    return maskable
