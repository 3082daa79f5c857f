"""Collate per-sample numpy dicts into torch batches, with FlashAttention's varlen metadata.

mmpack's views return one dict per sample: ``input_ids``, ``position_ids``, ``labels`` (int64,
``(seqlen,)``), optionally ``attention_mask``, ``cu_seqlens`` (int32 segment boundaries of the
row: ``0, ..., seqlen``), ``max_seqlen`` and ``source``.  :func:`collate` turns a list of them
into ``(B, seqlen)`` tensors (one ``np.stack`` and one zero-copy ``torch.from_numpy`` per field);
``cu_seqlens``, the boundaries of every segment of the batch as one flat sequence of ``B *
seqlen`` tokens (rows ``[0, 3, 8]`` and ``[0, 2, 6, 8]`` give ``[0, 3, 8, 10, 14, 16]``), what
``flash_attn_varlen_func`` takes, with ``max_seqlen``; ``cu_seqlens_rows``, the per-row
boundaries (:mod:`mmpack._src.torch.attention`); and ``targets``, the samples' ``labels`` under a name
of their own: a transformers model given the batch computes no loss by accident (its loss would
shift the already shifted labels and attend across documents), while
:func:`mmpack.torch.hf_inputs` turns the batch into its right inputs.  ``provenance=True``
adds the documents and token ranges every row holds (:mod:`mmpack._src.views.provenance`).

A sample without ``cu_seqlens`` is cut where its ``position_ids`` restart; one with neither is
one segment.  A row's trailing padding is its own segment (the segments tile all ``B * seqlen``
tokens): it attends among itself and its labels are ``-100``.  In a DataLoader worker the batch
leaves through a reused shared buffer (:func:`mmpack._src.torch.transfer.share_batch`).

Cost: the stacking copy (about ``3 * B * seqlen * 8`` bytes) plus ``O(B + segments)`` vectorised
numpy for the boundaries; in a worker one more copy into the shared buffer.  The stacking is
:mod:`mmpack._src.torch.stacking`, the boundary rules :mod:`mmpack._src.torch.boundaries`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmpack._src.core.constants import IGNORE_INDEX, INT32_MAX
from mmpack._src.torch.boundaries import flat_boundaries, position_boundaries, sample_boundaries
from mmpack._src.torch.cp_batch import LOSS_MASK, PLAIN_LAYOUT, BatchLayout, batch_layout, lay_out
from mmpack._src.torch.stacking import pad_tokens, stack_extra, stack_tokens
from mmpack._src.torch.transfer import share_batch
from mmpack._src.views.batch import SampleBatch

__all__ = [
    "BATCH_TOKEN_FIELDS",
    "Collator",
    "LOSS_MASK",
    "PROVENANCE",
    "TARGETS",
    "TOKEN_FIELDS",
    "collate",
]

TOKEN_FIELDS: tuple[str, ...] = ("input_ids", "position_ids", "labels", "attention_mask")
"""Per-token fields of a sample: 1-D integer arrays of the row's length, stacked to
``(B, seqlen)``."""

PROVENANCE = "provenance"
"""The batch key of ``collate(..., provenance=True)``'s per-piece tensors."""

TARGETS = "targets"
"""The batch key of the samples' ``labels`` (never ``labels``: see the module docstring)."""

BATCH_TOKEN_FIELDS: tuple[str, ...] = ("input_ids", "position_ids", TARGETS, "attention_mask")
"""The per-token keys of a batch, :data:`TOKEN_FIELDS` with ``labels`` carried as ``targets``."""


