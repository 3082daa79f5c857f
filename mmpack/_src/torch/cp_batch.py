"""A collated batch in the context-parallel layout, and the fixed-length ``cu_seqlens``.

:func:`_context_parallel` lays a batch out as :mod:`mmpack._src.views.cp_layout` says: every segment
padded to a multiple of ``2 * cp_size`` (``input_ids`` ``pad_id``, labels ``ignore_index``,
``attention_mask`` and ``loss_mask`` 0, ``position_ids`` continuing the segment's own), the
batch flattened to one row, and either the whole padded batch with every rank's zigzag indices or
one rank's share.  :func:`_padded_boundaries` repeats the last boundary up to a length that
depends only on the batch size and row length (what a CUDA graph or a compiled step needs).

Cost: per per-token field one pass of a kernel writing the tokens kept segment by segment
(``O(segments + T)``, ``T`` the padded tokens or a rank's ``T / C``: contiguous copies per
chunk; a field the batch promises to follow from each segment's first token, a view's
positions and attention mask, is written without being read), plus the layout's
``O(segments)`` boundaries; with ``cp_rank=None`` the same again per rank for ``cp_indices``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from mmpack._src.core.validation import check_bool, check_int, check_positive_int
from mmpack._src.kernels.cp_layout import zigzag_into
from mmpack._src.views.cp_layout import cp_batch_fields, cp_layout, field_params, zigzag_indices

__all__ = ["BatchLayout", "LOSS_MASK", "PLAIN_LAYOUT", "batch_layout", "lay_out"]

LOSS_MASK = "loss_mask"
"""The batch key of the context-parallel layout's loss mask (float32, 1 where a label counts)."""

_FIELDS = ("input_ids", "position_ids", "labels", "attention_mask")
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
}


class BatchLayout:
    """The checked layout options of a batch: context parallelism and fixed-length boundaries."""

    __slots__ = ("cp_rank", "cp_size", "pad_cu_seqlens")

    def __init__(self, varlen: bool, cp_size: Any, cp_rank: Any, pad_cu_seqlens: Any) -> None:
        if cp_size is not None:
            cp_size = check_positive_int(cp_size, "cp_size")
        if cp_rank is not None:
            if cp_size is None:
                raise ValueError(f"cp_rank={cp_rank!r} needs cp_size")
            cp_rank = check_int(cp_rank, "cp_rank")
            if not 0 <= cp_rank < cp_size:
                raise ValueError(
                    f"cp_rank must satisfy 0 <= cp_rank < cp_size={cp_size}, got cp_rank={cp_rank}"
                )
        self.cp_size, self.cp_rank = cp_size, cp_rank
        self.pad_cu_seqlens = check_bool(pad_cu_seqlens, "pad_cu_seqlens")
        if not varlen and (cp_size is not None or self.pad_cu_seqlens):
            raise ValueError(
                f"cp_size={cp_size!r} and pad_cu_seqlens={self.pad_cu_seqlens} lay out the "
                "batch-wide cu_seqlens; they need varlen=True"
            )

    @property
    def plain(self) -> bool:
        """Neither context parallelism nor fixed-length boundaries."""
        return self.cp_size is None and not self.pad_cu_seqlens

    def __repr__(self) -> str:
        return (
            f"cp_size={self.cp_size}, cp_rank={self.cp_rank}, pad_cu_seqlens={self.pad_cu_seqlens}"
        )


PLAIN_LAYOUT = BatchLayout(True, None, None, False)


def batch_layout(varlen: Any, cp_size: Any, cp_rank: Any, pad_cu_seqlens: Any) -> BatchLayout:
    """``BatchLayout(varlen, cp_size, cp_rank, pad_cu_seqlens)``, checked once per set of
    options (of these types) and shared: :func:`~mmpack.torch.collate.collate` asks for it per
    batch.  Options that cannot be a cache key are checked afresh (and refused)."""
    try:
        return _batch_layout(varlen, cp_size, cp_rank, pad_cu_seqlens)
    except TypeError:  # unhashable: BatchLayout says what is wrong with it
        return BatchLayout(varlen, cp_size, cp_rank, pad_cu_seqlens)


@functools.lru_cache(maxsize=32, typed=True)
def _batch_layout(varlen: Any, cp_size: Any, cp_rank: Any, pad_cu_seqlens: Any) -> BatchLayout:
    return BatchLayout(varlen, cp_size, cp_rank, pad_cu_seqlens)


