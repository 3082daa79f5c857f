"""How the streaming packer builds one batch: best-fit placement of the held pieces, then rows,
labels and counters.

A batch of ``n_rows`` empty rows scans the held pieces in order (reading ahead when they run out)
and the best-fit kernel (:mod:`mmpack.kernels.streaming`) puts each into the row with the
smallest remaining space that holds it, or defers it, until ``buffer_size`` pieces are deferred
or the source is exhausted: O(scanned * log(rows * row_len)), one kernel call (a piece longer
than every row's free space is deferred without a lookup).  One layout kernel
(:mod:`mmpack.kernels.streaming_batch`) orders the placed pieces row by row, writes the
``cu_seqlens``, the longest segments and the attention mask, and removes the placed pieces from
the buffer; one write kernel per live token chunk copies the placed pieces into the rows and
checks their tokens, one more writes the padding (a TokenStore's pieces are copied by a kernel
straight from its memory map); the labels follow the
mode (MLM corruption keyed by the position in the stream, causal labels that never cross a
piece).  The held pieces are topped up in chunks of at least 3/4 of ``readahead`` (amortising
admission; no decision depends on it).  Cost: one pass over the output and a fixed number of
Python calls per batch, whatever its number of pieces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mmpack.core.options import Mode
from mmpack.kernels.streaming import pad_rows, place_batch, scatter_pieces
from mmpack.kernels.streaming_batch import layout_batch, write_pieces
from mmpack.streaming.pieces import PieceBuffer
from mmpack.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown
from mmpack.views.masking import corrupt_rows, row_keys

__all__: list[str] = []

_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)
_NO_ORDER = np.empty(0, dtype=np.int64)  # an empty int64 (layout_batch's order, write's pad)


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
    _out: np.ndarray
    _store_like: bool
    _q_pos: np.ndarray
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
        pieces = self._pieces
        if pieces.n < self.buffer_size + (self.readahead + 3) // 4:
            # Top up in chunks (never changes a decision; amortises admission over batches).
            self._read_ahead(self.buffer_size + self.readahead - pieces.n)
        processed = deferred = 0
        while True:
            if self._out.shape[1] < pieces.n:
                grown = np.empty((2, 2 * pieces.n), dtype=np.int64)
                grown[:, :processed] = self._out[:, :processed]
                self._out = grown
            processed, d = place_batch(
                pieces.data, processed, pieces.n, self.buffer_size - deferred, self._words,
                self._level_off, self._level_len, self._remaining, self._counts, P, n_rows,
                self._out,
            )  # fmt: skip
            deferred += d
            if deferred >= self.buffer_size:
                break
            self._read_ahead(max(self.readahead, self.buffer_size - deferred))  # all were scanned
            if processed == pieces.n:
                break
        return self._emit(n_rows, processed, processed - deferred)

    def _new_pieces(self) -> PieceBuffer:
        """An empty piece buffer (with token chunks for an in-memory source)."""
        return PieceBuffer(with_chunks=not self._store_like)

    def _emit(self, n_rows: int, processed: int, n_placed: int) -> dict[str, Any] | None:
        """The batch of the first ``n_rows`` rows, from the placements of the first
        ``processed`` held pieces (``n_placed`` of them placed); the placed pieces leave the
        buffer.  None when a row is empty and the batch is dropped (the source is exhausted)."""
        P = self.out_pseq_len
        pieces = self._pieces
        placed = np.empty((6, n_placed), _I64)  # (dtype objects: 0.2 us less a call)
        cu_flat = np.empty(n_placed + 2 * n_rows, _I32)
        per_row = np.empty(3 * n_rows + 1, _I64)
        ids = np.empty((n_rows, P), _I64)
        attention = np.empty((n_rows, P), _I64)
        pieces.n, n_tokens, empty_rows, _ = layout_batch(
            self._out, processed, pieces.data, pieces.n, self._remaining, n_rows, P,
            0, placed, cu_flat, per_row, _NO_ORDER, attention,
        )  # fmt: skip
        if empty_rows and (self.drop_last or empty_rows == n_rows):
            # Only reachable with the source exhausted and nothing deferred.
            pieces.n = 0
            return None
        used = per_row[2 * n_rows + 1 :]
        if pieces.chunks is None:
            self._read_rows(placed, used, ids)
        else:
            self._write_rows(placed, n_rows, used, ids)
        b = per_row.tolist()
        cu_seqlens = [cu_flat[b[r] : b[r + 1]] for r in range(n_rows)]
        max_seqlen = b[n_rows + 1 : 2 * n_rows + 1]
        labels, mask_prob = None, None
        if self.mode is not None:
            labels, mask_prob = self._labels(
                ids, attention, placed[0], placed[1], placed[2], n_rows
            )
        self.token_count += n_tokens
        self.tokens_emitted += n_tokens
        self.slots_emitted += n_rows * P
        self.seqs_emitted += n_placed
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
        self, placed: np.ndarray, n_rows: int, used: np.ndarray, ids: np.ndarray
    ) -> None:
        """Write the placed pieces of an in-memory source (and the padding) into ``ids`` (int64,
        (rows, out_pseq_len)): one kernel call per live chunk, each token copied once; then
        check the tokens written and release the chunks no longer referenced."""
        pieces = self._pieces
        chunks = pieces.chunks
        assert chunks is not None
        bits = 0
        pad = used  # the first call writes the padding too
        for base, chunk in chunks:  # a few (0.35 us a call that writes nothing)
            bits |= write_pieces(chunk, base, placed, n_rows, ids, pad, self.pad_id)
            pad = _NO_ORDER
        if pad is used:  # no chunk (only when no piece is placed)
            pad_rows(used, self.pad_id, ids)
        if bits < 0:
            _refuse_tokens([pieces.tokens(g, n) for g, n in zip(placed[5], placed[2])])
        if pieces.n:
            oldest: int | None = int(pieces.data[3, 0])
        else:
            oldest = int(self._q_pos[0]) if self._q_pos.shape[0] else None
        if chunks and (oldest is None or chunks[0][0] + chunks[0][1].shape[0] <= oldest):
            pieces.release(oldest)  # (only when the oldest chunk is unused: 0.5 us a call)

    def _read_rows(self, placed: np.ndarray, used: np.ndarray, ids: np.ndarray) -> None:
        """Write the placed pieces of a store-like source into ``ids`` (int64, (rows,
        out_pseq_len)), padding included, straight from its mapping."""
        p_lens = placed[2]
        flat_starts = self.source.offsets[placed[3]].astype(np.int64)
        flat_starts += placed[4]
        src, src_starts = self.source.read_ranges(flat_starts, p_lens)
        starts = np.asarray(src_starts, dtype=np.int64)
        scatter_pieces(src, starts, p_lens, placed[0], placed[1], ids)
        pad_rows(used, self.pad_id, ids)

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


def _refuse_tokens(pieces: list[Any]) -> None:
    """Raise for the negative token (or the uint64 id >= 2**63, which wraps negative in the
    int64 row) among ``pieces``."""
    for p in pieces:
        a = np.asarray(p)
        if a.dtype == np.uint64 and a.size and int(a.max()) > 2**63 - 1:
            raise ValueError(
                f"source sequences must hold token ids < 2**63 (they are returned as int64), "
                f"got {int(a.max())}"
            )
    lowest = min(int(np.min(p)) for p in pieces if len(p))
    raise ValueError(
        f"a source sequence has a negative token {lowest}; tokens must be non-negative integers"
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
