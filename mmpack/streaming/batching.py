"""How the streaming packer builds one batch: best-fit placement of the held pieces, then rows,
labels and counters.

A batch of ``n_rows`` empty rows scans the held pieces in order (reading ahead when they run out)
and the best-fit kernel (:mod:`mmpack.kernels.streaming`) puts each into the row with the
smallest remaining space that holds it, or defers it, until ``buffer_size`` pieces are deferred
or the source is exhausted: O(scanned * log(rows * row_len)).  Then each row is
written by one ``np.concatenate`` of its pieces straight into the output row (a TokenStore's pieces
are copied by a kernel straight from its memory map); a kernel writes the padding, the attention
mask and the ``cu_seqlens``; the labels follow the mode (MLM corruption keyed by the position in
the stream, causal labels that never cross a piece).  The placed pieces leave the buffer and the
counters advance.  Cost: one pass over the output plus O(rows) Python calls per batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mmpack.core.options import Mode
from mmpack.kernels.streaming import (
    finish_rows,
    place_best_fit,
    reset_rows,
    row_boundaries,
    scatter_pieces,
)
from mmpack.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown
from mmpack.streaming.sources import PieceBuffer
from mmpack.views.masking import corrupt_rows, row_keys

__all__: list[str] = []


class _Batching:
    """The batch-building part of :class:`mmpack.streaming.packer.StreamingPacker` (a mixin: the
    packer owns the attributes declared here)."""

    source: Any
    out_batch_size: int
    out_pseq_len: int
    buffer_size: int
    readahead: int
    drop_last: bool
    batch_size_schedule: BatchSizeWarmup | None
    mode: str | None
    pad_id: int
    ignore_index: int
    seed: int
    mask_prob: float
    mask_id: int | None
    vocab_size: int | None
    return_tensors: str
    mask_prob_schedule: MaskingRatioCooldown | None
    token_count: int
    tokens_emitted: int
    slots_emitted: int
    seqs_emitted: int
    batches_emitted: int
    _epoch: int
    _excluded: np.ndarray | None
    _pieces: PieceBuffer
    _out_row: np.ndarray
    _out_off: np.ndarray
    _counts: np.ndarray
    _remaining: np.ndarray
    _words: np.ndarray
    _level_off: np.ndarray
    _level_len: np.ndarray

    if TYPE_CHECKING:  # the admission mixin's (mmpack.streaming.admission)

        def _read_ahead(self, want: int) -> None: ...

    def _next_batch(self) -> dict[str, Any] | None:
        P = self.out_pseq_len
        n_rows = self.out_batch_size
        if self.batch_size_schedule is not None:
            n_rows = self.batch_size_schedule(self.token_count)
        if self._pieces.n < self.buffer_size + self.readahead:
            self._read_ahead(self.buffer_size + self.readahead - self._pieces.n)
        reset_rows(self._words, self._level_off, self._remaining, self._counts, n_rows, P)
        processed = deferred = 0
        while True:
            if processed == self._pieces.n:
                self._read_ahead(max(self.readahead, self.buffer_size - deferred))
                if processed == self._pieces.n:
                    break
            n_held = self._pieces.n
            if self._out_row.shape[0] < n_held:
                self._out_row = _grown(self._out_row, 2 * n_held, processed)
                self._out_off = _grown(self._out_off, 2 * n_held, processed)
            k, d = place_best_fit(
                self._pieces.lens[processed:],
                self.buffer_size - deferred,
                self._words,
                self._level_off,
                self._level_len,
                self._remaining,
                self._counts,
                P,
                self._out_row[processed:],
                self._out_off[processed:],
            )
            processed += int(k)
            deferred += int(d)
            if deferred >= self.buffer_size:
                break

        counts = self._counts[:n_rows]
        if counts.min() == 0:
            # Only reachable with the source exhausted and nothing deferred.
            if self.drop_last or counts.max() == 0:
                self._pieces.keep(np.zeros(self._pieces.n, dtype=bool))
                return None
        return self._emit(n_rows, processed)

    def _emit(self, n_rows: int, processed: int) -> dict[str, Any]:
        """The batch of the first ``n_rows`` rows, from the placements of the first
        ``processed`` held pieces; the placed pieces leave the buffer."""
        P = self.out_pseq_len
        pieces = self._pieces
        rows = self._out_row[:processed]
        placed = np.flatnonzero(rows >= 0)
        p_rows = rows[placed]
        p_offs = self._out_off[:processed][placed]
        p_lens = pieces.lens[placed]
        used = P - self._remaining[:n_rows]
        ids, attention = self._write_rows(placed, p_rows, p_offs, p_lens, n_rows, used)

        cu_flat = np.empty(placed.shape[0] + 2 * n_rows, dtype=np.int32)
        bounds = np.empty(n_rows + 1, dtype=np.int64)
        longest = np.empty(n_rows, dtype=np.int64)
        row_boundaries(p_rows, p_lens, n_rows, used, P, cu_flat, bounds, longest)
        b = bounds.tolist()
        cu_seqlens = [cu_flat[b[r] : b[r + 1]] for r in range(n_rows)]
        max_seqlen = longest.tolist()

        keep = np.ones(pieces.n, dtype=bool)
        keep[placed] = False
        pieces.keep(keep)

        labels, mask_prob = self._labels(ids, attention, p_rows, p_offs, p_lens, n_rows)
        n_tokens = int(used.sum())
        self.token_count += n_tokens
        self.tokens_emitted += n_tokens
        self.slots_emitted += n_rows * P
        self.seqs_emitted += int(placed.shape[0])
        self.batches_emitted += 1

        batch: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": attention,
            "labels": labels,
            "cu_seqlens": cu_seqlens,
            "max_seqlen": max_seqlen,
        }
        if self.mask_prob_schedule is not None:
            batch["mask_prob"] = np.asarray(mask_prob, dtype=np.float32)
        if self.return_tensors == "pt":
            batch = _to_torch(batch)
        return batch

    def _write_rows(
        self,
        placed: np.ndarray,
        p_rows: np.ndarray,
        p_offs: np.ndarray,
        p_lens: np.ndarray,
        n_rows: int,
        used: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``input_ids`` and ``attention_mask`` (int64, (n_rows, out_pseq_len)) of the placed
        pieces, padding included."""
        P = self.out_pseq_len
        pieces = self._pieces
        counts = self._counts[:n_rows]
        ids = np.empty((n_rows, P), dtype=np.int64)
        attention = np.empty((n_rows, P), dtype=np.int64)
        if pieces.objs is None:
            flat_starts = self.source.offsets[pieces.src[placed]].astype(np.int64)
            flat_starts += pieces.src_off[placed]
            src, src_starts = self.source.read_ranges(flat_starts, p_lens)
            scatter_pieces(src, np.asarray(src_starts, dtype=np.int64), p_lens, p_rows, p_offs, ids)
        else:
            objs = pieces.objs[placed][np.argsort(p_rows, kind="stable")].tolist()
            ends = np.cumsum(counts).tolist()
            for r in range(n_rows):
                if counts[r]:
                    _concat_row(objs[ends[r] - counts[r] : ends[r]], ids[r, : used[r]])
        finish_rows(used, self.pad_id, ids, attention)
        return ids, attention

    def _labels(
        self,
        ids: np.ndarray,
        attention: np.ndarray,
        p_rows: np.ndarray,
        p_offs: np.ndarray,
        p_lens: np.ndarray,
        n_rows: int,
    ) -> tuple[np.ndarray | None, float | None]:
        """The labels of the batch by the mode (MLM corrupts ``ids`` in place) and the masking
        ratio used (MLM only)."""
        if self.mode == Mode.MLM:
            mask_prob = self.mask_prob
            if self.mask_prob_schedule is not None:
                mask_prob = self.mask_prob_schedule(self.token_count)
            assert self._excluded is not None
            assert self.mask_id is not None and self.vocab_size is not None  # check_masking
            rows_in_stream = (self.batches_emitted << 32) + np.arange(n_rows, dtype=np.int64)
            labels = corrupt_rows(
                ids,
                attention,
                row_keys(self.seed, self._epoch, rows_in_stream),
                mask_prob=mask_prob,
                mask_id=self.mask_id,
                vocab_size=self.vocab_size,
                excluded=self._excluded,
                ignore_index=self.ignore_index,
            )
            return labels, mask_prob
        if self.mode == Mode.CAUSAL:
            labels = np.full_like(ids, self.ignore_index)
            labels[:, :-1] = ids[:, 1:]
            labels[p_rows, p_offs + p_lens - 1] = self.ignore_index
            labels[attention == 0] = self.ignore_index
            return labels, None
        return None, None


