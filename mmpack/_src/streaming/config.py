"""The streaming packer's parameters, checked once, and what they build.

:class:`PackerConfig` is the frozen, checked form of the arguments of
:class:`~mmpack.StreamingPacker` (their meaning is documented there): the rows'
options by the check both packers share (:func:`mmpack._src.packing.options.check_row_options`), the
packer's own by the rules of :mod:`mmpack._src.core.validation` and :mod:`mmpack._src.core.options` (bad
input is a ``TypeError``/``ValueError`` naming it).  It builds the schedules and the
labeller of a consumer (:meth:`PackerConfig.schedules`) and the ``config`` field of a state
(:meth:`PackerConfig.as_state`).  O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmpack._src.core.options import SourceFormat, parse_option
from mmpack._src.core.validation import check_bool, check_int, check_positive_int
from mmpack._src.packing.options import RowOptions, check_row_options
from mmpack._src.streaming.labels import Labeller
from mmpack._src.streaming.schedules import BatchSizeWarmup, MaskingRatioCooldown, token_schedules

__all__ = ["PackerConfig", "micro_batch_shape"]


@dataclass(frozen=True)
class PackerConfig(RowOptions):
    """A :class:`~mmpack.StreamingPacker`'s parameters, checked
    (:meth:`check`): its rows' options (:class:`~mmpack._src.packing.options.RowOptions`) and the
    packer's own; ``schedule_args`` are the schedules'
    (:func:`mmpack._src.streaming.schedules.token_schedules`)."""

    batch_size: int
    buffer_size: int
    drop_last: bool
    source_format: str
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
        buffer_size: Any,
        drop_last: Any,
        source_format: Any,
        readahead: Any,
        rank: Any,
        world_size: Any,
        shard: Any,
        schedule_args: dict[str, Any],
        **rows: Any,
    ) -> PackerConfig:
        """The checked parameters (the packer's signature holds their defaults): ``rows`` the
        rows' options (:func:`~mmpack._src.packing.options.check_row_options`), ``schedule_args``
        the schedules' (:func:`~mmpack._src.streaming.schedules.token_schedules`)."""
        batch_size = check_positive_int(batch_size, "batch_size")
        checked = check_row_options(**rows, labels_optional=True)
        buffer_size = check_positive_int(buffer_size, "buffer_size")
        if buffer_size < batch_size:
            raise ValueError(f"buffer_size={buffer_size} must be >= batch_size={batch_size}")
        if world_size is not None and check_int(world_size, "world_size") < 1:
            raise ValueError(f"world_size must be an int >= 1, got world_size={world_size!r}")
        if rank is not None and check_int(rank, "rank") < 0:  # (< world_size: current_consumer)
            raise ValueError(f"rank must be an int >= 0, got rank={rank!r}")
        config = cls(
            **vars(checked),
            batch_size=batch_size,
            buffer_size=buffer_size,
            drop_last=check_bool(drop_last, "drop_last"),
            source_format=parse_option(SourceFormat, source_format, "source_format").value,
            readahead=check_positive_int(
                buffer_size if readahead is None else readahead, "readahead"
            ),
            rank=None if rank is None else int(rank),
            world_size=None if world_size is None else int(world_size),
            shard=check_bool(shard, "shard"),
            schedule_args=schedule_args,
        )
        config.schedules(1)  # their arguments are checked now
        return config

    def schedules(self, divisor: int) -> tuple[BatchSizeWarmup | None, Labeller]:
        """The batch-size warm-up and the labeller (with its masking cool-down) of a consumer
        among ``divisor``, by which the schedules' token durations are divided."""
        warmup, cooldown = token_schedules(
            self.batch_size, self.mask_prob, self.mode, world_size=divisor, **self.schedule_args
        )
        return warmup, Labeller(self, cooldown)

    def as_state(
        self, warmup: BatchSizeWarmup | None, cooldown: MaskingRatioCooldown | None
    ) -> dict[str, Any]:
        """The parameters that decide the batches (with the consumer's schedules), as a state
        records them: plain Python values."""
        state: dict[str, Any] = {name: getattr(self, name) for name in _STATE_NAMES}
        state["special_ids"] = list(self.special_ids)
        state["batch_size_schedule"] = None
        if warmup is not None:
            state["batch_size_schedule"] = [warmup.min_batch_size, warmup.warmup_tokens]
        state["mask_prob_schedule"] = None
        if cooldown is not None:
            state["mask_prob_schedule"] = [
                cooldown.final,
                cooldown.start_tokens,
                cooldown.cooldown_tokens,
                cooldown.schedule,
                cooldown.step_size,
            ]
        return state


_STATE_NAMES = (
    "batch_size", "seqlen", "buffer_size", "mode", "label_shift", "pad_id", "eot", "mask_id",
    "vocab_size", "special_ids", "mask_prob", "ignore_index", "long_docs", "drop_last", "seed",
)  # fmt: skip
"""The parameters a state records, in its order (with the schedules after them)."""


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
