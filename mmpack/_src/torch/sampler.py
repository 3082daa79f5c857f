"""A resumable, distributed, O(1)-memory sampler over ``range(n)``.

Epoch ``e`` visits ``range(n)`` in the order of ``Permutation(n, seed=seed, epoch=e)`` (the
global order), in the block-window order of :class:`~mmpack.sampling.BlockOrder` with
``shuffle="blocks"``, or in order when ``shuffle=False``: a pure function of ``(seed, epoch,
position)`` (and the block bounds), never materialised.  With ``world_size`` ranks the epoch
order is cut like :class:`torch.utils.data.DistributedSampler` cuts it (padded by wrapping
around, or truncated with ``drop_last=True``), rank ``r`` taking positions ``r, r + world_size,
...``.  Skips and replays (:meth:`ResumableSampler.skip`, :meth:`ResumableSampler.replay`) edit
the sequence an epoch deals, its *stream* (:mod:`mmpack._src.sampling.sampler_edits`); the orders,
the stream and the dealing are :class:`~mmpack._src.sampling.dealing.Dealing`, arithmetic without
torch that this sampler iterates, checkpoints and edits.

Resuming is arithmetic: the state is ``(epoch, offset, position)``, ``position`` counting the
indices the current iterator handed out and ``offset`` the epoch position its shares start at,
so ``offset + position * world_size`` positions are consumed by all ranks together; a loaded
state starts the next iterator there.  A state saved at world size ``W1`` loads at any ``W2``
(:mod:`mmpack._src.torch.elastic`).

Cost: O(1) memory whatever ``n`` (plus one 8192-index chunk while iterating, computed by
:meth:`Permutation.map` and handed out as :class:`~mmpack.store.EpochIndex` values);
``state_dict`` and ``load_state_dict`` are O(1); the block-window order adds 8 bytes per block
and window offsets built once per epoch, and over a remote store drives the whole-block fetch
(:mod:`mmpack._src.torch.block_fetch`).  Rates: ``python -m benchmarks.bench_sampler``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
from torch.utils.data import Sampler

from mmpack._src.core.constants import FETCH_BLOCK_BYTES, WINDOW_BLOCKS
from mmpack._src.core.permutation_keys import MAX_N
from mmpack._src.core.sample_order import check_shuffle, order_block_bytes
from mmpack._src.core.validation import (
    EpochIndex,
    check_bool,
    check_in_range,
    check_int,
    check_int_range,
    epoch_index_type,
)
from mmpack._src.sampling.balance import Balance, balanced_resume
from mmpack._src.sampling.block_order import BlockOrder
from mmpack._src.sampling.dealing import Dealing
from mmpack._src.sampling.sampler_edits import EditLog, Stream
from mmpack._src.sampling.sampler_state import STATE_VERSION, check_config, checked_state
from mmpack._src.torch import elastic
from mmpack._src.torch.block_fetch import WindowFetcher

__all__ = ["ResumableSampler", "STATE_VERSION"]

_CHUNK = 8192
BLOCKS = "blocks"
"""``shuffle=BLOCKS`` selects the block-window order."""


class _Cursor:
    """Where one iterator stands: the epoch it walks, the position it started at and how many
    indices it has handed out (``position``, counted from the start of the epoch)."""

    __slots__ = ("base", "chunk", "chunk_lo", "epoch", "position", "start")

    def __init__(self, epoch: int, position: int, base: int = 0) -> None:
        self.epoch = epoch
        self.position = position
        self.start = position
        self.base = base  # stream index of this rank-set's first draw (elastic resume)
        self.chunk: list[int] = []  # the indices being handed out, from position chunk_lo
        self.chunk_lo = position

    def cut(self) -> None:
        """Drop the chunk's indices not handed out yet: the next draw recomputes them (an edit)."""
        del self.chunk[self.position - self.chunk_lo :]


