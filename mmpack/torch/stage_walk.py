"""Where a stage's sampler stands after any number of draws, with its skips and replays.

A stage of :class:`~mmpack.torch.stages.Stages` draws from one
:class:`~mmpack.torch.sampler.ResumableSampler`, epoch after epoch, and its position is the
sampler's ``(epoch, position, offset)``.  Each rank draws ``share(L_e)`` indices of epoch ``e``,
where ``L_e`` is the length of the epoch's stream (its positions after skips and replays,
:mod:`mmpack.sampling.sampler_edits`) and ``share`` the dealing rule of
:func:`mmpack.sampling.dealing.share_length`.  Only a few epochs have a stream of their own: those
holding a replay or an end of a skipped range (*special* epochs, ``O(edits)`` of them).  Every
other epoch is *plain* (``L_e = n``) or *void* (inside a skipped range: ``L_e = 0``), and
between two special epochs all epochs are of one kind.  So ``d`` more draws are found by walking
runs of epochs, not epochs: ``O(edits)`` steps whatever ``d``, each run of plain epochs taken by
one division.  The *frontier* of a point is the global position (``e * n + j``) after the last
position of the epochs' own orders served so far: the first that a skip may still reach.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from mmpack.sampling.dealing import share_length
from mmpack.torch.sampler import ResumableSampler

__all__ = ["StageWalk", "Where"]

Where = tuple[int, int, int]
"""``(epoch, position, offset)`` of a stage sampler, as its state records them."""


class StageWalk:
    """The draw arithmetic of one stage's sampler (its ``n``, world size, ``drop_last``, edits).

    Call :meth:`set_edits` whenever the sampler's skips or replays change.
    """

    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler
        self.n, self.world_size, self.drop_last = sampler.n, sampler.world_size, sampler.drop_last
        self.set_edits([], [])

    def set_edits(self, skips: Sequence[Sequence[int]], replays: Sequence[Sequence[int]]) -> None:
        """The sampler's skips ``[start, stop]`` (sorted, merged) and replays ``[epoch, ...]``."""
        n = self.n
        self._skips = [(int(a), int(b)) for a, b in skips]
        self._starts = [a for a, _ in self._skips]
        special = {e for a, b in self._skips for e in (a // n, (b - 1) // n)}
        self._special = sorted(special | {int(r[0]) for r in replays})

    def share(self, length: int, base: int = 0) -> int:
        """Indices each rank draws from a stream of ``length`` dealt from ``base``."""
        return share_length(length, base, self.world_size, self.drop_last)

    def length(self, epoch: int) -> int:
        """Length of epoch ``epoch``'s stream."""
        return self.run(epoch)[0]

    def run(self, epoch: int) -> tuple[int, int | None]:
        """``(L, end)``: every epoch of ``[epoch, end)`` has a stream of length ``L`` (``end``
        None: every later epoch too)."""
        k = bisect.bisect_left(self._special, epoch)
        if k < len(self._special) and self._special[k] == epoch:
            return self.sampler.stream(epoch).length, epoch + 1
        end = self._special[k] if k < len(self._special) else None
        j = bisect.bisect_right(self._starts, epoch * self.n) - 1
        void = j >= 0 and self._skips[j][1] > epoch * self.n  # then it covers the whole epoch
        return (0 if void else self.n), end

    def draws(self, where: Where, d: int) -> Where:
        """The point ``d >= 0`` draws after ``where``.  An epoch drawn to its end stays the point
        (another world size may deal a tail this one dropped, and a replay asked for there goes
        to the next epoch's start)."""
        epoch, position, base = where
        rest = self.share(self.length(epoch), base) - position
        if d <= rest:
            return epoch, position + d, base
        d -= rest
        epoch += 1
        while True:  # d >= 1 draws from the start of `epoch`
            length, end = self.run(epoch)
            per = self.share(length)
            if per == 0:
                if end is None:
                    raise ValueError(f"no epoch after {epoch - 1} has an index for this rank")
                epoch = end
                continue
            full = (d - 1) // per  # epochs drawn whole before the one the point ends in
            if end is None or full < end - epoch:
                return epoch + full, d - full * per, 0
            d -= (end - epoch) * per
            epoch = end

    def next_epoch(self, epoch: int) -> int:
        """The first epoch after ``epoch`` that deals this world size an index."""
        return self.draws((epoch + 1, 0, 0), 1)[0]

    def frontier(self, where: Where) -> int:
        """The global position after the last one of the epochs' own orders served by ``where``
        (what the ranks consumed: a skip may start there, a replay end there)."""
        epoch, position, base = where
        index = base + position * self.world_size
        return epoch * self.n + self.sampler.stream(epoch).frontier(index)