def _concat_row(pieces: list[Any], out: np.ndarray) -> None:
    try:
        np.concatenate(pieces, out=out, casting="same_kind")
    except TypeError as exc:
        raise TypeError(f"source sequences must hold integer token ids: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"source sequences must be 1-D sequences of token ids: {exc}") from None
    if out.size and out.min() < 0:
        for p in pieces:  # a uint64 id >= 2**63 wraps negative in the int64 row: name it
            a = np.asarray(p)
            if a.dtype == np.uint64 and a.size and int(a.max()) > 2**63 - 1:
                raise ValueError(
                    f"source sequences must hold token ids < 2**63 (they are returned as int64), "
                    f"got {int(a.max())}"
                )
        raise ValueError(
            f"a source sequence has a negative token {int(out.min())}; tokens must be "
            "non-negative integers"
        )


def _to_torch(batch: dict[str, Any]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key in ("cu_seqlens",):
            out[key] = [torch.from_numpy(x) for x in value]
        elif key == "max_seqlen" or value is None:
            out[key] = value
        else:
            out[key] = torch.from_numpy(np.ascontiguousarray(value))
    return out


def _grown(a: np.ndarray, size: int, keep: int) -> np.ndarray:
    out = np.empty(size, dtype=a.dtype)
    out[:keep] = a[:keep]
    return out
