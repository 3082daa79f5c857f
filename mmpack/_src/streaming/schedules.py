"""Token-driven schedules of the streaming packer: batch-size warm-up and masking-ratio cool-down.

Both are functions of the number of *real* tokens this process has emitted so far, evaluated
before each batch is built, with ModernBERT's packer's arithmetic reproduced exactly:

* :class:`BatchSizeWarmup` grows the number of rows from ``min_batch_size`` to
  ``max_batch_size``.  With ``W = ceil(warmup_tokens / world_size)`` (every rank counts only its
  own tokens) and ``S = sum(range(min, max))``, the thresholds are
  ``t_i = ceil(W / S * (min + ... + (min + i)))`` for ``i = 0 .. max - min - 1``; a token count
  ``n < W`` gets ``min + (first i with n < t_i)`` rows, ``n >= W`` gets ``max``.  Each batch size
  thus lasts a number of tokens proportional to itself, i.e. about as many batches.  Lookup is a
  binary search over the thresholds, O(log(max - min)).
* :class:`MaskingRatioCooldown` moves the MLM masking ratio from ``initial`` to ``final``
  (``final <= initial``) over ``ceil(cooldown_tokens / world_size)`` tokens starting at
  ``ceil(start_tokens / world_size)``: linearly, or in stairs of ``step_size`` (the number of
  stairs is ``ceil((initial - final) / step_size)``; stair ``floor(progress * stairs)`` is
  ``initial - stair * step_size``), never below ``final``.  O(1).

Durations are non-negative ints (tokens) or Composer-style strings such as ``"100000tok"`` (also
``"100_000tok"`` and ``"1e5tok"``; a mantissa/exponent must denote a whole number).  Only tokens
have a meaning here: batches (``"ba"``), samples (``"sp"``) and epochs (``"ep"``) depend on the
batch composition the packer is deciding, so they are rejected with a :class:`ValueError`.  An
object with ``.value`` and ``.unit`` (a ``composer.core.Time``) is accepted when its unit is tokens.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from fractions import Fraction
from typing import Any

__all__ = ["BatchSizeWarmup", "MaskingRatioCooldown", "parse_tokens", "token_schedules"]

_DURATION = re.compile(
    r"^\s*(?P<num>(?:\d+(?:_\d+)*)(?:\.\d*)?|\.\d+)(?P<exp>[eE][+-]?\d+)?\s*"
    r"(?P<unit>[A-Za-z]+)\s*$"
)
_OTHER_UNITS = {"ba", "sp", "ep", "dur", "sec", "batch", "batches", "sample", "samples", "epoch"}


def parse_tokens(value: Any, name: str = "duration") -> int:
    """A duration in tokens, from an int, a time string like ``"100000tok"``, or a Composer Time.

    Parameters
    ----------
    value : int | str | object with ``.value`` and ``.unit``
    name : str
        Argument name used in error messages.

    Returns
    -------
    int
        The number of tokens, ``>= 0``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a string like '100000tok', got {value!r}")
    if hasattr(value, "unit") and hasattr(value, "value") and not isinstance(value, str):
        unit = getattr(value.unit, "value", value.unit)
        return parse_tokens(f"{value.value}{unit}", name)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(
                f"{name}={value!r} is not a duration: expected an integer number of tokens "
                "followed by 'tok', e.g. '100000tok', '100_000tok' or '1e5tok'"
            )
        unit = m.group("unit").lower()
        if unit != "tok":
            what = "is a Composer unit that" if unit in _OTHER_UNITS else "is not a unit that"
            raise ValueError(
                f"{name}={value!r}: {unit!r} {what} the packer cannot use; only token durations "
                "are supported (e.g. '100000tok'), because batches, samples and epochs depend on "
                "the packing itself"
            )
        number = Fraction(m.group("num").replace("_", ""))
        if m.group("exp"):
            number *= Fraction(10) ** int(m.group("exp")[1:])
        if number.denominator != 1:
            raise ValueError(f"{name}={value!r} is not a whole number of tokens")
        return int(number)
    try:
        tokens = int(value.__index__())
    except (AttributeError, TypeError):
        raise TypeError(
            f"{name} must be an int or a string like '100000tok', got {type(value).__name__}"
        ) from None
    if tokens < 0:
        raise ValueError(f"{name} must be >= 0 tokens, got {tokens}")
    return tokens