def collate(
    samples: Sequence[Mapping[str, Any]],
    *,
    varlen: bool = True,
    dtype: torch.dtype = torch.int64,
    provenance: bool = False,
    cp_size: int | None = None,
    cp_rank: int | None = None,
    pad_cu_seqlens: bool = False,
    pad_id: int = 0,
) -> dict[str, Any]:
    """Collate mmpack samples into a batch (a ``torch.utils.data.DataLoader`` ``collate_fn``).

    Parameters
    ----------
    samples : sequence of mappings
        ``B >= 1`` samples with the same keys.  Per-token fields (:data:`TOKEN_FIELDS`, those
        present) are 1-D integer arrays of one common length ``seqlen``.  ``cu_seqlens`` (1-D
        integers, ``0 = c[0] <= c[1] <= ... <= c[-1] = seqlen``) gives the row's segments; a
        sample without it is cut where its ``position_ids`` restart, or is one segment
        ``[0, seqlen]`` without them.
    varlen : bool
        Also give the batch-wide ``cu_seqlens`` for varlen attention kernels.
    dtype : torch.dtype, default torch.int64
        Dtype of the per-token tensors: ``torch.int32`` halves the bytes a batch moves from a
        DataLoader worker (torch embeddings accept int32 ids; token ids and labels fit).
    provenance : bool, default False
        Also give, under ``provenance``, where every sample comes from (the documents and token
        ranges it holds); ``samples`` must then be the batch a view's ``__getitems__`` returns
        (:class:`~mmpack.store.SampleBatch`, what a ``DataLoader`` hands its
        ``collate_fn``), of a ``WindowDataset``, a ``PackedDataset`` or a ``Mixture`` of them.
    cp_size : int, optional
        Lay the batch out for context parallelism over ``cp_size`` ranks
        (:mod:`mmpack._src.views.cp_layout`): every segment padded to a multiple of ``2 * cp_size``,
        the batch one flat row, as TransformerEngine's THD attention with context parallelism
        takes it.  Needs ``varlen``.
    cp_rank : int, optional
        With ``cp_size``: keep only this rank's zigzag share (``0 <= cp_rank < cp_size``);
        ``None`` keeps the whole padded batch and gives every rank's indices (``cp_indices``).
    pad_cu_seqlens : bool, default False
        Give ``cu_seqlens`` (and ``cu_seqlens_padded``) ``B * seqlen + 1`` entries whatever the
        batch, the real boundaries followed by repeats of the last (the name Megatron-Bridge
        uses): one shape for a CUDA graph or a compiled step.  Needs ``varlen``.
    pad_id : int, default 0
        Token id of the context-parallel padding.

    Returns
    -------
    dict
        ``input_ids``, ``position_ids``, ``targets``, ``attention_mask`` : torch.Tensor, int64,
        shape (B, seqlen)
            Those present in the samples; ``targets`` holds the samples' ``labels`` (not a
            transformers model's ``labels``: :func:`~mmpack.torch.hf_inputs` makes those).
        ``cu_seqlens`` : torch.Tensor, int32, shape (n_segments + 1,)
            Only when ``varlen``.  Row ``b``'s boundaries shifted by ``b * seqlen``, concatenated,
            repeated values dropped: strictly increasing from 0 to ``B * seqlen``.  Padding
            segments are kept (see the module docstring).
        ``cu_seqlens_rows`` : tuple of B torch.Tensor, int32
            Each row's boundaries as given (views of one buffer).
        ``max_seqlen`` : int
            Longest segment of the batch, recomputed from the boundaries (the samples'
            ``max_seqlen`` values are not trusted).
        any other key
            Stacked into a tensor of shape ``(B, ...)`` when every value is a same-shape numpy
            array, tensor or number (integers become int64, floats and bools keep their dtype);
            otherwise kept as a list of the B values.
        ``provenance`` : dict of torch.Tensor, int64
            Only with ``provenance=True``: one entry per document piece, in row order, the rows'
            ``locate`` lists end to end: ``sample`` (the row), ``doc``, ``start``, ``stop``,
            ``eot``, ``at``, and from a mixture ``source``, each of shape (m,); ``cu_docs``
            (B + 1,), row ``b`` owning entries ``cu_docs[b]:cu_docs[b + 1]``
            (:mod:`mmpack._src.views.provenance`).

        With ``cp_size`` (see :mod:`mmpack._src.torch.cp_batch`): the per-token fields and
        ``loss_mask`` (float32, 1 where the label counts) have shape ``(1, T)``, ``T`` the padded
        tokens (``cp_rank=None``), or ``(1, T / cp_size)`` (rank ``cp_rank``'s share, its
        chunks segment by segment); ``position_ids`` are each document's own, continued over its
        padding; ``cu_seqlens`` (real) and ``cu_seqlens_padded`` (int32) cover the whole batch;
        ``max_seqlen`` is the longest padded segment; ``cp_padding`` (int) the tokens of
        padding added; with ``cp_rank=None``, ``cp_indices`` (int64, (cp_size, T / cp_size)):
        rank ``r``'s share is ``batch[key][:, cp_indices[r]]``.

    Raises
    ------
    ValueError
        Empty batch, differing keys or row lengths, malformed ``cu_seqlens``, a sample carrying
        a key collate produces (``cu_seqlens_rows``, ``targets``), or ``B * seqlen`` beyond
        int32; ``provenance=True`` for samples that do not record it (a list of per-sample
        dicts, or a batch of another dataset).
        ``cp_size`` or ``pad_cu_seqlens`` without ``varlen``, a ``cp_rank`` outside
        ``[0, cp_size)`` or without ``cp_size``.
    TypeError
        A sample that is not a mapping, or a per-token field that is not integer.
    """
    return _collate(
        samples,
        varlen=varlen,
        pad_to_multiple_of=None,
        pad_id=int(pad_id),
        ignore_index=IGNORE_INDEX,
        dtype=_token_dtype(dtype),
        provenance=bool(provenance),
        layout=batch_layout(varlen, cp_size, cp_rank, pad_cu_seqlens),
    )


