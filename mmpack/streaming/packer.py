"""Streaming best-fit packer: a stream of variable-length sequences to fixed-shape packed batches.

:class:`StreamingPacker` does what ModernBERT's ``GreedyBestFitSequencePacker`` (the seed) does,
with the same placement decisions, but with every placement in a numba kernel in
O(log(rows * row_len)) instead of a Python iteration with an O(rows) scan:

1. Sequences arrive from the source (an iterable of sequences, of batches of sequences, or a
   random-access store), are checked by the token rule of :func:`mmpack.build` (one function for
   both), and are *admitted* as pieces: empty sequences are ignored (and counted),
   sequences longer than a row follow the ``long_docs`` policy (``"split"`` into pieces of at most
   ``out_pseq_len`` tokens, every token kept; ``"truncate"``; ``"drop"``).  ModernBERT's packer has no policy:
   a sequence longer than a row never fits, stays in its buffer forever, and once enough of them
   fill the buffer the epoch ends early, silently dropping the rest of the source.
2. A batch of ``n_rows`` empty rows scans the pieces in order -- first those deferred by the
   previous batch, then new ones -- and puts each into the row with the smallest remaining space
   that holds it (ties to the lowest row), or defers it.  The scan stops once ``buffer_size``
   pieces have been deferred, or when the source is exhausted.  This is exactly ModernBERT's packer's
   behaviour (it scans its buffer and refills it whenever it runs dry, until the deferred
   sequences fill it) at the granularity of single sequences instead of incoming batches; the
   deferred pieces keep their order (ModernBERT's ``extendleft`` reverses them).  Pieces are read
   ahead of the scan (``readahead``, default ``buffer_size``), which never changes a decision: at
   most ``buffer_size`` pieces are ever *buffered* in ModernBERT's sense, so memory is bounded by
   ``buffer_size + readahead`` pieces plus one incoming batch.  Admission is lazy and exact: the
   sequences read go to a queue, and exactly as many pieces as wanted are cut from its head, so a
   document of any length is admitted piece by piece (one 2**26-token document costs 0.95x the
   per-batch time of the same tokens as 64-token documents; 178x when all its pieces were
   admitted at once: ``benchmarks/bench_streaming_long_doc.py``).  Admission is transactional:
   the position passes a sequence only once its pieces are held, so a source that raises loses
   nothing and :meth:`StreamingPacker.state_dict` taken then resumes exactly.
3. The batch is emitted when every row holds at least one piece.  When the source runs out with
   some row empty, ModernBERT's packer drops that last partial batch; so does ``drop_last=True``, while
   ``drop_last=False`` emits it padded (empty rows are all padding) and ends the epoch.

Held pieces are one int64 array (length, source index, offset, global token position per
piece).  For an in-memory source each incoming batch of sequences is joined into one token
*chunk* when read (:mod:`mmpack.streaming.pieces`), and a piece is its position in the chunks:
no Python object per sequence.  Per batch a fixed number of calls whatever the
number of pieces: one placement kernel, one layout kernel (row-major order, ``cu_seqlens``,
attention mask, compaction of the held pieces), one write kernel per live chunk (usually 2-3)
copying every placed token once into the int64 rows and checking it, one padding kernel (a
TokenStore's pieces are copied by a kernel straight from its memory map).  Per incoming batch:
one pass each over the dtypes, lengths and ndims, then the join (:mod:`.incoming`).
Measured (``python -m benchmarks.bench_streaming_floor``; 30k lognormal sequences, 8 x 2048,
buffer 512; thread CPU time, medians of 11 interleaved runs, 2 shared cores at load 2.4-2.8):
1.42x the write-once floor (a Python loop writing each sequence once into int64 rows: 0.025 s
against 0.018 s; 1.81-1.91x before the token chunks), 6.1x faster than ModernBERT's packer
on int32 numpy arrays; on Python lists 0.94-0.97x the floor of one ``np.array`` per list,
1.2x faster than ModernBERT's packer.  Under heavier load the ratio drifts up (1.6x at load
3.4).  Where the time goes (per output batch of ~40 pieces, ~22 us): writing its 16K tokens
and padding from 2-3 chunks (~4.5 us), the layout and the attention mask (~4 us), the
best-fit scan of up to ``buffer_size`` deferred pieces (~3.5 us), the batch's arrays,
``cu_seqlens`` views and bookkeeping in Python (~8 us); per sequence ~0.25 us (the passes
over dtypes, lengths and ndims, and the join, which reads the source).

Outputs: ``input_ids``, ``attention_mask`` (int64, ``(n_rows, out_pseq_len)``; the mask comes
from the piece positions, so a real token equal to ``pad_id`` is still attended), ``labels``
(``None``, MLM labels or causal labels), ``cu_seqlens`` (one int32 array per row: 0, the end of
each piece, and ``out_pseq_len`` when the row has padding -- the padding is one more segment, as in
the seed), ``max_seqlen`` (one int per row, the longest segment, padding included, as in the
seed), and ``mask_prob`` (float32 scalar) when a masking cool-down is active.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mmpack.core.constants import IGNORE_INDEX
from mmpack.core.options import LongDocs, Mode, ReturnTensors, SourceFormat, parse_option
from mmpack.core.validation import check_bool, check_positive_int, check_seed, check_token_id
from mmpack.kernels.streaming import bitmap_layout
from mmpack.streaming.admission import _Admission
from mmpack.streaming.batching import _Batching
from mmpack.streaming.checkpoint import _Checkpointing
from mmpack.streaming.schedules import token_schedules
from mmpack.streaming.sources import detect_format, propagate_epoch, source_kind
from mmpack.views.masking import check_masking

__all__ = ["StreamingPacker"]

_PEEK = 64


def _row_length(seqlen: Any, out_pseq_len: Any) -> int:
    """The row length from ``seqlen=`` or its ModernBERT name ``out_pseq_len=`` (one, or both
    equal): ``TypeError`` when neither is given, ``ValueError`` when they differ."""
    if seqlen is None and out_pseq_len is None:
        raise TypeError("StreamingPacker needs the row length: seqlen= (or out_pseq_len=)")
    if seqlen is None:
        return check_positive_int(out_pseq_len, "out_pseq_len")
    value = check_positive_int(seqlen, "seqlen")
    if out_pseq_len is not None and check_positive_int(out_pseq_len, "out_pseq_len") != value:
        raise ValueError(
            f"seqlen={value} and out_pseq_len={out_pseq_len} name the same row length; "
            "give one of them"
        )
    return value


class StreamingPacker(_Admission, _Batching, _Checkpointing):
    """Pack a stream of variable-length token sequences into ``(rows, out_pseq_len)`` batches.

    Parameters
    ----------
    source : iterable
        Either an iterable of sequences (lists, 1-D numpy arrays or torch tensors of token ids,
        or dicts with ``"input_ids"``), or an iterable of incoming batches (each a list of such
        sequences, a 2-D array, or a dict whose ``"input_ids"`` is one of those), as the seed.
        ``source_format="auto"`` tells them apart from the first non-empty element (a sequence
        starts with a scalar, a batch with a sequence).  A random-access source of sequences --
        a :class:`~mmpack.store.reader.TokenStore` (read through ``read_ranges``, without a Python call
        per document), a view, a map-style dataset, a list -- is read by index, which is what
        makes :meth:`state_dict` possible.  Sequences are held (not copied) until joined, which
        may be after the next incoming batch is asked for: a source must not refill the arrays
        it yielded (as with ModernBERT's packer, which holds them in its buffer).
    out_batch_size : int
        Rows per batch (the maximum, with a batch-size warm-up).
    seqlen, out_pseq_len : int
        Tokens per row (the row length).  ``seqlen`` is its name across mmpack (as in
        :class:`~mmpack.views.window.WindowDataset` and :class:`~mmpack.views.packed.PackedDataset`);
        ``out_pseq_len`` is ModernBERT's packer's keyword, kept so its configurations run
        unchanged.  Give either; both only with the same value (``ValueError`` otherwise).
    buffer_size : int
        At most this many pieces are deferred (buffered) by one batch; ``>= out_batch_size``.
    mode : {None, "causal", "mlm"}
        ``None``: ``labels`` is ``None`` (ModernBERT's ``suppress_masking``).  ``"mlm"``: 80/10/10
        masking (:mod:`mmpack.views.masking`); random tokens come from
        ``[0, vocab_size)`` minus ``special_ids``, ``mask_id`` and ``pad_id``; padding and special
        ids are never selected.  ``"causal"``: ``labels[t] = input_ids[t + 1]`` inside a piece,
        ``ignore_index`` at each piece's last token and on padding.
    pad_id : int
        Token written into padding.
    mask_id, vocab_size : int
        Required for ``"mlm"``.
    special_ids : iterable of int
        Never masked, never drawn as random replacements (``"mlm"``).
    mask_prob : float
        Masking ratio in ``[0, 1]`` (the cool-down's initial ratio when one is configured).
    ignore_index : int
        Label of positions without loss.
    long_docs : {"split", "truncate", "drop"}
        What to do with a sequence longer than ``out_pseq_len``.
    drop_last : bool
        Drop (``True``, as the seed) or emit padded (``False``) the last batch of an epoch when
        the source runs out before every row holds a piece.
    source_format : {"auto", "sequences", "batches"}
    seed : int
        Row ``r`` of the ``b``-th batch of epoch ``e`` is corrupted with the key of
        ``(seed, e, b * 2**32 + r)`` (:func:`mmpack.views.masking.row_keys`): masks are a pure function
        of the position in the stream, so a resumed run reproduces them without generator state.
    return_tensors : {"np", "pt"}
        numpy arrays (default) or torch tensors (zero-copy ``torch.from_numpy``).
    readahead : int, optional
        Pieces read ahead of the scan (default ``buffer_size``); affects memory and speed only.
    batch_size_warmup_min_size, batch_size_warmup_tokens
        Grow the rows from the former to ``out_batch_size`` over the latter (an int or
        ``"…tok"``); see :class:`~mmpack.streaming.schedules.BatchSizeWarmup`.
    masking_ratio_cooldown_tokens, masking_ratio_cooldown_start_tokens, final_masking_ratio,
    masking_cooldown_schedule_type, masking_ratio_step_size
        Lower the masking ratio from ``mask_prob`` to ``final_masking_ratio``; see
        :class:`~mmpack.streaming.schedules.MaskingRatioCooldown`.  ``"mlm"`` only.
    world_size : int
        Ranks sharing the schedules' token durations.

    Notes
    -----
    Every ``iter(packer)`` is one pass over the source (an epoch): counters and buffers are reset,
    the masking generator is reseeded from ``(seed, epoch)`` and the epoch is passed to
    ``set_epoch`` of the source, of a DataLoader's sampler (e.g. a ``DistributedSampler`` or
    :class:`~mmpack.torch.sampler.ResumableSampler`) and of its batch sampler.  Epochs count from 0;
    :meth:`set_epoch` chooses the next one.  The schedules' token count is kept across epochs.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        out_batch_size: int,
        out_pseq_len: int | None = None,
        buffer_size: int,
        mode: str | None = None,
        pad_id: int = 0,
        mask_id: int | None = None,
        vocab_size: int | None = None,
        special_ids: Iterable[int] = (),
        mask_prob: float = 0.3,
        ignore_index: int = IGNORE_INDEX,
        long_docs: str = "split",
        drop_last: bool = True,
        source_format: str = "auto",
        seed: int = 42,
        return_tensors: str = "np",
        readahead: int | None = None,
        batch_size_warmup_min_size: int | None = None,
        batch_size_warmup_tokens: Any = None,
        masking_ratio_cooldown_tokens: Any = None,
        masking_ratio_cooldown_start_tokens: Any = 0,
        final_masking_ratio: float | None = None,
        masking_cooldown_schedule_type: str = "linear",
        masking_ratio_step_size: float | None = None,
        world_size: int = 1,
        seqlen: int | None = None,
    ) -> None:
        self.out_batch_size = check_positive_int(out_batch_size, "out_batch_size")
        self.out_pseq_len = _row_length(seqlen, out_pseq_len)
        self.buffer_size = check_positive_int(buffer_size, "buffer_size")
        if self.buffer_size < self.out_batch_size:
            raise ValueError(
                f"buffer_size={buffer_size} must be >= out_batch_size={out_batch_size}"
            )
        self.mode: str | None = None if mode is None else parse_option(Mode, mode, "mode").value
        self.long_docs: str = parse_option(LongDocs, long_docs, "long_docs").value
        self.source_format: str = parse_option(SourceFormat, source_format, "source_format").value
        self.return_tensors: str = parse_option(
            ReturnTensors, return_tensors, "return_tensors"
        ).value
        self.drop_last = check_bool(drop_last, "drop_last")
        self.seed = check_seed(seed)
        self.readahead = check_positive_int(
            self.buffer_size if readahead is None else readahead, "readahead"
        )
        self.pad_id = check_token_id(pad_id, "pad_id")
        self.ignore_index = check_token_id(ignore_index, "ignore_index")
        masking = check_masking(
            self.mode == Mode.MLM,
            mask_prob=mask_prob,
            mask_id=mask_id,
            vocab_size=vocab_size,
            special_ids=special_ids,
            pad_id=self.pad_id,
        )
        self.mask_prob = masking.mask_prob
        self.special_ids = masking.special_ids
        self.mask_id, self.vocab_size = masking.mask_id, masking.vocab_size
        self._excluded: np.ndarray | None = masking.excluded if self.mode == Mode.MLM else None
        self.batch_size_schedule, self.mask_prob_schedule = token_schedules(
            self.out_batch_size,
            self.mask_prob,
            self.mode,
            batch_size_warmup_min_size=batch_size_warmup_min_size,
            batch_size_warmup_tokens=batch_size_warmup_tokens,
            masking_ratio_cooldown_tokens=masking_ratio_cooldown_tokens,
            masking_ratio_cooldown_start_tokens=masking_ratio_cooldown_start_tokens,
            final_masking_ratio=final_masking_ratio,
            masking_cooldown_schedule_type=masking_cooldown_schedule_type,
            masking_ratio_step_size=masking_ratio_step_size,
            world_size=world_size,
        )
        self.source = source
        self._indexed, self._store_like = source_kind(source, self.source_format, _PEEK)
        self._init_state()

    def _init_state(self) -> None:
        """The best-fit kernel's row state, the piece buffer and the position (before epoch 0)."""
        stride = self.out_batch_size
        self._level_off, self._level_len = bitmap_layout((self.out_pseq_len + 1) * stride)
        self._words = np.zeros(int(self._level_off[-1]) + 1, dtype=np.int64)
        self._remaining = np.full(stride, -1, dtype=np.int64)
        self._counts = np.zeros(stride, dtype=np.int64)
        self._pieces = self._new_pieces()
        self._out = np.empty((2, 0), dtype=np.int64)  # placements: row, start column
        self._next_epoch = 0
        self._epoch = -1
        self._in_epoch = False
        self._resume: dict[str, Any] | None = None
        self._generation = 0
        self.token_count = 0
        self._reset_counters()
        self._iterator: Iterator[Any] | None = None
        self._carry: list[Any] = []
        self._reset_queue()

    # ------------------------------------------------------------------------- alternate builder
    @classmethod
    def from_micro_batches(
        cls,
        source: Iterable[Any],
        *,
        batch_size: int,
        micro_batch_size: int,
        max_seq_len: int,
        buffer_size: int = 5120,
        batch_size_warmup_min_size: int | None = None,
        **kwargs: Any,
    ) -> StreamingPacker:
        """ModernBERT's ``from_composer``: a global batch of ``batch_size`` sequences of
        ``max_seq_len`` becomes ``batch_size // micro_batch_size`` rows of
        ``micro_batch_size * max_seq_len`` tokens; the warm-up minimum is given in sequences
        (a multiple of ``micro_batch_size``)."""
        if micro_batch_size < 1 or batch_size % micro_batch_size:
            raise ValueError(
                f"batch_size={batch_size} must be a multiple of micro_batch_size={micro_batch_size}"
            )
        if batch_size_warmup_min_size is not None:
            if batch_size_warmup_min_size % micro_batch_size:
                raise ValueError(
                    f"batch_size_warmup_min_size={batch_size_warmup_min_size} must be a multiple "
                    f"of micro_batch_size={micro_batch_size}"
                )
            batch_size_warmup_min_size //= micro_batch_size
        return cls(
            source,
            out_batch_size=batch_size // micro_batch_size,
            out_pseq_len=micro_batch_size * max_seq_len,
            buffer_size=buffer_size,
            batch_size_warmup_min_size=batch_size_warmup_min_size,
            **kwargs,
        )

    # ------------------------------------------------------------------------- counters
    def _reset_counters(self) -> None:
        self.seqs_consumed = 0
        """Source sequences read this epoch (read-ahead included)."""
        self.seqs_emitted = 0
        """Pieces placed in emitted batches this epoch (a split sequence counts once per piece)."""
        self.tokens_emitted = 0
        """Real tokens in emitted batches this epoch."""
        self.slots_emitted = 0
        """Token slots (rows * out_pseq_len) of emitted batches this epoch."""
        self.batches_emitted = 0
        self.seqs_empty = 0
        """Empty source sequences ignored this epoch."""
        self.seqs_split = 0
        self.seqs_truncated = 0
        self.seqs_dropped = 0
        self.tokens_discarded = 0
        """Tokens cut by ``long_docs="truncate"`` or dropped by ``"drop"`` this epoch."""

    @property
    def efficiency(self) -> float:
        """Real tokens / emitted token slots this epoch (``nan`` before the first batch)."""
        return self.tokens_emitted / self.slots_emitted if self.slots_emitted else math.nan

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated, -1 before the first."""
        return self._epoch

    @property
    def seqlen(self) -> int:
        """Tokens per row (the same value as ``out_pseq_len``)."""
        return self.out_pseq_len

    @property
    def seqs_buffered(self) -> int:
        """Pieces held: deferred by the last batch plus read ahead."""
        return self._pieces.n

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start epoch ``epoch`` (discards a loaded mid-epoch state)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._next_epoch = int(epoch)
        self._resume = None

    def __repr__(self) -> str:
        return (
            f"StreamingPacker(out_batch_size={self.out_batch_size}, "
            f"out_pseq_len={self.out_pseq_len}, buffer_size={self.buffer_size}, "
            f"mode={self.mode!r}, long_docs={self.long_docs!r}, epoch={self._epoch})"
        )

    # ------------------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._generation += 1
        if self._resume is not None:
            state, self._resume = self._resume, None
            self._restore_epoch(state)
        else:
            self._start_epoch(self._next_epoch)
            self._next_epoch += 1
        return self._generate(self._generation)

    def _start_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._in_epoch = True
        self._pieces = self._new_pieces()
        self._reset_counters()
        propagate_epoch(self.source, epoch)
        self._carry = []
        self._reset_queue()
        self._iterator = None
        if not self._indexed:
            iterator = iter(self.source)
            fmt = self.source_format
            if fmt == SourceFormat.AUTO:
                peeked = list(itertools.islice(iterator, _PEEK))
                fmt = detect_format(peeked)
                iterator = itertools.chain(peeked, iterator)
            self._iter_format = fmt
            self._iterator = iterator

    def _generate(self, generation: int) -> Iterator[dict[str, Any]]:
        while True:
            if generation != self._generation:
                raise RuntimeError("this packer was iterated again; the older iterator is stale")
            batch = self._next_batch()
            if batch is None:
                self._in_epoch = False
                return
            yield batch
