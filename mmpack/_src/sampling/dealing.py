"""Dealing: which sample each rank gets at each position of an epoch, by arithmetic.

Epoch ``e`` of a run over ``range(n)`` has an *order*: ``Permutation(n, seed=seed, epoch=e)``
(``shuffle=True``), the block-window order of a :class:`~mmpack.sampling.BlockOrder`
(``shuffle="blocks"``) or ``0, 1, ..., n - 1`` (``shuffle=False``).  Its *stream* is that order
after the run's skips and replays (:mod:`mmpack._src.sampling.sampler_edits`; the order itself
without edits).  The stream is dealt as :class:`torch.utils.data.DistributedSampler` deals:
padded by wrapping around to its own start up to ``world_size * ceil(length / world_size)``
indices (truncated to ``world_size * (length // world_size)`` with ``drop_last``), rank ``r``
taking stream indices ``base + r, base + r + world_size, ...`` (``base`` is 0 except in an epoch
resumed at another world size, :mod:`mmpack._src.torch.elastic`).  With a
:class:`~mmpack._src.sampling.balance.Balance` each step's ``batch_size * world_size`` stream indices
are dealt by cost instead (:mod:`mmpack._src.sampling.balance`).

This is the arithmetic of :class:`~mmpack.ResumableSampler` (which adds iteration,
checkpoints and edits made while it runs) with nothing of torch, so that a tool can say what a
run served without one (``mmpack show --position``).  Cost: O(1) memory; a batch of positions is
one vectorised map of the order, plus a binary search over the stream's pieces when edited.

Where a rank stands after any number of draws (:meth:`Dealing.draws`, the one epoch walk of the
run, used by :class:`~mmpack.Stages` and ``mmpack show --position``): only the
epochs holding a replay or an end of a skip have a stream of their own, ``O(edits)`` of them, and
between two of them every epoch deals the same share, so ``d`` draws are found by walking runs
of epochs, each in one division: ``O(edits)`` whatever ``d``.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels.balance import deal_groups
from mmpack._src.sampling.balance import Balance, attention_costs, balanced_positions, rank_slots
from mmpack._src.sampling.block_order import BlockOrder
from mmpack._src.sampling.permutation import Permutation
from mmpack._src.sampling.sampler_edits import EditLog

__all__ = ["Dealing", "Where", "share_length"]

Where = tuple[int, int, int]
"""``(epoch, position, base)`` of a rank in the run, as a sampler's state records it."""


def share_length(n: int, base: int, world_size: int, drop_last: bool) -> int:
    """Indices each of ``world_size`` ranks draws from stream index ``base`` to the end of a
    stream of ``n`` (``drop_last``: whole rounds only; else the last round padded)."""
    remaining = max(0, n - base)
    return remaining // world_size if drop_last else -(-remaining // world_size)