class Collator:
    """A picklable :func:`collate` with options, for ``DataLoader(collate_fn=Collator(...))``.

    Parameters
    ----------
    varlen : bool
        As in :func:`collate`.
    pad_to_multiple_of : int, optional
        Pad every row on the right to the next multiple (static shapes for compiled models or
        tensor cores).  The pad is one more segment of each row: ``input_ids = pad_id``,
        ``labels = ignore_index``, ``attention_mask = 0``, ``position_ids = 0, 1, ...``.
    pad_id : int
        Token id written into ``input_ids`` padding.
    ignore_index : int
        Label written into ``labels`` padding.
    dtype : torch.dtype, default torch.int64
        As in :func:`collate`.
    provenance : bool, default False
        As in :func:`collate`: every batch also says where its samples come from.
    cp_size, cp_rank, pad_cu_seqlens
        As in :func:`collate` (the context-parallel padding takes ``pad_id`` and
        ``ignore_index`` too).
    """

    def __init__(
        self,
        *,
        varlen: bool = True,
        pad_to_multiple_of: int | None = None,
        pad_id: int = 0,
        ignore_index: int = IGNORE_INDEX,
        dtype: torch.dtype = torch.int64,
        provenance: bool = False,
        cp_size: int | None = None,
        cp_rank: int | None = None,
        pad_cu_seqlens: bool = False,
    ) -> None:
        self._dtype = _token_dtype(dtype)
        self._layout = BatchLayout(bool(varlen), cp_size, cp_rank, pad_cu_seqlens)
        if pad_to_multiple_of is not None and (
            isinstance(pad_to_multiple_of, bool)
            or not isinstance(pad_to_multiple_of, (int, np.integer))
            or pad_to_multiple_of < 1
        ):
            raise ValueError(
                f"pad_to_multiple_of={pad_to_multiple_of!r} is not accepted; give a positive int "
                "or None"
            )
        self._varlen = bool(varlen)
        self._multiple = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self._pad_id = int(pad_id)
        self._ignore_index = int(ignore_index)
        self._provenance = bool(provenance)

    @property
    def varlen(self) -> bool:
        """Whether the batch-wide ``cu_seqlens`` is produced."""
        return self._varlen

    @property
    def pad_to_multiple_of(self) -> int | None:
        """Rows are padded to a multiple of this length (``None``: no padding)."""
        return self._multiple

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return _collate(
            samples,
            varlen=self._varlen,
            pad_to_multiple_of=self._multiple,
            pad_id=self._pad_id,
            ignore_index=self._ignore_index,
            dtype=self._dtype,
            provenance=self._provenance,
            layout=self._layout,
        )

    def __repr__(self) -> str:
        return (
            f"Collator(varlen={self._varlen}, pad_to_multiple_of={self._multiple}, "
            f"pad_id={self._pad_id}, ignore_index={self._ignore_index}, "
            f"provenance={self._provenance}, {self._layout!r})"
        )


