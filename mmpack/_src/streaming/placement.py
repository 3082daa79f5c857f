"""Placement: the streaming packer's best-fit rows and the writer of its batches.

:class:`Placement` owns the rows of the batch being built, the placements of its scan (step 2 of
:mod:`mmpack._src.streaming.packer`: one best-fit kernel call per read-ahead,
:func:`~mmpack._src.kernels.plan_bestfit.place_batch`), the writing of the batch and the counts of
what it emitted.  One layout kernel (:func:`~mmpack._src.kernels.streaming_batch.layout_batch`)
orders the placed pieces row by row and removes them from the held ones; their tokens (and loss
masks) are read into one flat buffer (a TokenStore's ``read_ranges``, or one
:func:`~mmpack._src.kernels.streaming_batch.gather_pieces` per live token chunk, which checks the
tokens), from which the one row writer (:func:`~mmpack._src.kernels.packed_rows.fill_rows`, through
:func:`~mmpack._src.kernels.packed_rows.stream_rows`: its arguments folded, the arrays a batch does
not return kept per row count) writes the rows and the causal labels; MLM corrupts them after
(:class:`~mmpack._src.streaming.labels.Labeller`).  The held pieces are topped up in chunks of at
least 3/4 of ``readahead`` (amortising admission; no decision depends on it).  Cost: the scan's
O(scanned * log(rows * row_len)), then one pass over the output and a fixed number of Python calls
per batch, whatever its number of pieces.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mmpack._src.kernels.packed_rows import LABELS_NONE, stream_rows
from mmpack._src.kernels.plan_bestfit import place_batch, row_index
from mmpack._src.kernels.streaming_batch import gather_pieces, layout_batch
from mmpack._src.streaming.admission import Admission
from mmpack._src.streaming.config import PackerConfig
from mmpack._src.streaming.incoming import refuse_wide_ids
from mmpack._src.streaming.labels import Labeller
from mmpack._src.streaming.schedules import BatchSizeWarmup
from mmpack._src.streaming.stats import EmissionCounts

__all__ = ["Placement"]

_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)
_NO_MASK = np.empty(0, dtype=np.uint8)  # no loss mask (fill_rows)
_NO_STARTS = np.empty(0, dtype=np.int64)


class Placement:
    """Builds batches of up to ``batch_size`` rows of ``seqlen`` tokens from the pieces an
    :class:`~mmpack._src.streaming.admission.Admission` holds.

    ``config`` gives the batch's shape, the read-ahead, ``drop_last`` and the padding id;
    ``warmup`` (optional) the rows of each batch from the real tokens emitted so far
    (:attr:`token_count`, kept across epochs); ``labeller`` writes the labels.
    """

    def __init__(
        self, config: PackerConfig, labeller: Labeller, warmup: BatchSizeWarmup | None
    ) -> None:
        batch_size, seqlen = config.batch_size, config.seqlen
        self._batch_size, self._seqlen = batch_size, seqlen
        self._buffer_size, self._readahead = config.buffer_size, config.readahead
        self._drop_last, self._pad_id = config.drop_last, config.pad_id
        self._labeller, self._warmup = labeller, warmup
        self._bits, self._off = row_index(batch_size, seqlen)
        self._remaining = np.full(batch_size, -1, dtype=np.int64)
        self._counts_per_row = np.zeros(batch_size, dtype=np.int64)
        self._out = np.empty((2, 0), dtype=np.int64)  # placements: row, start column
        self._no_eot = np.zeros(0, dtype=np.int64)  # the pieces' eot flags (the eot is a token)
        self._buffers: dict[np.dtype, np.ndarray] = {}  # the gathers' buffers, by dtype
        self._scratch: dict[int, _Scratch] = {}  # the batch's internal arrays, by rows
        self._params: tuple[Any, np.ndarray, int, bool] = (None, _NO_STARTS, 0, False)
        self._counts = EmissionCounts()
        self._token_count = 0

    # ------------------------------------------------------------------------- what others read
    @property
    def counts(self) -> EmissionCounts:
        """A copy of this epoch's counts."""
        return dataclasses.replace(self._counts)

    @property
    def token_count(self) -> int:
        """Real tokens emitted across every epoch (the schedules' clock)."""
        return self._token_count

    @property
    def warmup(self) -> BatchSizeWarmup | None:
        return self._warmup

    @property
    def labeller(self) -> Labeller:
        return self._labeller

    def use(self, labeller: Labeller, warmup: BatchSizeWarmup | None) -> None:
        """Write labels with ``labeller`` and size the batches by ``warmup`` from now on."""
        self._labeller, self._warmup = labeller, warmup

    def start_epoch(self) -> None:
        """Counts at zero (the token count is kept)."""
        self._counts = EmissionCounts()

    def restore(self, token_count: int, counts: EmissionCounts | None = None) -> None:
        """Continue from a state: its token count and, inside an epoch, its counts."""
        self._token_count = token_count
        if counts is not None:
            self._counts = dataclasses.replace(counts)

    # ------------------------------------------------------------------------- a batch
    def next_batch(self, admission: Admission, epoch: int) -> dict[str, Any] | None:
        """The next batch of epoch ``epoch`` from ``admission``'s pieces, or None when the source
        is exhausted (and the last partial batch dropped)."""
        n_rows = self._batch_size
        if self._warmup is not None:
            n_rows = self._warmup(self._token_count)
        pieces = admission.pieces
        budget = self._buffer_size
        if pieces.n < budget + (self._readahead + 3) // 4:
            # Top up in chunks (never changes a decision; amortises admission over batches).
            admission.read_ahead(budget + self._readahead - pieces.n)
        processed = deferred = 0
        while True:
            if self._out.shape[1] < pieces.n:
                grown = np.empty((2, 2 * pieces.n), dtype=np.int64)
                grown[:, :processed] = self._out[:, :processed]
                self._out = grown
            processed, d = place_batch(
                pieces.data, processed, pieces.n, budget - deferred, self._bits, self._off,
                self._remaining, self._counts_per_row, self._seqlen, n_rows, self._out,
            )  # fmt: skip
            deferred += d
            if deferred >= budget:
                break
            admission.read_ahead(max(self._readahead, budget - deferred))  # all were scanned
            if processed == pieces.n:
                break
        return self._emit(admission, epoch, n_rows, processed, processed - deferred)

    def _emit(
        self, admission: Admission, epoch: int, n_rows: int, processed: int, n_placed: int
    ) -> dict[str, Any] | None:
        """The batch of the first ``n_rows`` rows, from the placements of the first
        ``processed`` held pieces (``n_placed`` of them placed); the placed pieces leave the
        held ones.  None when a row is empty and the batch is dropped (the source is
        exhausted)."""
        P = self._seqlen
        pieces = admission.pieces
        placed = np.empty((5, n_placed), _I64)  # (dtype objects: 0.2 us less a call)
        scratch = self._scratch.get(n_rows)
        if scratch is None:
            scratch = self._scratch[n_rows] = _Scratch(n_rows)
        row_ptr = scratch.row_ptr
        n_left, n_tokens, empty_rows, most = layout_batch(
            self._out, processed, pieces.data, pieces.n, n_rows, placed, row_ptr
        )
        if empty_rows and (self._drop_last or empty_rows == n_rows):
            # Only reachable with the source exhausted and nothing deferred.
            pieces.keep(0)
            return None
        pieces.keep(n_left)
        lengths = placed[0]
        mask: tuple[np.ndarray, np.ndarray] | None = None
        if pieces.chunks is None:
            src, starts = admission.read_ranges(placed[1], placed[2], lengths)
            placed[4] = starts  # where the row writer reads each piece
            if admission.masked:
                values, at = admission.read_ranges(placed[1], placed[2], lengths, mask=True)
                mask = values, np.asarray(at, _I64)
        else:
            src, mask = self._gather(admission, placed, n_tokens)
        labeller = self._labeller
        if self._params[0] is not labeller:  # the row writer's parameters, once per labeller
            mode = labeller.label_mode
            row_params = [self._pad_id, mode, labeller.options.ignore_index]
            targeted = labeller.options.mode is not None  # else no targets: no labeller call
            self._params = (labeller, np.array(row_params, _I64), mode, targeted)
        _, params, label_mode, targeted = self._params
        ids = np.empty((n_rows, P), _I64)
        attention = np.empty((n_rows, P), _I64)
        labels = np.empty((n_rows, P), _I64) if label_mode != LABELS_NONE else scratch.unwritten
        width = most + 2
        cu_flat = np.empty(n_rows * width, _I32)  # each row's cu_seqlens: a 1-D slice
        if self._no_eot.shape[0] < n_placed:  # read up to n_placed only
            self._no_eot = np.zeros(2 * n_placed, _I64)
        values, mask_starts = mask if mask is not None else (_NO_MASK, _NO_STARTS)
        stream_rows(
            src, placed, self._no_eot, scratch.rows, params, ids, labels, attention, cu_flat,
            values, mask_starts,
        )  # fmt: skip
        per_row = scratch.rows.tolist()  # row_ptr, segments, longest segment of each row
        ends = per_row[n_rows + 1 : 2 * n_rows + 1]
        cu_seqlens = [cu_flat[a : a + k + 1] for a, k in zip(range(0, n_rows * width, width), ends)]
        counts = self._counts
        targets, mask_prob = None, None
        if targeted:
            targets, mask_prob = labeller(
                ids, attention, labels, lengths, row_ptr, epoch, counts.n_batches,
                self._token_count, mask,
            )  # fmt: skip
        self._token_count += n_tokens
        counts.n_tokens += n_tokens
        counts.n_rows += n_rows
        counts.n_pieces += n_placed
        counts.n_batches += 1
        batch: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": attention,
            "targets": targets,
            "cu_seqlens": cu_seqlens,
            "max_seqlen": per_row[2 * n_rows + 1 :],
        }
        if labeller.cooldown is not None:  # a batch carries the ratio of its cool-down
            batch["mask_prob"] = np.asarray(mask_prob, dtype=np.float32)
        return batch

    def _gather(
        self, admission: Admission, placed: np.ndarray, n_tokens: int
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The placed pieces' tokens of an in-memory source, one after the other in one buffer
        (the chunks' dtype when they share one, else int64: the shape of a store's
        ``read_ranges``, the starts being ``placed[4]``), and with loss masks their masks the
        same way (uint8, same starts), else None: one kernel call per live chunk (and one more
        per chunk for masks), each token copied once; then check the tokens and release the
        chunks no longer referenced."""
        pieces = admission.pieces
        chunks = pieces.chunks
        assert chunks is not None
        lengths, positions, starts = placed[0], placed[3], placed[4]
        dtype = chunks[0][1].dtype if chunks else _I64
        for _, chunk in chunks:
            if chunk.dtype is not dtype and chunk.dtype != dtype:
                dtype = _I64
                break
        src = self._buffer(dtype, n_tokens)
        bits = 0
        for base, chunk in chunks:  # a few (0.35 us a call)
            bits |= gather_pieces(chunk, base, positions, lengths, starts, src)
        mask = None
        if admission.masked:
            values = self._buffer(np.dtype(np.uint8), n_tokens)
            values[:] = 0
            for (base, _), m in zip(chunks, pieces.masks):
                if m is not None:
                    gather_pieces(m, base, positions, lengths, starts, values)
            mask = values, starts
        if bits < 0:  # a negative token, or a uint64 id >= 2**63 (negative in the int64 row)
            placed_tokens = [pieces.tokens(g, n) for g, n in zip(positions, lengths)]
            refuse_wide_ids(placed_tokens)
            lowest = min(int(np.min(p)) for p in placed_tokens if len(p))
            raise ValueError(
                f"a source sequence has a negative token {lowest}; tokens must be non-negative "
                "integers"
            )
        oldest = admission.oldest_position()
        if chunks and (oldest is None or chunks[0][0] + chunks[0][1].shape[0] <= oldest):
            pieces.release(oldest)  # (only when the oldest chunk is unused: 0.5 us a call)
        return src, mask

    def _buffer(self, dtype: np.dtype, n: int) -> np.ndarray:
        """``n`` items of a reused buffer of ``dtype`` (a gather's: read by the row writer
        before the next batch; a fresh large array per batch would cost its page faults)."""
        buf = self._buffers.get(dtype)
        if buf is None or buf.shape[0] < n:
            buf = self._buffers[dtype] = np.empty(n + n // 4, dtype)
        return buf[:n]


class _Scratch:
    """The arrays of a batch of ``n_rows`` rows that it does not return, kept across batches:
    ``rows`` (:func:`~mmpack._src.kernels.packed_rows.stream_rows`'s: each row's piece range,
    ``row_ptr``, then each row's segments and longest segment, read into Python before the next
    batch) and ``unwritten`` (labels not written)."""

    __slots__ = ("row_ptr", "rows", "unwritten")

    def __init__(self, n_rows: int) -> None:
        self.rows = np.zeros(3 * n_rows + 1, _I64)
        self.row_ptr = self.rows[: n_rows + 1]
        self.unwritten = np.empty((n_rows, 0), _I64)
