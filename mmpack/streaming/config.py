"""The streaming packer's parameters, checked once, and what they build.

:class:`PackerConfig` is the frozen, checked form of the arguments of
:class:`~mmpack.streaming.packer.StreamingPacker` (their meaning is documented there): every
argument is checked by the one rule of :mod:`mmpack.core.validation` or :mod:`mmpack.core.options`
(bad input is a ``TypeError``/``ValueError`` naming it).  It builds the schedules and the
labeller of a consumer (:meth:`PackerConfig.schedules`) and the ``config`` field of a state
(:meth:`PackerConfig.as_state`).  O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmpack.core.options import LongDocs, Mode, SourceFormat, parse_option
from mmpack.core.validation import (
    check_bool,
    check_int,
    check_positive_int,
    check_seed,
    check_token_id,
)
from mmpack.streaming.labels import Labeller
from mmpack.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown, token_schedules
from mmpack.views.masking import MaskingOptions, check_masking

__all__ = ["PackerConfig", "micro_batch_shape"]


@dataclass(frozen=True)
class PackerConfig:
    """A :class:`~mmpack.streaming.packer.StreamingPacker`'s parameters, checked
    (:meth:`check`); ``masking`` holds the MLM ones (:func:`mmpack.views.masking.check_masking`),
    ``schedule_args`` the schedules' (:func:`mmpack.streaming.schedules.token_schedules`)."""

    batch_size: int
    seqlen: int
    buffer_size: int
    mode: str | None
    pad_id: int
    eot: int | None
    masking: MaskingOptions
    ignore_index: int
    long_docs: str
    drop_last: bool
    source_format: str
    seed: int
    readahead: int
    rank: int | None
    world_size: int | None
    shard: bool
    schedule_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check(
        cls,
        *,
        batch_size: Any,
        seqlen: Any,
        buffer_size: Any,
        mode: Any,
        pad_id: Any,
        eot: Any,
        mask_id: Any,
        vocab_size: Any,
        special_ids: Any,
        mask_prob: Any,
        ignore_index: Any,
        long_docs: Any,
        drop_last: Any,
        source_format: Any,
        seed: Any,
        readahead: Any,
        rank: Any,
        world_size: Any,
        shard: Any,
        **schedule_args: Any,
    ) -> PackerConfig:
        """The checked parameters (the packer's signature holds their defaults)."""
        batch_size = check_positive_int(batch_size, "batch_size")
        seqlen = check_positive_int(seqlen, "seqlen")
        buffer_size = check_positive_int(buffer_size, "buffer_size")
        if buffer_size < batch_size:
            raise ValueError(f"buffer_size={buffer_size} must be >= batch_size={batch_size}")
        mode = None if mode is None else parse_option(Mode, mode, "mode").value
        pad_id = check_token_id(pad_id, "pad_id")
        eot = None if eot is None else check_token_id(eot, "eot")
        if eot is not None and eot < 0:
            raise ValueError(f"eot must be a token id >= 0 (tokens are non-negative), got {eot}")
        masking = check_masking(
            mode == Mode.MLM,
            mask_prob=mask_prob,
            mask_id=mask_id,
            vocab_size=vocab_size,
            special_ids=special_ids,
            pad_id=pad_id,
            also_excluded=(eot,),
        )
        rank, world_size = _check_ranks(rank, world_size)
        config = cls(
            batch_size=batch_size,
            seqlen=seqlen,
            buffer_size=buffer_size,
            mode=mode,
            pad_id=pad_id,
            eot=eot,
            masking=masking,
            ignore_index=check_token_id(ignore_index, "ignore_index"),
            long_docs=parse_option(LongDocs, long_docs, "long_docs").value,
            drop_last=check_bool(drop_last, "drop_last"),
            source_format=parse_option(SourceFormat, source_format, "source_format").value,
            seed=check_seed(seed),
            readahead=check_positive_int(
                buffer_size if readahead is None else readahead, "readahead"
            ),
            rank=rank,
            world_size=world_size,
            shard=check_bool(shard, "shard"),
            schedule_args=schedule_args,
        )
        config.schedules(1)  # their arguments are checked now
        return config

    def schedules(self, divisor: int) -> tuple[BatchSizeWarmup | None, Labeller]:
        """The batch-size warm-up and the labeller (with its masking cool-down) of a consumer
        among ``divisor``, by which the schedules' token durations are divided."""
        warmup, cooldown = token_schedules(
            self.batch_size, self.masking.mask_prob, self.mode, world_size=divisor,
            **self.schedule_args,
        )  # fmt: skip
        return warmup, Labeller(self.mode, self.ignore_index, self.seed, self.masking, cooldown)

    def as_state(
        self, warmup: BatchSizeWarmup | None, cooldown: MaskingRatioCooldown | None
    ) -> dict[str, Any]:
        """The parameters that decide the batches (with the consumer's schedules), as a state
        records them: plain Python values."""
        m = self.masking
        return {
            "batch_size": self.batch_size,
            "seqlen": self.seqlen,
            "buffer_size": self.buffer_size,
            "mode": self.mode,
            "pad_id": self.pad_id,
            "eot": self.eot,
            "mask_id": m.mask_id,
            "vocab_size": m.vocab_size,
            "special_ids": list(m.special_ids),
            "mask_prob": m.mask_prob,
            "ignore_index": self.ignore_index,
            "long_docs": self.long_docs,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "batch_size_schedule": None
            if warmup is None
            else [warmup.min_batch_size, warmup.warmup_tokens],
            "mask_prob_schedule": None
            if cooldown is None
            else [
                cooldown.final,
                cooldown.start_tokens,
                cooldown.cooldown_tokens,
                cooldown.schedule,
                cooldown.step_size,
            ],
        }


def _check_ranks(rank: Any, world_size: Any) -> tuple[int | None, int | None]:
    """``rank`` (an int >= 0) and ``world_size`` (an int >= 1), each None when not given;
    ``rank < world_size`` when both are."""
    if world_size is not None and check_int(world_size, "world_size") < 1:
        raise ValueError(f"world_size must be an int >= 1, got world_size={world_size!r}")
    if rank is not None and check_int(rank, "rank") < 0:
        raise ValueError(f"rank must be an int >= 0, got rank={rank!r}")
    if rank is not None and world_size is not None and not rank < world_size:
        raise ValueError(
            f"rank must satisfy 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
        )
    return (None if rank is None else int(rank)), (None if world_size is None else int(world_size))


def micro_batch_shape(
    global_batch_size: int, micro_batch_size: int, max_seq_len: int, warmup_min: int | None
) -> tuple[int, int, int | None]:
    """ModernBERT's ``from_composer`` shape as the packer's: ``(batch_size, seqlen, warm-up
    minimum in rows)`` from a global batch of ``global_batch_size`` sequences of ``max_seq_len``
    split into micro-batches of ``micro_batch_size`` sequences (one row each), the warm-up
    minimum given in sequences; ``ValueError`` when they do not divide."""
    if micro_batch_size < 1 or global_batch_size % micro_batch_size:
        raise ValueError(
            f"global_batch_size={global_batch_size} must be a multiple of "
            f"micro_batch_size={micro_batch_size}"
        )
    if warmup_min is not None:
        if warmup_min % micro_batch_size:
            raise ValueError(
                f"batch_size_warmup_min_size={warmup_min} must be a multiple "
                f"of micro_batch_size={micro_batch_size}"
            )
        warmup_min //= micro_batch_size
    return global_batch_size // micro_batch_size, micro_batch_size * max_seq_len, warmup_min