def _collate(
    samples: Sequence[Mapping[str, Any]],
    *,
    varlen: bool,
    pad_to_multiple_of: int | None,
    pad_id: int,
    ignore_index: int,
    dtype: torch.dtype = torch.int64,
    provenance: bool = False,
    layout: BatchLayout = PLAIN_LAYOUT,
) -> dict[str, Any]:
    if isinstance(samples, SampleBatch) and pad_to_multiple_of is None:
        columns, flat, lens, width = _collate_columns(
            samples, varlen=varlen, dtype=dtype, layout=layout
        )
        if not layout.plain:
            columns = lay_out(columns, flat, len(lens), width, layout, pad_id, ignore_index,
                              dtype, samples.from_first)  # fmt: skip
        if provenance:
            columns[PROVENANCE] = _provenance(samples)
        return share_batch(_labels_as_targets(columns), BATCH_TOKEN_FIELDS)
    keys = _common_keys(samples)
    out: dict[str, Any] = {}
    seqlen = None
    for key in TOKEN_FIELDS:
        if key in keys:
            out[key], seqlen = stack_tokens(samples, key, seqlen, dtype)
    cu_key = "cu_seqlens" in keys
    if seqlen is None:
        if not cu_key:
            raise ValueError(
                f"samples have none of the per-token fields {list(TOKEN_FIELDS)} and no "
                "'cu_seqlens'; nothing to collate into a token batch"
            )
        seqlen = int(np.asarray(samples[0]["cu_seqlens"])[-1])
    if seqlen < 1:
        raise ValueError(f"samples have rows of length {seqlen}; a row needs at least one token")
    if not cu_key and "position_ids" in out:  # e.g. a view's sample whose cu_seqlens was dropped
        rows, lens = position_boundaries(out["position_ids"].numpy())
    else:
        rows, lens = sample_boundaries(samples, seqlen, cu_key)
    if pad_to_multiple_of is not None and seqlen % pad_to_multiple_of:
        rows, lens, seqlen = _pad_rows(
            out, rows, lens, seqlen, pad_to_multiple_of, pad_id, ignore_index
        )
    fields, flat = _boundary_fields(rows, lens, seqlen, varlen, layout)
    out.update(fields)
    for key in keys:
        if key in TOKEN_FIELDS or key in ("cu_seqlens", "max_seqlen"):
            continue
        out[key] = stack_extra([s[key] for s in samples])
    if not layout.plain:
        out = lay_out(out, flat, len(lens), seqlen, layout, pad_id, ignore_index)
    if provenance:
        out[PROVENANCE] = _provenance(samples)
    return share_batch(_labels_as_targets(out), BATCH_TOKEN_FIELDS)


def _provenance(samples: Any) -> dict[str, torch.Tensor]:
    """The batch's :data:`PROVENANCE` value: its samples' provenance as int64 tensors."""
    if not isinstance(samples, SampleBatch):
        raise ValueError(
            "collate(provenance=True) needs the batch a view's __getitems__ returns (what a "
            "DataLoader passes its collate_fn); a list of per-sample dicts does not say where "
            "its samples come from"
        )
    pieces = samples.provenance_pieces()
    out = dict(zip(pieces.fields, map(torch.from_numpy, pieces.block)))  # one view per field
    out["cu_docs"] = torch.from_numpy(pieces.cu_docs)
    return out


