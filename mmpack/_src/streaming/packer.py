"""Streaming best-fit packer: a stream of variable-length sequences to fixed-shape packed batches.

:class:`StreamingPacker` makes ModernBERT's ``GreedyBestFitSequencePacker``'s placement
decisions, each in a numba kernel in O(log(rows * row_len)) instead of a Python O(rows) scan:

1. Sequences (an iterable of sequences or batches, or a random-access store) are checked by
   :func:`mmpack.build`'s token rule and *admitted* as pieces: empty ones counted and ignored,
   longer than a row by the ``long_docs`` policy (``"split"``, ``"truncate"``, ``"drop"``).
2. A batch of ``batch_size`` empty rows scans the pieces in order (first those the previous batch
   deferred), putting each into the row with the smallest remaining space that holds it (ties to
   the lowest row) or deferring it, until ``buffer_size`` pieces are deferred or the source ends.
   Read-ahead (``readahead``) changes no decision; memory is bounded by ``buffer_size +
   readahead`` pieces plus one incoming batch.  Admission is lazy (a document enters piece by
   piece) and transactional (a source that raises loses nothing; a state taken then resumes).
3. The batch is emitted when every row holds a piece; at the end ``drop_last=True`` drops the
   partial batch (as ModernBERT does), ``drop_last=False`` emits it padded.

Parts: ``Admission``, ``Placement``, ``PackerState`` (:mod:`mmpack._src.streaming`); a worker or rank
packs its shard only (:mod:`mmpack._src.streaming.shards`).  Outputs (numpy): ``input_ids``,
``attention_mask``, ``targets``, ``cu_seqlens`` and ``max_seqlen`` per row, ``mask_prob``.

Cost per batch: a fixed number of kernel calls whatever the number of pieces (against a
write-once floor and ModernBERT's packer: ``python -m benchmarks.bench_streaming_floor``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack._src.packing.options import Delegated
from mmpack._src.streaming.admission import Admission
from mmpack._src.streaming.checkpoint import Expected, PackerState
from mmpack._src.streaming.config import PackerConfig, micro_batch_shape
from mmpack._src.streaming.placement import Placement
from mmpack._src.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown
from mmpack._src.streaming.shards import (
    Consumer,
    consumer_provider,
    current_consumer,
    set_consumer_provider,
    shard_source,
)
from mmpack._src.streaming.sources import propagate_epoch, source_kind
from mmpack._src.streaming.stats import StreamingStats
from mmpack.errors import StateMismatchError

__all__ = ["StreamingPacker"]


class StreamingPacker:
    """Pack a stream of variable-length token sequences into ``(batch_size, seqlen)`` batches.

    Parameters
    ----------
    source : iterable
        Either an iterable of sequences (lists, 1-D numpy arrays or torch tensors of token ids,
        or dicts with ``"input_ids"`` and, optionally, a ``"loss_mask"``: every document or
        none), or an iterable of incoming batches (each a list of such sequences, a 2-D array,
        or a dict whose ``"input_ids"``, and ``"loss_mask"`` if any, are one of those).  A
        masked store's masks and documents' masks make the labels the packed view's.
        ``source_format="auto"`` tells them apart from the first non-empty element (a sequence
        starts with a scalar, a batch with a sequence).  A random-access source of sequences --
        a :class:`~mmpack.TokenStore` (read through ``read_ranges``, without a
        Python call per document), a view, a map-style dataset, a list -- is read by index,
        which is what makes :meth:`state_dict` possible.  Sequences are held (not copied) until
        joined, which may be after the next incoming batch is asked for: a source must not refill
        the arrays it yielded (as with ModernBERT's packer, which holds them in its buffer).
    batch_size : int
        Rows per batch (the maximum, with a batch-size warm-up).  What ModernBERT's packer calls
        ``out_batch_size``.
    seqlen : int
        Tokens per row, as in the views.  What ModernBERT's packer calls ``out_pseq_len``.
    buffer_size : int
        At most this many pieces are deferred (buffered) by one batch; ``>= batch_size``.
    mode : {None, "causal", "mlm"}
        ``None``: ``targets`` is ``None`` (ModernBERT's ``suppress_masking``).  ``"mlm"``: 80/10/10
        masking (:mod:`mmpack._src.packing.masking`); random tokens come from ``[0, vocab_size)`` minus
        ``special_ids``, ``eot``, ``mask_id`` and ``pad_id``; padding, special ids and the eot are
        never selected.  ``"causal"``: ``targets[t] = input_ids[t + 1]`` inside a piece,
        ``ignore_index`` at each piece's last token and on padding (``label_shift="next"``).
    label_shift : {"next", "hf"}
        Causal labels as the packed view writes them: ``"next"`` as above; ``"hf"``: ``targets =
        input_ids`` with ``ignore_index`` at each piece's first token and on padding (Hugging
        Face models shift inside).
    pad_id : int
        Token id written into padding.
    eot : int, optional
        Token id appended to every source sequence before packing, so it closes every document
        as in the views (a split document gets it on its last piece only).
    mask_id, vocab_size : int
        Required for ``"mlm"``.
    special_ids : iterable of int
        Never masked, never drawn as random replacements (``"mlm"``).
    mask_prob : float
        Masking ratio in ``[0, 1]`` (the cool-down's initial ratio when one is configured).
    ignore_index : int
        Label of positions without loss.
    long_docs : {"split", "truncate", "drop"}
        What to do with a sequence longer than ``seqlen``.
    drop_last : bool
        Drop (``True``, as ModernBERT's packer) or emit padded (``False``) the last batch of an
        epoch when the source runs out before every row holds a piece.
    source_format : {"auto", "sequences", "batches"}
    seed : int
        Row ``r`` of the ``b``-th batch of epoch ``e`` is corrupted with the key of
        ``(seed, e, b * 2**32 + r)`` (:func:`mmpack._src.packing.masking.row_keys`): masks are a pure
        function of the position in the stream, so a resumed run reproduces them.
    readahead : int, optional
        Pieces read ahead of the scan (default ``buffer_size``); affects memory and speed only.
    batch_size_warmup_min_size, batch_size_warmup_tokens
        Grow the rows from the former to ``batch_size`` over the latter (an int or ``"…tok"``);
        see :class:`~mmpack._src.streaming.schedules.BatchSizeWarmup`.
    masking_ratio_cooldown_tokens, masking_ratio_cooldown_start_tokens, final_masking_ratio,
    masking_cooldown_schedule_type, masking_ratio_step_size
        Lower the masking ratio from ``mask_prob`` to ``final_masking_ratio``; see
        :class:`~mmpack._src.streaming.schedules.MaskingRatioCooldown`.  ``"mlm"`` only.
    rank, world_size : int, optional
        This process's rank and the number of ranks; default ``torch.distributed``'s when a
        process group is initialised (through :mod:`mmpack._src.torch.streaming`), else 0 and 1.
        The schedules' token durations are divided by ``world_size`` times the DataLoader
        workers (every consumer counts only the tokens it emits).
    shard : bool
        Pack only this consumer's shard of the source (consumer ``rank * num_workers + worker``
        of ``world_size * num_workers``: contiguous blocks of a random-access source, a
        round-robin deal of an opaque iterable; :mod:`mmpack._src.streaming.shards`).  ``False`` for a
        source that is this consumer's already (a DataLoader over a ``DistributedSampler``, as
        with ModernBERT's packer; a Hugging Face ``split_dataset_by_node``; an ``IterableDataset``
        that splits itself over DataLoader workers).

    Notes
    -----
    Every ``iter(packer)`` is one pass over the source (an epoch): counts and buffers are reset,
    the masks are keyed by the epoch and the epoch is passed to ``set_epoch`` of the source, of a
    DataLoader's sampler (e.g. a ``DistributedSampler`` or
    :class:`~mmpack.ResumableSampler`) and of its batch sampler.  Epochs count from
    0; :meth:`set_epoch` chooses the next one (call it before every epoch when the packer runs
    in DataLoader workers, whose copies do not see each other's epochs).  The schedules' token
    count is kept across epochs.  With :mod:`mmpack._src.torch.streaming` imported (any
    ``mmpack.torch`` module imports it) the packer is a torch ``IterableDataset``:
    ``DataLoader(packer, batch_size=None, num_workers=...)`` works, and a torchdata
    ``StatefulDataLoader`` saves and restores its position through :meth:`state_dict`.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        batch_size: int,
        seqlen: int,
        buffer_size: int,
        mode: str | None = None,
        label_shift: str = "next",
        pad_id: int = 0,
        eot: int | None = None,
        mask_id: int | None = None,
        vocab_size: int | None = None,
        special_ids: Iterable[int] = (),
        mask_prob: float = 0.3,
        ignore_index: int = IGNORE_INDEX,
        long_docs: str = "split",
        drop_last: bool = True,
        source_format: str = "auto",
        seed: int = 0,
        readahead: int | None = None,
        batch_size_warmup_min_size: int | None = None,
        batch_size_warmup_tokens: Any = None,
        masking_ratio_cooldown_tokens: Any = None,
        masking_ratio_cooldown_start_tokens: Any = 0,
        final_masking_ratio: float | None = None,
        masking_cooldown_schedule_type: str = "linear",
        masking_ratio_step_size: float | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        shard: bool = True,
    ) -> None:
        self.config = PackerConfig.check(
            batch_size=batch_size, seqlen=seqlen, buffer_size=buffer_size, mode=mode,
            label_shift=label_shift, pad_id=pad_id, eot=eot, mask_id=mask_id, vocab_size=vocab_size,
            special_ids=special_ids, mask_prob=mask_prob, ignore_index=ignore_index,
            long_docs=long_docs, drop_last=drop_last, source_format=source_format, seed=seed,
            readahead=readahead, rank=rank, world_size=world_size, shard=shard,
            schedule_args={
                "batch_size_warmup_min_size": batch_size_warmup_min_size,
                "batch_size_warmup_tokens": batch_size_warmup_tokens,
                "masking_ratio_cooldown_tokens": masking_ratio_cooldown_tokens,
                "masking_ratio_cooldown_start_tokens": masking_ratio_cooldown_start_tokens,
                "final_masking_ratio": final_masking_ratio,
                "masking_cooldown_schedule_type": masking_cooldown_schedule_type,
                "masking_ratio_step_size": masking_ratio_step_size,
            },
        )  # fmt: skip
        self.source = source
        self._inherited: tuple[int, int] | None = None  # the ranks of the process that pickled it
        c = self.config
        self._indexed, self._store_like = source_kind(source, c.source_format)
        self._consumer_shard = self._consumer().shard
        self._divisor = self._consumer_shard[1]
        warmup, labeller = c.schedules(self._divisor)
        self._admission = Admission(c.seqlen, c.long_docs)
        self._placement = Placement(c, labeller, warmup)
        self._next_epoch = 0
        self._epoch = -1
        self._in_epoch = False
        self._resume: PackerState | None = None
        self._generation = 0

    # ------------------------------------------------------------------------- alternate builder
    @classmethod
    def from_micro_batches(
        cls,
        source: Iterable[Any],
        *,
        global_batch_size: int,
        micro_batch_size: int,
        max_seq_len: int,
        buffer_size: int = 5120,
        batch_size_warmup_min_size: int | None = None,
        **kwargs: Any,
    ) -> StreamingPacker:
        """ModernBERT's ``from_composer``: a global batch of ``global_batch_size`` sequences of
        ``max_seq_len`` (what ``from_composer`` calls ``batch_size``) becomes
        ``global_batch_size // micro_batch_size`` rows of ``micro_batch_size * max_seq_len``
        tokens; the warm-up minimum is given in sequences (a multiple of ``micro_batch_size``)."""
        batch_size, seqlen, warmup_min = micro_batch_shape(
            global_batch_size, micro_batch_size, max_seq_len, batch_size_warmup_min_size
        )
        return cls(
            source,
            batch_size=batch_size,
            seqlen=seqlen,
            buffer_size=buffer_size,
            batch_size_warmup_min_size=warmup_min,
            **kwargs,
        )

    # ------------------------------------------------------------------------- what it reports
    batch_size = Delegated("config", "int: rows per batch (the maximum, with a warm-up).")
    seqlen = Delegated("config", "int: tokens per row.")
    buffer_size = Delegated("config", "int: at most this many pieces are deferred by one batch.")
    mode = Delegated("config", "str or None: the objective, 'causal', 'mlm' or None (no targets).")

    @property
    def batch_size_schedule(self) -> BatchSizeWarmup | None:
        """The batch-size warm-up of this consumer, or None."""
        return self._placement.warmup

    @property
    def mask_prob_schedule(self) -> MaskingRatioCooldown | None:
        """The masking-ratio cool-down of this consumer, or None."""
        return self._placement.labeller.cooldown

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated, -1 before the first."""
        return self._epoch

    def stats(self) -> StreamingStats:
        """What the packer did in its current (or last) epoch; O(1)."""
        return StreamingStats.of(
            self._admission.counts,
            self._placement.counts,
            seqlen=self.seqlen,
            epoch=self._epoch,
            n_held=self._admission.pieces.n,
            token_count=self._placement.token_count,
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start epoch ``epoch`` (discards a loaded mid-epoch state)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._next_epoch = int(epoch)
        self._resume = None

    def __repr__(self) -> str:
        return (
            f"StreamingPacker(batch_size={self.batch_size}, seqlen={self.seqlen}, "
            f"buffer_size={self.buffer_size}, mode={self.mode!r}, "
            f"long_docs={self.config.long_docs!r}, "
            f"epoch={self._epoch})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer_provider"] = consumer_provider()  # pickled by name: a worker gets it
        here = self._consumer()
        if here.distributed:  # a spawned worker has no process group: it takes its parent's
            state["_inherited"] = (here.rank, here.world_size)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        provider = state.pop("_consumer_provider", None)
        if provider is not None and consumer_provider() is None:
            set_consumer_provider(provider)
        self.__dict__.update(state)

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

    def _consumer(self) -> Consumer:
        """The consumer this packer runs as now."""
        return current_consumer(self.config.rank, self.config.world_size, self._inherited)

    def _enter_consumer(self) -> tuple[int, int]:
        """Take the shard of the consumer this packer runs as now (and, for another number of
        consumers, the schedules divided by it); returns ``(k, S)``."""
        self._consumer_shard = k, n_shards = self._consumer().shard
        if n_shards != self._divisor:
            self._divisor = n_shards
            warmup, labeller = self.config.schedules(n_shards)
            self._placement.use(labeller, warmup)
        return k, n_shards

    def _start_epoch(self, epoch: int) -> None:
        k, n_shards = self._enter_consumer()
        c = self.config
        if not c.shard:
            k, n_shards = 0, 1
        source, store_like = shard_source(
            self.source, k, n_shards, indexed=self._indexed, store_like=self._store_like, eot=c.eot
        )
        self._epoch = epoch
        self._in_epoch = True
        propagate_epoch(self.source, epoch)
        self._admission.start(
            source, indexed=self._indexed, store_like=store_like, source_format=c.source_format
        )
        self._placement.start_epoch()

    def _generate(self, generation: int) -> Iterator[dict[str, Any]]:
        while True:
            if generation != self._generation:
                raise RuntimeError("this packer was iterated again; the older iterator is stale")
            batch = self._placement.next_batch(self._admission, self._epoch)
            if batch is None:
                self._in_epoch = False
                return
            yield batch

    # ------------------------------------------------------------------------- state
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
            The fields of :mod:`mmpack._src.streaming.checkpoint` (version 4): plain Python values and
            int64 numpy arrays (``pending_*``: source index, offset and length of every held
            piece), suitable for ``torch.save``.
        """
        self._require_indexed("state_dict()")
        if not self._in_epoch:
            self._enter_consumer()  # between epochs: the state is of the consumer it is now
        return PackerState(
            expected=self._expected(self._consumer_shard),
            epoch=self._epoch,
            next_epoch=self._next_epoch,
            in_epoch=self._in_epoch,
            position=self._admission.position(),
            token_count=self._placement.token_count,
            admission=self._admission.counts,
            emission=self._placement.counts,
        ).as_dict()

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
            The state comes from a packer with other parameters, another shard (rank, worker or
            number of them) or another source.
        """
        self._require_indexed("load_state_dict()")
        checked = PackerState.from_dict(state, self._expected(self._enter_consumer()))
        self._placement.restore(checked.token_count)
        self._next_epoch = checked.next_epoch
        self._resume = checked if checked.in_epoch else None
        if not checked.in_epoch:
            self._epoch = checked.epoch
            self._in_epoch = False

    def _expected(self, shard: tuple[int, int]) -> Expected:
        """What a state loaded into this packer, as consumer ``shard``, must match."""
        n = len(self.source)  # type: ignore[arg-type]  # indexed: it has __len__
        k, n_shards = shard if self.config.shard else (0, 1)
        return Expected(
            config=self.config.as_state(self.batch_size_schedule, self.mask_prob_schedule),
            shard=shard,
            source_len=n,
            source_fingerprint=getattr(self.source, "fingerprint", None),
            shard_len=(k + 1) * n // n_shards - k * n // n_shards,
        )

    def _restore_epoch(self, state: PackerState) -> None:
        shard = self._consumer().shard
        loaded = state.expected.shard
        if shard != loaded:
            raise StateMismatchError(
                f"the state was loaded as shard {loaded[0]} of {loaded[1]} but is "
                f"iterated as shard {shard[0]} of {shard[1]} (another rank, worker or number "
                "of them)"
            )
        self._start_epoch(state.epoch)
        self._admission.restore(state.position, state.admission)
        self._placement.restore(state.token_count, state.emission)