def lay_out(
    out: dict[str, Any],
    flat: np.ndarray,
    rows: int,
    seqlen: int,
    layout: BatchLayout,
    pad_id: int,
    ignore_index: int,
    dtype: torch.dtype | None = None,
    from_first: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``out`` (a batch of ``rows`` rows of ``seqlen`` tokens with its batch-wide
    ``cu_seqlens``, ``flat`` as int64) in the context-parallel layout and/or with fixed-length
    boundaries; the laid out per-token fields of ``dtype`` (default theirs); ``from_first`` as
    :func:`_context_parallel` takes it."""
    if layout.cp_size is not None:
        out = _context_parallel(
            out,
            flat,
            cp_size=layout.cp_size,
            cp_rank=layout.cp_rank,
            pad_id=pad_id,
            ignore_index=ignore_index,
            dtype=dtype,
            from_first=from_first,
        )
    if layout.pad_cu_seqlens:
        length = rows * seqlen + 1  # at most one segment per token
        for key in ("cu_seqlens", "cu_seqlens_padded"):
            if key in out:
                out[key] = _padded_boundaries(out[key], length)
    return out


def _context_parallel(
    out: dict[str, Any],
    flat: np.ndarray,
    *,
    cp_size: int,
    cp_rank: int | None,
    pad_id: int,
    ignore_index: int,
    dtype: torch.dtype | None = None,
    from_first: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``out`` (a batch of ``(B, seqlen)`` per-token fields, tensors or numpy arrays of one
    integer dtype, ``labels`` not yet renamed) in the context-parallel layout of its segments
    ``flat`` (int64, the batch-wide boundaries, rising from 0, as collate checked them), the
    fields cast to ``dtype`` (torch.int64 or torch.int32; default theirs) as they are written.
    The fields named in ``from_first`` (a view's
    :attr:`~mmpack.store.SampleBatch.from_first`) are written from each segment's first
    token, not read.

    Returns a new dict: the per-token fields (and ``loss_mask``, float32, when ``labels`` is
    present) of shape ``(1, T)`` (``cp_rank=None``) or ``(1, T / cp_size)``; ``cu_seqlens``,
    ``cu_seqlens_padded`` (int32, (n + 1,)); ``max_seqlen`` (int, the longest padded segment);
    ``cp_padding`` (int, tokens of padding added); with ``cp_rank=None`` ``cp_indices`` (int64,
    (cp_size, T / cp_size)); the other keys of ``out`` as they were (``cu_seqlens``, int32,
    holds ``flat`` already).
    """
    rank = -1 if cp_rank is None else cp_rank
    keys, masked, params, order = _field_args(
        tuple(out), pad_id, ignore_index, from_first, cp_size, rank
    )
    if not keys:
        return _boundaries_only(out, flat, cp_size, cp_rank)
    padded = np.empty(flat.shape[0], np.int32)  # the dtype collate gives boundaries in
    longest, block, mask = cp_batch_fields(
        tuple([_flat(out[key]) for key in keys]),
        flat,
        padded,
        cp_size,
        rank,
        masked,
        params,
        None if dtype is None else _NUMPY_DTYPES[dtype],
    )
    new: dict[str, Any] = {}
    for key, slot in order:
        new[key] = (
            out[key] if slot < 0 else torch.from_numpy(block[slot] if slot < len(keys) else mask)
        )
    if "cu_seqlens" not in out:
        new["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    new["cu_seqlens_padded"] = torch.from_numpy(padded)
    new["max_seqlen"] = longest
    new["cp_padding"] = int(padded[-1]) - int(flat[-1])
    if cp_rank is None:
        indices = np.empty((cp_size, block.shape[2] // cp_size), dtype=np.int64)
        zigzag_into(padded, cp_size, 0, indices)
        new["cp_indices"] = torch.from_numpy(indices)
    return new


def _boundaries_only(
    out: dict[str, Any], flat: np.ndarray, cp_size: int, cp_rank: int | None
) -> dict[str, Any]:
    """:func:`_context_parallel` of a batch without per-token fields: its boundaries."""
    layout = cp_layout(flat, cp_size)
    new = dict(out)
    if "cu_seqlens" not in out:
        new["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    new["cu_seqlens_padded"] = torch.from_numpy(layout.cu_seqlens_padded.astype(np.int32))
    new["max_seqlen"] = layout.max_seqlen
    new["cp_padding"] = layout.padding
    if cp_rank is None:
        new["cp_indices"] = torch.from_numpy(zigzag_indices(layout.cu_seqlens_padded, cp_size))
    return new


@functools.lru_cache(maxsize=64)
def _field_args(
    names: tuple[str, ...],
    pad_id: int,
    ignore_index: int,
    from_first: tuple[str, ...],
    cp_size: int,
    cp_rank: int,
) -> tuple[tuple[str, ...], int, np.ndarray, tuple[tuple[str, int], ...]]:
    """The per-token fields ``keys`` among a batch's keys ``names``, the index of ``labels``
    among them (``-1``: none), for :func:`~mmpack._src.views.cp_layout.cp_batch_fields` the
    options array (:func:`~mmpack._src.views.cp_layout.field_params`: ``cp_size``, ``cp_rank``
    (``-1``: none), fills, the positions field, the fields written from their segments' first
    tokens) and the laid out batch's keys in order, each with its slot among the laid out
    fields followed by the mask (``-1``: the batch's value as it is), made once per set of
    keys and options (not per batch)."""
    keys = tuple(key for key in names if key in _FIELDS)
    fills = [pad_id if k == "input_ids" else ignore_index if k == "labels" else 0 for k in keys]
    positions = keys.index("position_ids") if "position_ids" in keys else -1
    masked = keys.index("labels") if "labels" in keys else -1
    derived = [k in from_first for k in keys]
    order: list[tuple[str, int]] = []
    for key in names:
        order.append((key, keys.index(key) if key in keys else -1))
        if key == "labels":
            order.append((LOSS_MASK, len(keys)))  # the mask after the labels
    params = field_params(cp_size, cp_rank, fills, positions, masked, derived)
    return keys, masked, params, tuple(order)


def _flat(field: Any) -> np.ndarray:
    """A ``(B, seqlen)`` tensor or numpy array as a flat numpy array (no copy)."""
    return field.ravel() if isinstance(field, np.ndarray) else field.numpy().reshape(-1)


def _padded_boundaries(cu: torch.Tensor, length: int) -> torch.Tensor:
    """``cu`` (int32, (n + 1,), ``n + 1 <= length``) followed by repeats of its last value up to
    ``length`` entries (a segment count's upper bound, so every batch has the same shape)."""
    out = torch.empty(length, dtype=cu.dtype)
    out[: cu.shape[0]] = cu
    out[cu.shape[0] :] = cu[-1]
    return out
