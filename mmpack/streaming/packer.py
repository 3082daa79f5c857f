"""Streaming best-fit packer: a stream of variable-length sequences to fixed-shape packed batches.

:class:`StreamingPacker` does what ModernBERT's ``GreedyBestFitSequencePacker`` (the seed) does,
with the same placement decisions, but with every placement in a numba kernel in
O(log(rows * row_len)) instead of a Python iteration with an O(rows) scan:

1. Sequences arrive from the source (an iterable of sequences, of batches of sequences, or a
   random-access store), are checked by the token rule of :func:`mmpack.build` (one function for
   both), and are *admitted* as pieces: empty sequences are ignored (and counted),
   sequences longer than a row follow the ``long_docs`` policy (``"split"`` into pieces of at most
   ``out_pseq_len`` tokens, every token kept; ``"truncate"``; ``"drop"``).  The seed has no policy:
   a sequence longer than a row never fits, stays in its buffer forever, and once enough of them
   fill the buffer the epoch ends early, silently dropping the rest of the source.
2. A batch of ``n_rows`` empty rows scans the pieces in order -- first those deferred by the
   previous batch, then new ones -- and puts each into the row with the smallest remaining space
   that holds it (ties to the lowest row), or defers it.  The scan stops once ``buffer_size``
   pieces have been deferred, or when the source is exhausted.  This is exactly the seed's
   behaviour (it scans its buffer and refills it whenever it runs dry, until the deferred
   sequences fill it) at the granularity of single sequences instead of incoming batches; the
   deferred pieces keep their order (the seed's ``extendleft`` reverses them).  Pieces are read
   ahead of the scan (``readahead``, default ``buffer_size``), which never changes a decision: at
   most ``buffer_size`` pieces are ever *buffered* in the seed's sense, so memory is bounded by
   ``buffer_size + readahead`` pieces plus one incoming batch.  Admission is lazy and exact: the
   sequences read go to a queue, and exactly as many pieces as wanted are cut from its head, so a
   document of any length is admitted piece by piece (one 2**26-token document costs 0.95x the
   per-batch time of the same tokens as 64-token documents; 178x when all its pieces were
   admitted at once: ``benchmarks/bench_streaming_long_doc.py``).  Admission is transactional:
   the position passes a sequence only once its pieces are held, so a source that raises loses
   nothing and :meth:`StreamingPacker.state_dict` taken then resumes exactly.
3. The batch is emitted when every row holds at least one piece.  When the source runs out with
   some row empty, the seed drops that last partial batch; so does ``drop_last=True``, while
   ``drop_last=False`` emits it padded (empty rows are all padding) and ends the epoch.

Held pieces are three int64 arrays (length, source index, offset in the source sequence) plus,
for an in-memory source, an object array of the piece arrays themselves (references: admission
copies no token).  The kernel returns placements; each row is then written by one
``np.concatenate`` of its pieces straight into the output row (a TokenStore's pieces are copied
by a kernel straight from its memory map), and a kernel writes the padding, the attention mask
and the ``cu_seqlens``.  Cost per batch: O(scanned * log) for placement, one pass over the
output for the copies, O(rows) Python calls; per source sequence, a ``len``, an array slot and
the token check (a dtype test for an integer array, one pass over the element types for a list;
anything else is converted once by the build's exact rule).

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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.kernels.streaming import (
    bitmap_layout,
    finish_rows,
    place_best_fit,
    reset_rows,
    row_boundaries,
    scatter_pieces,
)
from mmpack.views.masking import IGNORE_INDEX, corrupt_rows, excluded_ids, row_keys
from mmpack.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown
from mmpack.streaming.sources import (
    PieceBuffer,
    batch_items,
    detect_format,
    is_indexable,
    is_store_like,
    piece_counts,
    pieces_of,
    propagate_epoch,
    sequences_of,
    tokens_of,
)
from mmpack.core.validation import check_int_range, check_positive_int, check_token_id

__all__ = ["StreamingPacker"]

_MODES = (None, "causal", "mlm")
_LONG_DOCS = ("split", "truncate", "drop")
_FORMATS = ("auto", "sequences", "batches")
_STATE_VERSION = 3
_READ_VERSIONS = (2, 3)  # version 2 had no next_offset (always 0)
_STATE_FIELDS = (
    "config", "source_len", "source_fingerprint", "epoch", "next_epoch", "in_epoch",
    "next_index", "exhausted", "pending_src", "pending_off", "pending_len", "token_count",
    "counters",
)
_PEEK = 64


class StreamingPacker:
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
        makes :meth:`state_dict` possible.
    out_batch_size : int
        Rows per batch (the maximum, with a batch-size warm-up).
    out_pseq_len : int
        Tokens per row.
    buffer_size : int
        At most this many pieces are deferred (buffered) by one batch; ``>= out_batch_size``.
    mode : {None, "causal", "mlm"}
        ``None``: ``labels`` is ``None`` (the seed's ``suppress_masking``).  ``"mlm"``: 80/10/10
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
        out_pseq_len: int,
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
    ) -> None:
        self.out_batch_size = check_positive_int(out_batch_size, "out_batch_size")
        self.out_pseq_len = check_positive_int(out_pseq_len, "out_pseq_len")
        self.buffer_size = check_positive_int(buffer_size, "buffer_size")
        if self.buffer_size < self.out_batch_size:
            raise ValueError(
                f"buffer_size={buffer_size} must be >= out_batch_size={out_batch_size}"
            )
        if mode not in _MODES:
            raise ValueError(f"mode must be None, 'causal' or 'mlm', got {mode!r}")
        if long_docs not in _LONG_DOCS:
            raise ValueError(f"long_docs must be one of {_LONG_DOCS}, got {long_docs!r}")
        if source_format not in _FORMATS:
            raise ValueError(f"source_format must be one of {_FORMATS}, got {source_format!r}")
        if return_tensors not in ("np", "pt"):
            raise ValueError(f"return_tensors must be 'np' or 'pt', got {return_tensors!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
        if isinstance(mask_prob, bool) or not isinstance(mask_prob, (int, float)) or not (
            0.0 <= mask_prob <= 1.0
        ):
            raise ValueError(f"mask_prob must be a number in [0, 1], got {mask_prob!r}")
        self.seed = check_int_range(seed, "seed", 0, 2**64)
        self.readahead = check_positive_int(
            self.buffer_size if readahead is None else readahead, "readahead"
        )
        self.mode = mode
        self.pad_id = check_token_id(pad_id, "pad_id")
        self.ignore_index = check_token_id(ignore_index, "ignore_index")
        self.mask_prob = float(mask_prob)
        self.long_docs = long_docs
        self.drop_last = drop_last
        self.source_format = source_format
        self.return_tensors = return_tensors
        self.special_ids = tuple(int(t) for t in special_ids)
        self.mask_id = mask_id
        self.vocab_size = vocab_size
        self._excluded: np.ndarray | None = None
        if mode == "mlm":
            if mask_id is None or vocab_size is None:
                raise ValueError("mode='mlm' needs mask_id and vocab_size")
            self.vocab_size = check_positive_int(vocab_size, "vocab_size")
            self.mask_id = check_int_range(mask_id, "mask_id", 0)
            if self.mask_id >= self.vocab_size:
                raise ValueError(f"mask_id={mask_id} must be < vocab_size={vocab_size}")
            self._excluded = excluded_ids(
                self.vocab_size, (*self.special_ids, self.mask_id), self.pad_id
            )
            if self._excluded.size >= self.vocab_size:
                raise ValueError(
                    f"vocab_size={vocab_size} leaves no id for random replacement once "
                    "special_ids, mask_id and pad_id are excluded"
                )

        self.batch_size_schedule: BatchSizeWarmup | None = None
        if (batch_size_warmup_min_size is None) != (batch_size_warmup_tokens is None):
            raise ValueError(
                "batch_size_warmup_min_size and batch_size_warmup_tokens go together; got "
                f"{batch_size_warmup_min_size!r} and {batch_size_warmup_tokens!r}"
            )
        if batch_size_warmup_min_size is not None:
            self.batch_size_schedule = BatchSizeWarmup(
                batch_size_warmup_min_size, self.out_batch_size, batch_size_warmup_tokens,
                world_size,
            )
        self.mask_prob_schedule: MaskingRatioCooldown | None = None
        if (masking_ratio_cooldown_tokens is None) != (final_masking_ratio is None):
            raise ValueError(
                "masking_ratio_cooldown_tokens and final_masking_ratio go together; got "
                f"{masking_ratio_cooldown_tokens!r} and {final_masking_ratio!r}"
            )
        if masking_ratio_cooldown_tokens is not None:
            if mode != "mlm":
                raise ValueError(f"a masking-ratio cool-down needs mode='mlm', got mode={mode!r}")
            self.mask_prob_schedule = MaskingRatioCooldown(
                self.mask_prob, final_masking_ratio, masking_ratio_cooldown_tokens,
                start_tokens=masking_ratio_cooldown_start_tokens,
                schedule=masking_cooldown_schedule_type, step_size=masking_ratio_step_size,
                world_size=world_size,
            )

        self.source = source
        self._indexed = False
        self._store_like = False
        if source_format != "batches" and is_indexable(source):
            fmt = source_format
            if fmt == "auto":
                fmt = detect_format(source[j] for j in range(min(len(source), _PEEK)))
            self._indexed = fmt == "sequences"
            self._store_like = self._indexed and is_store_like(source)
        elif not isinstance(source, Iterable):
            raise TypeError(f"source must be iterable, got {type(source).__name__}")

        # Row state of the best-fit kernel.
        stride = self.out_batch_size
        self._level_off, self._level_len = bitmap_layout((self.out_pseq_len + 1) * stride)
        self._words = np.zeros(int(self._level_off[-1]) + 1, dtype=np.int64)
        self._remaining = np.full(stride, -1, dtype=np.int64)
        self._counts = np.zeros(stride, dtype=np.int64)

        self._pieces = PieceBuffer(with_objects=not self._store_like)
        self._out_row = np.empty(0, dtype=np.int64)
        self._out_off = np.empty(0, dtype=np.int64)
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
    def from_micro_batches(cls, source: Iterable[Any], *, batch_size: int, micro_batch_size: int,
                           max_seq_len: int, buffer_size: int = 5120,
                           batch_size_warmup_min_size: int | None = None,
                           **kwargs: Any) -> StreamingPacker:
        """The seed's ``from_composer``: a global batch of ``batch_size`` sequences of
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
        return cls(source, out_batch_size=batch_size // micro_batch_size,
                   out_pseq_len=micro_batch_size * max_seq_len, buffer_size=buffer_size,
                   batch_size_warmup_min_size=batch_size_warmup_min_size, **kwargs)

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
        self._pieces = PieceBuffer(with_objects=not self._store_like)
        self._reset_counters()
        propagate_epoch(self.source, epoch)
        self._carry = []
        self._reset_queue()
        self._iterator = None
        if not self._indexed:
            iterator = iter(self.source)
            fmt = self.source_format
            if fmt == "auto":
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

    # ------------------------------------------------------------------------- admission
    def _reset_queue(self) -> None:
        """Empty the queue of documents read from the source but not yet admitted as pieces."""
        self._read_index = 0  # source sequences read so far (the next one to read, if indexed)
        self._head_off = 0  # tokens of the queue's first document already admitted as pieces
        self._q_lens = np.empty(0, dtype=np.int64)
        self._q_src = np.empty(0, dtype=np.int64)
        self._q_objs: np.ndarray | None = None if self._store_like else np.empty(0, dtype=object)
        self._exhausted = False  # the source has no more sequences to read

    def _read_ahead(self, want: int) -> None:
        """Admit exactly ``want`` more pieces, unless the source runs out first.

        Documents are read into a queue and admitted piece by piece, so a long document split
        into many pieces is admitted lazily (the held pieces stay within
        ``buffer_size + readahead``, whatever the document's length).  Each step commits only
        once it has succeeded: a source that raises leaves the position where it was, and
        :meth:`state_dict` taken then resumes with nothing lost."""
        target = self._pieces.n + want
        while self._pieces.n < target:
            if self._q_lens.shape[0] == 0:
                if self._exhausted:
                    return
                self._fill_queue(target - self._pieces.n)
            else:
                self._admit_from_queue(target - self._pieces.n)

    def _fill_queue(self, n_docs: int) -> None:
        """Read up to ``n_docs`` sequences into the (empty) queue; mark the source exhausted when
        none is left."""
        j0 = self._read_index
        source: Any = self.source
        if self._indexed:
            j1 = min(len(source), j0 + n_docs)
            if j0 >= j1:
                self._exhausted = True
                return
            objs = None
            if self._store_like:
                lens = np.asarray(source.offsets[j0 + 1:j1 + 1] - source.offsets[j0:j1],
                                  dtype=np.int64)
            else:
                if isinstance(source, (list, tuple)):
                    docs = list(source[j0:j1])
                else:
                    docs = [source[j] for j in range(j0, j1)]
                objs, lens = sequences_of(docs, j0)
        else:
            items = self._read_iterated(n_docs)
            if not items:
                self._exhausted = True
                return
            objs, lens = sequences_of(items, j0)
            j1 = j0 + len(items)
        self._q_lens = lens
        self._q_src = np.arange(j0, j1, dtype=np.int64)
        self._q_objs = objs
        self._read_index = j1

    def _read_iterated(self, n_docs: int) -> list[Any]:
        assert self._iterator is not None
        if self._iter_format == "sequences":
            return list(itertools.islice(self._iterator, n_docs))
        items = self._carry[:n_docs]
        del self._carry[:n_docs]
        while len(items) < n_docs:
            try:
                batch = next(self._iterator)
            except StopIteration:
                break
            except BaseException:
                self._carry[:0] = items  # keep what was read for the next attempt
                raise
            more = batch_items(batch)
            take = n_docs - len(items)
            items.extend(more[:take])
            self._carry = more[take:]
        return items

    def _admit_from_queue(self, need: int) -> None:
        """Admit the next ``need`` pieces of the queued documents (fewer if the queue holds
        fewer), applying the empty/long-sequence policies; a document cut by ``need`` stays at
        the head of the queue with its admitted tokens counted in ``_head_off``."""
        P = self.out_pseq_len
        lens, head = self._q_lens, self._head_off
        n_pieces = piece_counts(lens, head, P, self.long_docs)
        ends = np.cumsum(n_pieces)
        cut = int(np.searchsorted(ends, need))  # the first document that reaches `need` pieces
        if cut >= lens.shape[0]:
            n_docs, partial = lens.shape[0], 0
        else:
            take = need - (int(ends[cut - 1]) if cut else 0)
            full = take == n_pieces[cut]
            n_docs, partial = cut + int(full), (0 if full else take)
        used = n_pieces[:n_docs + int(partial > 0)].copy()
        if partial:
            used[n_docs] = partial
        m = used.shape[0]
        doc, off, plen = pieces_of(lens[:m], head, used, P)
        piece_objs = None
        if self._q_objs is not None:
            piece_objs = self._q_objs[:m][doc]
            for k in np.flatnonzero((off > 0) | (plen < lens[doc])).tolist():
                piece_objs[k] = piece_objs[k][off[k]:off[k] + plen[k]]  # a slice: O(piece)
        # Commit: count the documents whose admission starts here, hold their pieces.
        fresh = lens[int(head > 0):m]
        self.seqs_consumed += fresh.shape[0]
        self.seqs_empty += int(np.count_nonzero(fresh == 0))
        long = fresh[fresh > P]
        if long.size:
            excess = int((long - P).sum())
            if self.long_docs == "split":
                self.seqs_split += long.shape[0]
            elif self.long_docs == "truncate":
                self.seqs_truncated += long.shape[0]
                self.tokens_discarded += excess
            else:
                self.seqs_dropped += long.shape[0]
                self.tokens_discarded += excess + P * long.shape[0]
        self._pieces.append(plen, self._q_src[doc], off, piece_objs)
        self._head_off = int(off[-1] + plen[-1]) if partial else 0
        self._q_lens, self._q_src = lens[n_docs:], self._q_src[n_docs:]
        if self._q_objs is not None:
            self._q_objs = self._q_objs[n_docs:]

    # ------------------------------------------------------------------------- one batch
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
                self._pieces.lens[processed:], self.buffer_size - deferred, self._words,
                self._level_off, self._level_len, self._remaining, self._counts, P,
                self._out_row[processed:], self._out_off[processed:],
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
        P = self.out_pseq_len
        pieces = self._pieces
        rows = self._out_row[:processed]
        placed = np.flatnonzero(rows >= 0)
        p_rows = rows[placed]
        p_offs = self._out_off[:processed][placed]
        p_lens = pieces.lens[placed]
        counts = self._counts[:n_rows]
        used = P - self._remaining[:n_rows]
        ids = np.empty((n_rows, P), dtype=np.int64)
        attention = np.empty((n_rows, P), dtype=np.int64)
        if pieces.objs is None:
            flat_starts = self.source.offsets[pieces.src[placed]].astype(np.int64)
            flat_starts += pieces.src_off[placed]
            src, src_starts = self.source.read_ranges(flat_starts, p_lens)
            scatter_pieces(src, np.asarray(src_starts, dtype=np.int64), p_lens, p_rows, p_offs,
                           ids)
        else:
            objs = pieces.objs[placed][np.argsort(p_rows, kind="stable")].tolist()
            ends = np.cumsum(counts).tolist()
            for r in range(n_rows):
                if counts[r]:
                    _concat_row(objs[ends[r] - counts[r]:ends[r]], ids[r, :used[r]])
        finish_rows(used, self.pad_id, ids, attention)

        cu_flat = np.empty(placed.shape[0] + 2 * n_rows, dtype=np.int32)
        bounds = np.empty(n_rows + 1, dtype=np.int64)
        longest = np.empty(n_rows, dtype=np.int64)
        row_boundaries(p_rows, p_lens, n_rows, used, P, cu_flat, bounds, longest)
        b = bounds.tolist()
        cu_seqlens = [cu_flat[b[r]:b[r + 1]] for r in range(n_rows)]
        max_seqlen = longest.tolist()

        keep = np.ones(pieces.n, dtype=bool)
        keep[placed] = False
        pieces.keep(keep)

        labels = None
        mask_prob = None
        if self.mode == "mlm":
            mask_prob = self.mask_prob
            if self.mask_prob_schedule is not None:
                mask_prob = self.mask_prob_schedule(self.token_count)
            assert self._excluded is not None
            rows_in_stream = (self.batches_emitted << 32) + np.arange(n_rows, dtype=np.int64)
            labels = corrupt_rows(
                ids, attention, row_keys(self.seed, self._epoch, rows_in_stream),
                mask_prob=mask_prob, mask_id=self.mask_id, vocab_size=self.vocab_size,
                excluded=self._excluded, ignore_index=self.ignore_index,
            )
        elif self.mode == "causal":
            labels = np.full_like(ids, self.ignore_index)
            labels[:, :-1] = ids[:, 1:]
            labels[p_rows, p_offs + p_lens - 1] = self.ignore_index
            labels[attention == 0] = self.ignore_index

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

    # ------------------------------------------------------------------------- checkpointing
    def _config(self) -> dict[str, Any]:
        bs, mp = self.batch_size_schedule, self.mask_prob_schedule
        return {
            "out_batch_size": self.out_batch_size,
            "out_pseq_len": self.out_pseq_len,
            "buffer_size": self.buffer_size,
            "mode": self.mode,
            "pad_id": self.pad_id,
            "mask_id": self.mask_id,
            "vocab_size": self.vocab_size,
            "special_ids": list(self.special_ids),
            "mask_prob": self.mask_prob,
            "ignore_index": self.ignore_index,
            "long_docs": self.long_docs,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "batch_size_schedule": None if bs is None else [bs.min_batch_size, bs.warmup_tokens],
            "mask_prob_schedule": None if mp is None else [
                mp.final, mp.start_tokens, mp.cooldown_tokens, mp.schedule, mp.step_size],
        }

    def _require_indexed(self, what: str) -> None:
        if not self._indexed:
            raise TypeError(
                f"{what} needs a random-access source of sequences (a TokenStore, a view, a "
                "map-style dataset or a list: anything with __len__ and __getitem__ yielding "
                f"sequences); this packer iterates an opaque {type(self.source).__name__}, whose "
                "position cannot be restored exactly"
            )

    def state_dict(self) -> dict[str, Any]:
        """The position of the packer: restoring it makes the next batch the one that comes next.

        Take it between batches from the thread that iterates the packer (not through a
        prefetcher, which runs ahead), or after the source raised: admission is transactional,
        so no sequence read ahead is lost.  Raises :class:`TypeError` for an opaque source.

        Returns
        -------
        dict
            Plain Python values and int64 numpy arrays (``pending_*``: source index, offset and
            length of every held piece), suitable for ``torch.save``.  ``next_index`` and
            ``next_offset`` are the first source sequence, and the token in it, not yet admitted
            as a piece.
        """
        self._require_indexed("state_dict()")
        pieces = self._pieces
        queued = self._q_lens.shape[0] > 0
        return {
            "version": _STATE_VERSION,
            "config": self._config(),
            "source_len": len(self.source),
            "source_fingerprint": getattr(self.source, "fingerprint", None),
            "epoch": self._epoch,
            "next_epoch": self._next_epoch,
            "in_epoch": self._in_epoch,
            "next_index": int(self._q_src[0]) if queued else self._read_index,
            "next_offset": self._head_off,
            "exhausted": self._exhausted and not queued,
            "pending_src": pieces.src.copy(),
            "pending_off": pieces.src_off.copy(),
            "pending_len": pieces.lens.copy(),
            "token_count": self.token_count,
            "counters": {k: getattr(self, k) for k in _COUNTERS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the next ``iter()`` continues from there.

        Every field is checked before anything changes.

        Raises
        ------
        TypeError
            For an opaque source.
        mmpack.errors.FormatError
            The state is not a dict of this format or version, lacks a field, or holds a value of
            the wrong type, out of range, or inconsistent with the other fields (e.g.
            ``exhausted`` before the end of the source).
        mmpack.errors.StateMismatchError
            The state comes from a packer with other parameters or another source.
        """
        self._require_indexed("load_state_dict()")
        state = self._checked_state(state)
        self.token_count = state["token_count"]
        self._next_epoch = state["next_epoch"]
        self._resume = state if state["in_epoch"] else None
        if not state["in_epoch"]:
            self._epoch = state["epoch"]
            self._in_epoch = False

    def _checked_state(self, state: Any) -> dict[str, Any]:
        """A validated copy of ``state`` with plain ints and int64 arrays."""
        if not isinstance(state, Mapping):
            raise FormatError(
                f"state must be a StreamingPacker state_dict() (a dict), got {type(state).__name__}"
            )
        version = state.get("version")
        if version not in _READ_VERSIONS:
            raise FormatError(
                f"state must be a StreamingPacker state_dict() of version {_STATE_VERSION}, got "
                f"version {version!r}"
            )
        need = [k for k in _STATE_FIELDS if k not in state]
        if need:
            raise FormatError(f"the state lacks the fields {need}")
        config = self._config()
        saved = state["config"]
        if not isinstance(saved, Mapping):
            raise FormatError(f"the state's config must be a dict, got {type(saved).__name__}")
        diff = sorted(k for k in config if saved.get(k) != config[k])
        if diff:
            raise StateMismatchError(
                "the state was saved by a packer with other parameters: "
                + ", ".join(f"{k}={saved.get(k)!r} (now {config[k]!r})" for k in diff)
            )
        n = len(self.source)
        fingerprint = getattr(self.source, "fingerprint", None)
        if state["source_len"] != n or state["source_fingerprint"] != fingerprint:
            raise StateMismatchError(
                f"the state was saved over another source ({state['source_len']!r} sequences, "
                f"fingerprint {state['source_fingerprint']!r}; now {n}, {fingerprint})"
            )
        out = dict(state)
        if version == 2:  # before next_offset: whole documents were admitted
            out.setdefault("next_offset", 0)
        elif "next_offset" not in state:
            raise FormatError("the state lacks the fields ['next_offset']")
        for key, lo, hi in (("epoch", -1, 2**64), ("next_epoch", 0, 2**64),
                            ("next_index", 0, n + 1), ("next_offset", 0, 2**63),
                            ("token_count", 0, 2**63)):
            out[key] = _state_int(out[key], key, lo, hi)
        for key in ("in_epoch", "exhausted"):
            if not isinstance(state[key], (bool, np.bool_)):
                raise FormatError(f"the state's {key} must be a bool, got {state[key]!r}")
            out[key] = bool(state[key])
        if out["in_epoch"] and out["epoch"] < 0:
            raise FormatError(f"the state is inside epoch {out['epoch']}; epochs count from 0")
        if out["exhausted"] and (out["next_index"] != n or out["next_offset"]):
            raise FormatError(
                f"the state says the source is exhausted at sequence {out['next_index']} (token "
                f"{out['next_offset']}), but the source holds {n} sequences"
            )
        if out["next_offset"] and (self.long_docs != "split" or out["next_index"] >= n
                                   or out["next_offset"] % self.out_pseq_len):
            raise FormatError(
                f"the state's next_offset={out['next_offset']} is not the start of a piece of "
                f"sequence {out['next_index']}"
            )
        counters = state["counters"]
        if not isinstance(counters, Mapping) or set(counters) != set(_COUNTERS):
            raise FormatError(f"the state's counters must be a dict of {list(_COUNTERS)}")
        out["counters"] = {k: _state_int(counters[k], k, 0, 2**63) for k in _COUNTERS}
        arrays = []
        for key in ("pending_src", "pending_off", "pending_len"):
            a = state[key]
            if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind not in "iu":
                raise FormatError(
                    f"the state's {key} must be a 1-D integer numpy array, got "
                    f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}"
                )
            arrays.append(a.astype(np.int64))
        src, off, plen = arrays
        if not src.shape == off.shape == plen.shape:
            raise FormatError(
                f"the state's pending arrays differ in length: {src.shape[0]}, {off.shape[0]}, "
                f"{plen.shape[0]}"
            )
        if src.size and (src.min() < 0
                         or src.max() >= out["next_index"] + int(out["next_offset"] > 0)
                         or src.max() >= n or off.min() < 0 or plen.min() < 1
                         or plen.max() > self.out_pseq_len):
            raise FormatError(
                "the state's pending pieces are out of range: sources must be admitted ones "
                f"(< next_index={out['next_index']}), offsets >= 0, lengths in "
                f"[1, {self.out_pseq_len}]"
            )
        out["pending_src"], out["pending_off"], out["pending_len"] = src, off, plen
        return out

    def _restore_epoch(self, state: dict[str, Any]) -> None:
        self._start_epoch(state["epoch"])
        for k, v in state["counters"].items():
            setattr(self, k, v)
        self._read_pieces(state["pending_src"], state["pending_off"], state["pending_len"])
        self._read_index = state["next_index"]
        self._head_off = state["next_offset"]
        if self._head_off and self._head_off >= self._doc_len(self._read_index):
            raise StateMismatchError(
                f"the state's next_offset={self._head_off} lies past the end of source sequence "
                f"{self._read_index}"
            )
        self._exhausted = state["exhausted"]

    def _read_pieces(self, src: np.ndarray, off: np.ndarray, plen: np.ndarray) -> None:
        if self._store_like:
            doc_lens = np.diff(self.source.offsets)[src]
            if np.any(off + plen > doc_lens):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            self._pieces.append(plen, src, off, None)
            return
        objs = np.empty(src.shape[0], dtype=object)
        docs: dict[int, Any] = {}
        for k, (j, o, n) in enumerate(zip(src.tolist(), off.tolist(), plen.tolist())):
            doc = docs.get(j)
            if doc is None:
                doc = docs[j] = sequences_of([self.source[j]], j)[0][0]
            if o + n > len(doc):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            objs[k] = doc if (o == 0 and n == len(doc)) else doc[o:o + n]
        self._pieces.append(plen, src, off, objs)

    def _doc_len(self, j: int) -> int:
        source: Any = self.source
        if self._store_like:
            return int(source.offsets[j + 1] - source.offsets[j])
        return len(tokens_of(source[j]))


_COUNTERS = (
    "seqs_consumed", "seqs_emitted", "tokens_emitted", "slots_emitted", "batches_emitted",
    "seqs_empty", "seqs_split", "seqs_truncated", "seqs_dropped", "tokens_discarded",
)


def _state_int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"the state's {key} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value < hi:
        raise FormatError(f"the state's {key}={value} is out of range [{lo}, {hi})")
    return int(value)


def _concat_row(pieces: list[Any], out: np.ndarray) -> None:
    try:
        np.concatenate(pieces, out=out, casting="same_kind")
    except TypeError as exc:
        raise TypeError(f"source sequences must hold integer token ids: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"source sequences must be 1-D sequences of token ids: {exc}") from None
    if out.size and out.min() < 0:
        raise ValueError(
            f"a source sequence has a negative token {int(out.min())}; tokens must be "
            "non-negative integers"
        )


def _grown(a: np.ndarray, size: int, keep: int) -> np.ndarray:
    out = np.empty(size, dtype=a.dtype)
    out[:keep] = a[:keep]
    return out


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