def _check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return world_size


class BatchSizeWarmup:
    """Number of rows per batch as a function of the tokens emitted so far.

    Parameters
    ----------
    min_batch_size, max_batch_size : int
        ``1 <= min_batch_size <= max_batch_size``.
    warmup_tokens : int | str
        Tokens over which the batch size grows, across all ranks (divided by ``world_size``).
    world_size : int
        Number of ranks.
    """

    def __init__(
        self, min_batch_size: int, max_batch_size: int, warmup_tokens: Any, world_size: int = 1
    ) -> None:
        for arg, val in (("min_batch_size", min_batch_size), ("max_batch_size", max_batch_size)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{arg} must be an int >= 1, got {val!r}")
        if min_batch_size > max_batch_size:
            raise ValueError(
                f"min_batch_size={min_batch_size} must be <= max_batch_size={max_batch_size}"
            )
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.world_size = _check_world_size(world_size)
        self.warmup_tokens = math.ceil(parse_tokens(warmup_tokens, "warmup_tokens") / world_size)
        sizes = range(min_batch_size, max_batch_size)  # the thresholds: see the module docstring
        per_unit = self.warmup_tokens / sum(sizes) if len(sizes) else 0.0
        self.thresholds = [math.ceil(per_unit * c) for c in itertools.accumulate(sizes)]

    def __call__(self, tokens: int) -> int:
        """Rows of the next batch after ``tokens`` real tokens were emitted by this rank."""
        if tokens >= self.warmup_tokens:
            return self.max_batch_size
        i = bisect.bisect_right(self.thresholds, tokens)
        if i == len(self.thresholds):
            return self.max_batch_size
        return self.min_batch_size + i

    def __repr__(self) -> str:
        return (
            f"BatchSizeWarmup({self.min_batch_size} -> {self.max_batch_size} over "
            f"{self.warmup_tokens} tokens per rank)"
        )


class MaskingRatioCooldown:
    """MLM masking ratio as a function of the tokens emitted so far.

    Parameters
    ----------
    initial, final : float
        Ratios in ``[0, 1]`` with ``final <= initial``.
    cooldown_tokens : int | str
        Length of the cool-down across all ranks; ``ceil(cooldown_tokens / world_size) >= 1``.
    start_tokens : int | str
        Tokens (across all ranks) before the cool-down starts.
    schedule : {"linear", "stair"}
    step_size : float, optional
        Size of a stair, ``> 0``; required for ``"stair"``.
    world_size : int
    """

    def __init__(
        self,
        initial: float,
        final: float,
        cooldown_tokens: Any,
        *,
        start_tokens: Any = 0,
        schedule: str = "linear",
        step_size: float | None = None,
        world_size: int = 1,
    ) -> None:
        for arg, val in (("initial", initial), ("final", final)):
            if not isinstance(val, (int, float)) or isinstance(val, bool) or not 0 <= val <= 1:
                raise ValueError(f"{arg} masking ratio must be a number in [0, 1], got {val!r}")
        if final > initial:
            raise ValueError(
                f"final masking ratio {final} must be <= the initial ratio {initial} "
                "(a cool-down only decreases the ratio)"
            )
        schedule = getattr(schedule, "value", schedule)
        if schedule not in ("linear", "stair"):
            raise ValueError(f"schedule must be 'linear' or 'stair', got {schedule!r}")
        self.initial = float(initial)
        self.final = float(final)
        self.schedule = schedule
        self.step_size = step_size
        self.world_size = _check_world_size(world_size)
        self.num_stairs: int | None = None
        if schedule == "stair":
            if step_size is None:
                raise ValueError("step_size must be given for the 'stair' schedule")
            if not step_size > 0:
                raise ValueError(f"step_size must be > 0, got {step_size!r}")
            self.num_stairs = math.ceil((self.initial - self.final) / step_size)
        self.start_tokens = math.ceil(parse_tokens(start_tokens, "start_tokens") / world_size)
        self.cooldown_tokens = math.ceil(
            parse_tokens(cooldown_tokens, "cooldown_tokens") / world_size
        )
        if self.cooldown_tokens < 1:
            raise ValueError(
                f"cooldown_tokens / world_size must be >= 1 token, got {self.cooldown_tokens}"
            )
        self.end_tokens = self.start_tokens + self.cooldown_tokens

    def __call__(self, tokens: int) -> float:
        """Masking ratio of the next batch after this rank emitted ``tokens`` real tokens."""
        if tokens < self.start_tokens:
            return self.initial
        if tokens >= self.end_tokens:
            return self.final
        progress = (tokens - self.start_tokens) / self.cooldown_tokens
        if self.schedule == "linear":
            ratio = self.initial - progress * (self.initial - self.final)
        else:
            assert self.num_stairs is not None and self.step_size is not None
            ratio = self.initial - math.floor(progress * self.num_stairs) * self.step_size
        return max(ratio, self.final)

    def __repr__(self) -> str:
        return (
            f"MaskingRatioCooldown({self.initial} -> {self.final}, {self.schedule}, tokens "
            f"[{self.start_tokens}, {self.end_tokens}) per rank)"
        )


def token_schedules(
    max_batch_size: int,
    mask_prob: float,
    mode: str | None,
    *,
    batch_size_warmup_min_size: int | None,
    batch_size_warmup_tokens: Any,
    masking_ratio_cooldown_tokens: Any,
    masking_ratio_cooldown_start_tokens: Any,
    final_masking_ratio: float | None,
    masking_cooldown_schedule_type: str,
    masking_ratio_step_size: float | None,
    world_size: int,
) -> tuple[BatchSizeWarmup | None, MaskingRatioCooldown | None]:
    """The streaming packer's schedules from its arguments (see
    :class:`~mmpack.StreamingPacker`): a batch-size warm-up to
    ``max_batch_size`` rows and a masking-ratio cool-down from ``mask_prob``, each ``None``
    unless configured.  Each needs both of its two main arguments; the cool-down needs
    ``mode="mlm"``.  The keyword arguments have no defaults here: the packer's signature is
    their one home."""
    warmup: BatchSizeWarmup | None = None
    if (batch_size_warmup_min_size is None) != (batch_size_warmup_tokens is None):
        raise ValueError(
            "batch_size_warmup_min_size and batch_size_warmup_tokens go together; got "
            f"{batch_size_warmup_min_size!r} and {batch_size_warmup_tokens!r}"
        )
    if batch_size_warmup_min_size is not None:
        warmup = BatchSizeWarmup(
            batch_size_warmup_min_size, max_batch_size, batch_size_warmup_tokens, world_size
        )
    cooldown: MaskingRatioCooldown | None = None
    if (masking_ratio_cooldown_tokens is None) != (final_masking_ratio is None):
        raise ValueError(
            "masking_ratio_cooldown_tokens and final_masking_ratio go together; got "
            f"{masking_ratio_cooldown_tokens!r} and {final_masking_ratio!r}"
        )
    if masking_ratio_cooldown_tokens is not None:
        if mode != "mlm":
            raise ValueError(f"a masking-ratio cool-down needs mode='mlm', got mode={mode!r}")
        assert final_masking_ratio is not None  # checked above: the two go together
        cooldown = MaskingRatioCooldown(
            mask_prob,
            final_masking_ratio,
            masking_ratio_cooldown_tokens,
            start_tokens=masking_ratio_cooldown_start_tokens,
            schedule=masking_cooldown_schedule_type,
            step_size=masking_ratio_step_size,
            world_size=world_size,
        )
    return warmup, cooldown