class Dealing:
    """The samples rank ``rank`` of ``world_size`` is dealt, epoch by epoch (parameters checked
    by the caller, as :class:`~mmpack.ResumableSampler` checks them).

    Parameters
    ----------
    n : int
        Samples of the dataset.
    shuffle : bool
        Whether the order is a keyed permutation (ignored when ``order`` is given).
    seed : int
        The permutations' key.
    rank, world_size : int
    drop_last : bool
    order : BlockOrder, optional
        The block-window order (``shuffle="blocks"``).
    edits : EditLog, optional
        The run's skips and replays (none by default); :attr:`edits` may be replaced.
    balance : Balance, optional
        Deal each step's samples by cost (:mod:`mmpack._src.sampling.balance`).
    """

    __slots__ = (
        "balance",
        "drop_last",
        "edits",
        "n",
        "order",
        "rank",
        "seed",
        "shuffle",
        "world_size",
        "_perm",
    )

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool,
        seed: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        order: BlockOrder | None = None,
        edits: EditLog | None = None,
        balance: Balance | None = None,
    ) -> None:
        self.balance = balance
        self.n = n
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.order = order
        self.edits = EditLog(n) if edits is None else edits
        self._perm: Permutation | None = None

    def share(self, epoch: int, base: int = 0) -> int:
        """Indices each rank draws of ``epoch``'s stream dealt from stream index ``base``."""
        return share_length(self.edits.length(epoch), base, self.world_size, self.drop_last)

    def order_samples(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """Samples at epoch positions ``positions`` of ``epoch``'s order (int64, in ``[0, n)``)."""
        if self.order is not None:
            return self.order.map_unchecked(positions, epoch)
        if not self.shuffle:
            return positions
        perm = self._perm
        if perm is None or perm.epoch != epoch:
            perm = self._perm = Permutation(self.n, seed=self.seed, epoch=epoch)
        return perm.map_unchecked(positions)

    def stream_index(self, start: int, stop: int, base: int = 0) -> np.ndarray:
        """Stream indices (before wrapping) of this rank's share positions ``[start, stop)``
        dealt from ``base`` (int64, (stop - start,))."""
        index = np.arange(start, stop, dtype=np.int64)
        index *= self.world_size
        index += self.rank + base
        return index

    def lookup(
        self, start: int, stop: int, epoch: int, base: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
        """``(samples, epoch id of each or None, epochs)`` at this rank's share positions
        ``[start, stop)`` (``0 <= start <= stop <= share(epoch, base)``) of ``epoch``'s stream
        dealt from ``base``; sample ``k`` belongs to epoch ``epochs[ids[k]]`` (``epochs[0]`` for
        every sample when ``ids`` is None, a replay may serve another epoch's)."""
        if self.balance is not None:
            return self._balanced(start, stop, epoch, base, self.balance)
        index = self.stream_index(start, stop, base)
        length = self.edits.length(epoch)
        if stop > 0 and base + (stop - 1) * self.world_size + self.rank >= length:
            index %= length  # padding wraps around to the start of the stream
        return self.edits.samples(index, epoch, self.order_samples)

    def _balanced(
        self, start: int, stop: int, epoch: int, base: int, balance: Balance
    ) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
        """:meth:`lookup` with each step's group dealt by cost: the whole groups that hold
        positions ``[start, stop)`` looked up and dealt, this rank's slots kept."""
        size, world = balance.batch_size, self.world_size
        share = self.share(epoch, base)
        offsets, group_ptr = balanced_positions(start, stop, share, size, world)
        offsets += base
        length = self.edits.length(epoch)
        if offsets.size and int(offsets[-1]) >= length:
            offsets %= length  # padding wraps around to the start of the stream
        samples, ids, epochs = self.edits.samples(offsets, epoch, self.order_samples)
        owner = deal_groups(attention_costs(balance.costs, samples), group_ptr, world)
        slots = rank_slots(owner, group_ptr, self.rank, start, stop, size)
        return samples[slots], None if ids is None else ids[slots], epochs

    def served_index(self, global_position: int) -> int | None:
        """The stream index (of epoch ``global_position // n``) at which the run serves global
        position ``global_position`` in its epoch's own order; ``None`` when it is skipped.
        Replays, which serve it again later, are not counted."""
        epoch, g = divmod(global_position, self.n)
        if self.edits.empty:
            return g
        stream = self.edits.stream(epoch)
        for k, own in enumerate(stream.original):
            if own and stream.epochs[k] == epoch and int(stream.lo[k]) <= g < int(stream.hi[k]):
                return int(stream.cum[k]) + g - int(stream.lo[k])
        return None

    def rank_epoch(self, position: int) -> tuple[int, int]:
        """``(epoch, t)``: this rank's ``position``-th sample of the run (counted over epochs
        dealt from 0) is its sample ``t`` of ``epoch``.  ``ValueError`` when no epoch deals it
        anything.  O(edits), by :meth:`draws`."""
        try:
            epoch, drawn, _ = self.draws((0, 0, 0), position + 1)
        except ValueError:
            raise ValueError(f"rank {self.rank} of {self.world_size} is dealt nothing") from None
        return epoch, drawn - 1

    def draws(self, where: Where, d: int) -> Where:
        """The point ``d >= 0`` draws of this rank after ``where`` (``(epoch, position, base)``:
        ``position`` indices drawn of ``epoch``'s stream dealt from ``base``, as a sampler's
        state records it).  An epoch drawn to its end stays the point (another world size may
        deal a tail this one dropped, and a replay asked for there goes to the next epoch's
        start).  Walks runs of epochs of one stream length (:meth:`EditLog.run
        <mmpack._src.sampling.sampler_edits.EditLog.run>`), each in one division: O(edits) whatever
        ``d``.  ``ValueError`` when no later epoch deals this rank an index."""
        epoch, position, base = where
        rest = self.share(epoch, base) - position
        if d <= rest:
            return epoch, position + d, base
        d -= rest
        epoch += 1
        while True:  # d >= 1 draws from the start of `epoch`
            length, end = self.edits.run(epoch)
            per = share_length(length, 0, self.world_size, self.drop_last)
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
        """The global position after the last one of the epochs' own orders served by the
        ranks at ``where`` (what they consumed: a skip may start there, a replay end there)."""
        epoch, position, base = where
        return self.edits.frontier(epoch, base + position * self.world_size)