def _labels_as_targets(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with ``labels`` renamed :data:`TARGETS`, in its place among the keys."""
    if "labels" not in out:
        return out
    if TARGETS in out:
        raise ValueError(f"the batch has both 'labels' and {TARGETS!r}; collate makes {TARGETS!r}")
    return {(TARGETS if key == "labels" else key): value for key, value in out.items()}


def _common_keys(samples: Any) -> list[str]:
    """The keys every sample has, in the first sample's order; ``TypeError`` for a batch that is
    not a sequence of mappings, ``ValueError`` for an empty batch, differing keys or a key that
    collate produces itself."""
    if isinstance(samples, Mapping) or not isinstance(samples, Sequence):
        raise TypeError(
            f"samples must be a sequence of per-sample dicts, got {type(samples).__name__}"
        )
    if len(samples) == 0:
        raise ValueError("samples is empty; a batch needs at least one sample")
    for b, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise TypeError(f"samples[{b}] is a {type(s).__name__}, expected a mapping (dict)")
    keys = list(samples[0].keys())
    key_set = set(keys)
    for b in range(1, len(samples)):
        if samples[b].keys() != key_set:
            other = set(samples[b].keys())
            raise ValueError(
                f"samples[{b}] has keys {sorted(other)} but samples[0] has {sorted(key_set)}; "
                f"missing {sorted(key_set - other)}, extra {sorted(other - key_set)}"
            )
    if "cu_seqlens_rows" in key_set or {"labels", TARGETS} <= key_set:
        key = "cu_seqlens_rows" if "cu_seqlens_rows" in key_set else TARGETS
        raise ValueError(f"samples carry the key {key!r}, which collate produces itself")
    return keys


def _pad_rows(
    out: dict[str, Any],
    rows: np.ndarray,
    lens: np.ndarray,
    seqlen: int,
    multiple: int,
    pad_id: int,
    ignore_index: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Right-pad the per-token fields of ``out`` (in place) to the next multiple of ``multiple``
    and give each row a final segment ``[seqlen, new_len]``: the new rows, counts and length."""
    new_len = -(-seqlen // multiple) * multiple
    fill = {"input_ids": pad_id, "labels": ignore_index, "attention_mask": 0}
    for key in TOKEN_FIELDS:
        if key in out:
            out[key] = pad_tokens(out[key], new_len, key, fill.get(key, 0))
    rows = np.insert(rows, np.cumsum(lens), new_len)
    return rows, lens + 1, new_len


def _boundary_fields(
    rows: np.ndarray,
    lens: np.ndarray,
    seqlen: int,
    varlen: bool,
    layout: BatchLayout = PLAIN_LAYOUT,
) -> tuple[dict[str, Any], np.ndarray]:
    """``cu_seqlens_rows``, ``cu_seqlens`` (when ``varlen``) and ``max_seqlen`` of a batch whose
    row ``b`` has the ``lens[b]`` boundaries that follow in ``rows`` (int64, validated), and the
    batch-wide boundaries (int64).  With context parallelism ``max_seqlen`` is left 0 (the
    layout gives it)."""
    n = lens.shape[0]
    if n * seqlen > INT32_MAX:
        raise ValueError(
            f"batch of {n} rows x seqlen {seqlen} = {n * seqlen} tokens does not fit the int32 "
            "cu_seqlens FlashAttention takes; use fewer or shorter rows"
        )
    flat = flat_boundaries(rows, lens, seqlen)
    out: dict[str, Any] = {
        "cu_seqlens_rows": tuple(torch.from_numpy(rows.astype(np.int32)).split(lens.tolist()))
    }
    if varlen:
        out["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    out["max_seqlen"] = 0 if layout.cp_size is not None else int(np.diff(flat).max())
    return out, flat


def _collate_columns(
    batch: SampleBatch,
    *,
    varlen: bool,
    dtype: torch.dtype = torch.int64,
    layout: BatchLayout = PLAIN_LAYOUT,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, int]:
    """The fast path for a view's ``__getitems__`` result: whole-batch columns become tensors
    with at most one contiguous copy each (none when already contiguous int64), and the
    ``cu_seqlens`` rows are flattened without building per-sample dicts.  Returns the columns
    (``labels`` not yet renamed; with context parallelism the per-token ones stay numpy arrays
    of int64, which the layout reads and casts to ``dtype`` as it writes), the
    batch-wide boundaries (int64), the rows' boundary counts and
    the row length."""
    n = len(batch)
    if n == 0:
        raise ValueError("samples is empty; a batch needs at least one sample")
    out: dict[str, Any] = {}
    seqlen = None
    for key, col in batch.columns.items():
        if key == "max_seqlen":
            continue  # recomputed below over the whole batch, as for per-sample dicts
        if key in TOKEN_FIELDS and layout.cp_size is not None and col.dtype.kind in "iub":
            out[key] = np.ascontiguousarray(col, dtype=np.int64)  # the layout's copy casts
            seqlen = col.shape[1]
            continue
        int_type = np.int64 if dtype == torch.int64 or key not in TOKEN_FIELDS else np.int32
        arr = np.ascontiguousarray(col, dtype=int_type) if col.dtype.kind in "iub" else col
        out[key] = torch.from_numpy(arr)
        if key in TOKEN_FIELDS:
            seqlen = col.shape[1]
    if seqlen is None:
        raise ValueError("the batch has no per-token field to collate")
    lens = batch.num_cuts.astype(np.int64)
    take = np.arange(batch.cu_seqlens.shape[1]) < lens[:, None]
    rows = batch.cu_seqlens[take].astype(np.int64)
    fields, flat = _boundary_fields(rows, lens, seqlen, varlen, layout)
    out.update(fields)
    return out, flat, lens, seqlen


def _token_dtype(dtype: Any) -> torch.dtype:
    if dtype not in (torch.int64, torch.int32):
        raise ValueError(f"dtype must be torch.int64 or torch.int32, got dtype={dtype!r}")
    return dtype