class ResumableSampler(Sampler[int]):
    """Shuffled, sharded, resumable sampler over ``range(n)`` in O(1) memory.

    Parameters
    ----------
    n : int or dataset
        Number of samples of the dataset, ``0 <= n <= 2**62``, or the dataset itself (anything
        with ``len``): the sampler then also takes its order rule and its ``fingerprint``.
    shuffle : bool or "blocks", optional
        ``True``: visit each epoch in a keyed pseudo-random order of all samples (the global
        order); ``"blocks"``: in the block-window order over ``block_bounds`` (reads whole blocks
        of consecutive samples, see :mod:`mmpack._src.sampling.block_order`); ``False``: visit
        ``0, 1, ..., n-1``.  Default ``True``, except over a dataset that orders itself (its
        ``ordered`` is true: a mixture whose weights follow a schedule), read in its own order
        (``False``; ``True`` or ``"blocks"`` is then a ``ValueError``), and over a remote store,
        read in the block order (over ``block_bounds``, else the dataset's at 4 MiB blocks;
        :func:`~mmpack._src.core.sample_order.check_shuffle`).
    seed : int, default 0
        Key of the permutations, ``0 <= seed < 2**64``.  Every rank must use the same seed.
    rank, world_size : int, default 0 and 1
        This process's share: ``0 <= rank < world_size``.
    drop_last : bool, default False
        ``True``: every rank gets ``n // world_size`` indices and the tail of the epoch order is
        dropped.  ``False``: every rank gets ``ceil(n / world_size)`` indices, the last ranks'
        shares being completed with the first indices of the epoch order (as in
        ``DistributedSampler``).
    block_bounds : array-like of int, shape (B + 1,), optional
        With ``shuffle="blocks"`` (and only then, where it is required): ``[0, b_1, ..., n]``,
        strictly increasing, cutting ``range(n)`` into blocks of consecutive samples, e.g. a
        view's ``block_bounds(block_bytes)``.
    window_blocks : int, default 256
        With ``shuffle="blocks"``: blocks per window, ``W >= 1``.  Two samples of one window share
        a block with probability ``(S - 1) / (W S - 1) < 1 / W`` for blocks of ``S`` samples,
        whatever ``S``: at the default, below 0.4%, so a batch of ``b = 32`` holds on average
        fewer than 2 of its 496 pairs from one block, while a window still reads only 256 whole
        blocks (a fetcher holding the current and the next window keeps ``2 W`` blocks).
    fingerprint : str, optional
        Names the dataset configuration: the state records it and ``load_state_dict`` refuses a
        state saved with another.  Default: the dataset's ``fingerprint`` when ``n`` is a
        dataset that has one (every mmpack view), with its ``earlier_fingerprints`` (a mixture
        changed by ``with_schedule``: states of the mixture it was changed from load while they
        stand at or before the change), else None (not checked).
    costs : callable, optional
        Deal each step's ``batch_size * world_size`` samples (the same as without it) by cost,
        ``costs(indices)`` (e.g. ``view.attention_cost``): :mod:`mmpack._src.sampling.balance`.
    batch_size : int, optional
        With ``costs`` (and only then): samples per rank per step, the DataLoader's.

    Notes
    -----
    Call :meth:`set_epoch` before each epoch; iterating again without it repeats the epoch.

    ``iter()`` yields :class:`~mmpack.store.EpochIndex` values: plain ``int`` indices to any
    dataset, which also carry the epoch they were drawn for.  The epoch thus reaches DataLoader
    workers with the indices (persistent workers included), and mmpack's views use it: a
    ``PackedDataset(mode="mlm")`` masks each epoch differently, and a resumed run masks as the
    original did, with no ``set_epoch`` call on the dataset.

    ``state_dict()`` records the epoch and the number of indices handed out by the most recent
    iterator; a sampler that loads it yields exactly the rest of that epoch from the first
    iterator that draws (nothing if the epoch was finished; an iterator created but never drawn
    from, as a DataLoader with workers makes, does not spend it), then follows ``set_epoch`` as
    usual.  Calling ``set_epoch`` with another epoch before that discards the loaded position.
    Since all ranks advance in lockstep, the state of any rank can be loaded by any rank of any
    ``world_size`` (``rank`` is recorded but not checked): at another world size the new ranks
    share the positions the old ones had not consumed (:mod:`mmpack._src.torch.elastic`).  It is a
    ``Stateful`` for torchdata's ``StatefulDataLoader``, which saves and restores it (exactly,
    even with prefetching workers: the loader snapshots the sampler when it draws).
    With a plain ``DataLoader`` pass the number of samples the loop consumed:
    ``state_dict(consumed=...)``.
    """

    def __init__(
        self,
        n: Any,
        *,
        shuffle: bool | Literal["blocks"] | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        block_bounds: Any = None,
        window_blocks: int = WINDOW_BLOCKS,
        fingerprint: str | None = None,
        costs: Any = None,
        batch_size: int | None = None,
    ) -> None:
        dataset, earlier = None, ()
        if hasattr(n, "__len__") and getattr(n, "ndim", None) != 0:  # a dataset, not a 0-d int
            dataset, n = n, len(n)
            own = getattr(dataset, "fingerprint", None)
            if fingerprint is None and isinstance(own, str):
                fingerprint, earlier = own, tuple(getattr(dataset, "earlier_fingerprints", ()))
        n = check_in_range(n, "n", 0, MAX_N, closed=True)
        seed = check_in_range(seed, "seed", 0, 2**64)
        world_size = check_int(world_size, "world_size")
        rank = check_int(rank, "rank")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got world_size={world_size}")
        check_int_range(world_size, "world_size", None)  # the upper bound, 2**62
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        self._n = n
        self._shuffle = check_shuffle(shuffle, dataset, window_blocks=window_blocks)
        self._order: BlockOrder | None = None
        if self._shuffle == BLOCKS:
            if block_bounds is None and shuffle is None and dataset is not None:  # default
                block_bounds = dataset.block_bounds(order_block_bytes(dataset, FETCH_BLOCK_BYTES))
            if block_bounds is None:
                raise ValueError(
                    "shuffle='blocks' needs block_bounds (e.g. ds.block_bounds(2**22))"
                )
            self._order = BlockOrder(n, block_bounds, window_blocks=window_blocks, seed=seed)
        elif block_bounds is not None:
            raise ValueError(
                f"block_bounds is only used with shuffle='blocks', got shuffle={self._shuffle!r}"
            )
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise TypeError(
                f"fingerprint must be a str or None, got {type(fingerprint).__name__} {fingerprint!r}"
            )
        self._fingerprint = fingerprint
        self._earlier: tuple[tuple[str, int], ...] = earlier
        self._seed = seed
        self._rank = rank
        self._world_size = world_size
        self._drop_last = check_bool(drop_last, "drop_last")
        if (costs is None) != (batch_size is None):
            raise ValueError(f"costs and batch_size go together, got batch_size={batch_size!r}")
        self._balance = None if costs is None else Balance(costs, batch_size)  # type: ignore[arg-type]
        size = 1 if self._balance is None else self._balance.batch_size  # whole steps a chunk
        self._chunk_size = size * max(1, _CHUNK // (size * world_size)) if self._balance else _CHUNK
        self._deal = Dealing(
            n, shuffle=bool(self._shuffle), seed=seed, rank=rank, world_size=world_size,
            drop_last=self._drop_last, order=self._order, balance=self._balance,
        )  # fmt: skip
        self._epoch = 0
        self._resume_at: int | None = None
        self._resume_base = 0
        self._cursor = _Cursor(0, 0)
        self.window_fetcher = None if dataset is None else WindowFetcher.auto(dataset, self)
        """The whole-block fetcher every iterator drives (over a remote store's view in the
        block order, :mod:`mmpack._src.torch.block_fetch`), else None."""

    # -- parameters ----------------------------------------------------------------------------

    @property
    def n(self) -> int:
        """Size of the dataset."""
        return self._n

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shuffle(self) -> bool | str:
        return self._shuffle

    @property
    def block_order(self) -> BlockOrder | None:
        """The block-window order (``shuffle="blocks"``), else ``None``."""
        return self._order

    @property
    def fingerprint(self) -> str | None:
        """The dataset configuration the state records and checks (``None``: not checked)."""
        return self._fingerprint

    @property
    def dealing(self) -> Dealing:
        """The order and dealing arithmetic of this sampler (which stream index each of this
        rank's indices takes), shared with tools that do without torch."""
        return self._deal

    def stream(self, epoch: int) -> Stream:
        """Epoch ``epoch``'s stream: its epoch positions after skips and replays (a
        :class:`~mmpack._src.sampling.sampler_edits.Stream`), before it is dealt to the ranks."""
        return self._deal.edits.stream(epoch)

    @property
    def skips(self) -> list[tuple[int, int]]:
        """The skipped ranges of global positions, sorted and merged."""
        return [(a, b) for a, b in self._deal.edits.skips]

    @property
    def balance(self) -> Balance | None:
        """The balanced dealing's costs and batch size (``None``: round-robin)."""
        return self._balance

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def drop_last(self) -> bool:
        return self._drop_last

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` walks."""
        return self._epoch

    @property
    def handed_out(self) -> int:
        """Indices the most recent iterator has handed out (0 while a loaded state waits)."""
        return 0 if self._resume_at is not None else self._cursor.position - self._cursor.start

    def __len__(self) -> int:
        """Number of indices this rank gets in the current epoch (its stream dealt from 0)."""
        return self._share(self._epoch)

    def _share(self, epoch: int, base: int = 0) -> int:
        return self._deal.share(epoch, base)

    def __repr__(self) -> str:
        return (
            f"ResumableSampler(n={self._n}, shuffle={self._shuffle!r}, seed={self._seed}, "
            f"rank={self._rank}, world_size={self._world_size}, drop_last={self._drop_last}, "
            f"epoch={self._epoch}{self._order_repr()})"
        )

    def _order_repr(self) -> str:
        o = self._order
        return "" if o is None else f", blocks={o.n_blocks}, window_blocks={o.window_blocks}"

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next ``iter()`` (``epoch >= 0``)."""
        epoch = check_in_range(epoch, "epoch", 0, 2**64)
        if epoch != self._epoch:
            self._resume_at = None
            self._resume_base = 0
            self._epoch = epoch

    # -- indices -------------------------------------------------------------------------------

    def indices(self, start: int, stop: int, *, epoch: int | None = None) -> np.ndarray:
        """The indices this rank gets at positions ``[start, stop)`` of an epoch.

        Parameters
        ----------
        start, stop : int
            ``0 <= start <= stop <= len(self)``.
        epoch : int, optional
            Defaults to the current epoch.

        Returns
        -------
        numpy.ndarray, int64, shape (stop - start,)
        """
        start = check_int(start, "start")
        stop = check_int(stop, "stop")
        epoch = self._epoch if epoch is None else check_int(epoch, "epoch")
        share = self._share(epoch)
        if not 0 <= start <= stop <= share:
            raise IndexError(
                f"positions must satisfy 0 <= start <= stop <= {share}, got start={start}, stop={stop}"
            )
        return self._deal.lookup(start, stop, epoch)[0]

    def _chunk(self, start: int, stop: int, epoch: int, base: int) -> tuple[list[int], Any]:
        """The samples (a list :meth:`_Cursor.cut` may truncate) and an iterator tagging them
        with their epochs, one :class:`EpochIndex` at a time."""
        samples, ids, epochs = self._deal.lookup(start, stop, epoch, base)
        chunk = samples.tolist()
        if ids is None:
            return chunk, map(epoch_index_type(epochs[0]), chunk)
        types = [epoch_index_type(e) for e in epochs]
        return chunk, map(operator.call, [types[k] for k in ids.tolist()], chunk)

    def __iter__(self) -> Iterator[int]:
        start = 0 if self._resume_at is None else self._resume_at
        cursor = self._cursor = _Cursor(self._epoch, start, self._resume_base)
        indices = self._generate(cursor, self._resume_at is not None)
        return indices if self.window_fetcher is None else self.window_fetcher.drive(indices)

    def _generate(self, cursor: _Cursor, resumed: bool) -> Iterator[EpochIndex]:
        # Runs at the first next(): a loaded position is spent by the first iterator that draws,
        # not the first created (a DataLoader with workers creates one it never draws from).
        if resumed and self._resume_at is not None:
            self._resume_at, self._resume_base = None, 0
        epoch = cursor.epoch
        while True:  # one chunk a turn; an edit cuts the chunk, and the next turn sees it
            lo = cursor.position
            total = self._share(epoch, cursor.base)
            if lo >= total:
                return
            hi = min(lo + self._chunk_size, total)
            cursor.chunk, tagged = self._chunk(lo, hi, epoch, cursor.base)
            cursor.chunk_lo = lo
            for index in tagged:  # over a list iterator: it stops where cut() truncates
                cursor.position += 1
                yield index

    # -- checkpointing -------------------------------------------------------------------------

    def _where(self) -> tuple[int, int, int]:
        """``(epoch, position, offset)`` where the next draw stands (what ``state_dict`` saves)."""
        if self._resume_at is not None or self._cursor.epoch != self._epoch:
            return self._epoch, self._resume_at or 0, self._resume_base
        return self._cursor.epoch, self._cursor.position, self._cursor.base

    def _config(self) -> dict[str, Any]:
        order = self._order
        return {
            "n": self._n,
            "seed": self._seed,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
            "window_blocks": None if order is None else order.window_blocks,
            "bounds_digest": None if order is None else order.digest,
            "fingerprint": self._fingerprint,
        }

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """A small dict recording where the most recent iterator stands, and the edits.

        Parameters
        ----------
        consumed : int, optional
            How many indices of the most recent iterator the training loop has actually consumed
            (samples, not batches).  Give it with a plain ``torch.utils.data.DataLoader`` whose
            workers prefetch: the sampler has then handed out more indices than the loop used
            (``state_dict()`` alone would resume after the prefetched ones and skip them).  The
            state then resumes right after the ``consumed``-th index of that iterator (counted
            from where it started, so a resumed loop counts from 0 again).  ``0 <= consumed <=``
            the indices it handed out; ``ValueError`` otherwise.  Not needed with
            ``torchdata``'s ``StatefulDataLoader``, which snapshots the sampler itself.

        Returns
        -------
        dict
            The fields of :mod:`mmpack._src.sampling.sampler_state` (its table), plain Python values:
            ``{"version", "n", "seed", "shuffle", "drop_last", "window_blocks",
            "bounds_digest", "fingerprint", "world_size", "rank", "epoch", "position", "offset",
            "skips", "replays"}``.  The ranks together have consumed the first
            ``offset + position * world_size`` indices of the epoch's stream.  Before any
            ``iter()`` (or right after ``load_state_dict``) it describes where the next
            ``iter()`` starts.
        """
        if consumed is not None:
            epoch, position, base = self._consumed_position(check_int(consumed, "consumed"))
        else:
            epoch, position, base = self._where()
        return {
            "version": STATE_VERSION,
            **self._config(),
            "world_size": self._world_size,
            "rank": self._rank,
            "epoch": epoch,
            "position": position,
            "offset": base,
            "skips": [list(r) for r in self._deal.edits.skips],
            "replays": [list(r) for r in self._deal.edits.replays],
        }

    def _consumed_position(self, consumed: int) -> tuple[int, int, int]:
        """``(epoch, position, offset)`` after ``consumed`` indices of the most recent iterator."""
        if self._resume_at is not None:  # a loaded state that no iterator has drawn from yet
            handed, epoch, start, base = 0, self._epoch, self._resume_at, self._resume_base
        else:
            cursor = self._cursor
            handed, epoch, start = cursor.position - cursor.start, cursor.epoch, cursor.start
            base = cursor.base
        if not 0 <= consumed <= handed:
            raise ValueError(
                f"consumed={consumed}, but the sampler's current iterator has handed out {handed} "
                f"indices (epoch {epoch}, from position {start}); expected 0 <= consumed <= {handed}"
            )
        return epoch, start + consumed, base

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` yields the rest of the saved epoch.

        The state may come from any ``world_size`` (elastic resume): this sampler's ranks together
        then yield the stream indices the saving ranks had not consumed, rank ``r`` taking
        ``G + r, G + r + world_size, ...`` with ``G = offset + position * saved world_size``
        (:func:`mmpack._src.torch.elastic.resumed_positions`); later epochs are dealt as usual.  The
        state's skips and replays replace this sampler's.

        Raises
        ------
        mmpack.errors.StateMismatchError
            The state belongs to another configuration: ``n``, ``seed``, ``shuffle``,
            ``drop_last``, ``fingerprint`` or (block order) ``window_blocks`` or block bounds.
        mmpack.errors.FormatError
            The state is not a dict of this format or version, a field is missing, unknown or
            not of its type (NumPy scalars count), or its rank, epoch, offset, position or edits
            are out of range; the message names the field and its value.
        """
        state = checked_state(state)
        config = self._config()
        config["n_blocks"] = None if self._order is None else self._order.n_blocks
        check_config(state, config, self._earlier)
        edits = EditLog.from_state(self._n, state["skips"], state["replays"])
        length = edits.length(state["epoch"])
        point = elastic.resume_point(state, length, self._world_size, self._drop_last)
        if self._balance is not None:
            point = balanced_resume(state, length, self._world_size, self._balance, point)
        self._deal.edits, self._epoch = edits, state["epoch"]
        self._resume_at, self._resume_base = point
        self._cursor.cut()

    # -- skips and replays -----------------------------------------------------------------------

    def _stream_point(self) -> tuple[int, int, bool]:
        """``(epoch, G, more)``: the stream index ``G`` the ranks' next draws start at, and
        whether this world size draws anything more of that epoch."""
        epoch, position, base = self._where()
        more = self._share(epoch, base) > position
        return epoch, base + position * self._world_size, more

    def skip(self, start: int, stop: int) -> None:
        """Never serve global positions ``[start, stop)`` (of the current or a later epoch).

        Global position ``e * n + j`` is position ``j`` of epoch ``e``'s order, before dealing
        (padding is no global position, so positions do not depend on the world size).  Skipped
        positions leave the epoch's stream before it is dealt: ranks stay in step, an iterator in
        progress continues without them, and the state records them, so a resumed run at any
        world size skips them too.

        Raises
        ------
        ValueError
            ``start >= stop``, negative, or a position of the range is already consumed (lies
            below the first position the ranks have not served); the message names the values.
        """
        epoch, g, _ = self._stream_point()
        self._deal.edits.add_skip(start, stop, epoch, g)
        self._cursor.cut()

    def replay(self, start: int, stop: int) -> None:
        """Serve the consumed global positions ``[start, stop)`` again, next.

        The range is served right after what the ranks have consumed and after every replay
        asked before it that is not fully served yet (replays queue in the order of the calls),
        before the rest of the epoch (at the start of the next epoch if this one has nothing left
        at this world size), in order of global position, without its skipped positions.  Each replayed index carries the epoch it was
        first drawn for.  The state records it, so resumes at any world size serve it exactly.

        Raises
        ------
        ValueError
            ``start >= stop``, negative, or the range reaches positions not consumed yet; the
            message names the values.
        """
        self._deal.edits.add_replay(start, stop, *self._stream_point())
        self._cursor.cut()
