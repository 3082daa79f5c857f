"""Weighted mixtures of random-access datasets, by arithmetic: no per-sample table, no build step.

Weights become integer quotas ``c_k`` out of a period ``P`` (:mod:`mmpack._src.sampling.weights`); the
effective weights ``q_k = c_k / P`` (:attr:`Mixture.weights`) are within about ``1e-6`` of the
normalized weights given.  Sample ``i`` belongs to source ``k`` following Tijdeman's chairman
sequence (:mod:`mmpack._src.kernels.mixture`): every prefix of ``n`` samples holds ``n q_k`` samples of
source ``k`` within ``1 - 1 / (2 K' - 2)`` (``K'`` sources of positive weight), strictly within 1.
One period is built once (O(P K), at most ~1.5 MB) and position ``i`` is located by a checkpoint
read plus a scan of at most 64 entries, whatever ``i``.  The sources are checked and read by
:mod:`mmpack._src.sampling.mixture_batches`.

Occurrence ``o`` of source ``k`` is item ``Permutation(len_k, seed=(seed, k), epoch=o //
len_k)[o % len_k]``: every pass over a source is its own keyed permutation (a source partly used
draws a uniform subset; a small source repeats reshuffled).  With ``block_bytes`` each pass
visits the source's blocks in a keyed order instead (:mod:`mmpack._src.sampling.mixture_blocks`).
``num_samples`` defaults to the longest prefix in which no source is drawn beyond its length
(``min_k len_k / q_k`` up to one sample, capped at ``2**62``).

``weights`` may be a :class:`~mmpack.Schedule`: positions are then dealt by the
nested splits of :mod:`mmpack._src.sampling.schedule_plan`, :meth:`Mixture.with_schedule` changes it
from a position on, and ``num_samples`` follows the same rule.  :attr:`Mixture.fingerprint`
digests everything that decides which sample a position holds.  Cost: O(1) per lookup whatever
``num_samples`` (rates: ``python -m benchmarks.bench_sampler``, its mixture rows).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack._src.core.permutation_keys import MAX_N
from mmpack._src.core.validation import (
    EpochIndex,
    check_in_range,
    check_index,
    check_indices,
    index_epochs,
)
from mmpack._src.kernels.mixture import (
    locate_many,
    occurrence_position,
    prefix_counts,
)
from mmpack._src.sampling.mixture_batches import (
    check_compatible_sources,
    common_seqlen,
    read_sources,
    scatter_batches,
    source_length,
)
from mmpack._src.sampling.mixture_blocks import BlockPasses, mixture_bounds
from mmpack._src.sampling.mixture_items import SourcePasses
from mmpack._src.sampling.mixture_stats import MixtureStats, period_error
from mmpack._src.sampling.schedule import Schedule
from mmpack._src.sampling.schedule_weights import (
    changed_mixture,
    mixture_fingerprint,
    resolve_weights,
)
from mmpack._src.sampling.weights import (
    RESOLUTION,
    STRIDE,
    chairman_table,
    normalize_weights,
    quantize_weights,
)
from mmpack._src.store.vocab import check_same_tokenizer
from mmpack._src.views.batch import SampleBatch

__all__ = ["Mixture", "MixtureStats", "RESOLUTION", "quantize_weights"]

# The period tables of the weight vectors in use (up to ~1.5 MB each at P = 10**6).
_period_tables = functools.lru_cache(maxsize=16)(chairman_table)


class Mixture:
    """A weighted, deterministic, random-access mixture of random-access sources.

    Parameters
    ----------
    sources : sequence of datasets
        Each has ``__len__`` and ``__getitem__(int) -> dict[str, numpy.ndarray]``, optionally
        ``__getitems__(list[int]) -> list[dict]``.  Sources of positive weight must be non-empty;
        all non-empty sources must agree on the keys and array shapes of their sample 0 (the
        length of ``cu_seqlens``, which varies from sample to sample, is not compared; a
        difference of dtypes is a warning).
    weights : sequence of float, shape (len(sources),), or Schedule
        Non-negative, finite, not all zero; normalized and quantized (see the module docstring).
        A zero weight means the source is never drawn.  A
        :class:`~mmpack.Schedule` of ``len(sources)`` weights makes them a
        function of the position (:mod:`mmpack._src.sampling.schedule_plan`).
    num_samples : int, optional
        Length of the mixture (any ``0 <= num_samples <= 2**62``; sources repeat as needed).
        Default: the longest prefix in which no source repeats (see the module docstring).
    seed : int, default 0
        Key of the per-source permutations, ``0 <= seed < 2**64``.
    mixed_tokenizers : bool, default False
        Allow sources whose stores record different tokenizers (refused by default).
    block_bytes : int, optional
        Keep the sources' locality: every source of positive weight gives
        ``block_bounds(block_bytes)``, each pass over a source visits its blocks in a keyed order
        (the items of a block in order) instead of its items in a keyed order, and
        :meth:`block_bounds` gives the mixture's blocks for
        ``ResumableSampler(shuffle="blocks")`` (:mod:`mmpack._src.sampling.mixture_blocks`).

    Notes
    -----
    An index that carries its epoch (:class:`~mmpack.store.EpochIndex`, as
    :class:`~mmpack.ResumableSampler` yields them) hands that epoch on to the source's
    item, so MLM sources mask each epoch differently.

    Each item is the source's dict plus ``"source"``: the int ``k`` (replacing any ``"source"``
    the item had); a batch from views is one ``SampleBatch`` with a ``source`` column.  The mixture pickles as its sources and parameters; the period
    tables are rebuilt (and shared through a cache) in the receiving process.
    """

    def __init__(
        self,
        sources: Sequence[Any],
        weights: Sequence[float] | np.ndarray,
        *,
        num_samples: int | None = None,
        seed: int = 0,
        mixed_tokenizers: bool = False,
        block_bytes: int | None = None,
    ) -> None:
        sources = tuple(sources)
        if not sources:
            raise ValueError("sources must hold at least one dataset, got none")
        # Views over stores that record different tokenizers: their ids mean different things.
        check_same_tokenizer(
            [getattr(s, "store", None) for s in sources], mixed_tokenizers, "sources"
        )
        quotas, period, plan = resolve_weights(weights, sources)
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got seed={seed}")
        lengths = np.array([source_length(s, k) for k, s in enumerate(sources)], dtype=np.int64)
        drawn = quotas > 0 if plan is None else plan.positive
        empty = [k for k in range(len(sources)) if lengths[k] == 0 and drawn[k]]
        if empty:
            raise ValueError(f"sources {empty} are empty but have positive weight")
        check_compatible_sources(sources, lengths)
        self._sources = sources
        self._lengths = lengths
        self._quotas = quotas
        self._period = int(period)
        self._seed = int(seed)
        self._plan = plan
        given = weights.spec() if isinstance(weights, Schedule) else tuple(map(float, weights))
        self._history: tuple[tuple[int, Any], ...] = ((0, given),)
        self._earlier: tuple[tuple[str, int], ...] = ()
        self._raw_weights = self.weights if isinstance(weights, Schedule) else np.array(given)
        self._passes = SourcePasses(lengths, self._seed)
        self._blocks = (
            None
            if block_bytes is None
            else BlockPasses(sources, lengths, drawn.astype(np.int64), block_bytes, self._seed)
        )
        self._load_tables()
        self._explicit_length = num_samples is not None
        self._num_samples = self._check_length(num_samples)

    def _check_length(self, num_samples: Any) -> int:
        if num_samples is None:
            drawn = self._quotas > 0 if self._plan is None else self._plan.positive
            ends = [
                self._occurrence_position(int(k), int(self._lengths[k])) for k in drawn.nonzero()[0]
            ]
            return min([MAX_N, *(e for e in ends if e is not None)])
        elif isinstance(num_samples, (bool, np.bool_)) or not isinstance(
            num_samples, (int, np.integer)
        ):
            raise TypeError(
                f"num_samples must be an int or None, got {type(num_samples).__name__} {num_samples!r}"
            )
        elif not 0 <= num_samples <= MAX_N:
            raise ValueError(f"num_samples must be in [0, 2**62], got num_samples={num_samples}")
        return int(num_samples)

    def _load_tables(self) -> None:
        if self._plan is None:
            self._seq, self._ckpt = _period_tables(tuple(self._quotas.tolist()), self._period)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_seq", "_ckpt"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._load_tables()

    # -- parameters ----------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[Any, ...]:
        return self._sources

    @property
    def block_bytes(self) -> int | None:
        """The ``block_bytes`` the mixture was built with (its :meth:`block_bounds`), or None."""
        return None if self._blocks is None else int(self._blocks.block_bytes)

    @property
    def weights(self) -> np.ndarray:
        """Effective (quantized) weights ``quotas / period``; float64, shape (K,), summing to 1
        (with a schedule: those at position 0; :meth:`weights_at` gives any position's)."""
        return self._quotas / self._period

    @property
    def quotas(self) -> np.ndarray:
        """Draws of each source per period; int64, shape (K,), summing to :attr:`period`."""
        return self._quotas.copy()

    @property
    def period(self) -> int:
        """Length of the source-assignment cycle (divides ``RESOLUTION``)."""
        return self._period

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def seqlen(self) -> int | None:
        """Tokens per sample: the ``seqlen`` all the sources share (views of one ``seqlen``), or
        None when a source has none or two differ."""
        return common_seqlen(self._sources)

    @property
    def schedule(self) -> tuple[tuple[int, Any], ...]:
        """``((from_position, weights or Schedule.spec()), ...)``: the weights given, then every
        :meth:`with_schedule` change, in order."""
        return self._history

    def weights_at(self, position: int) -> np.ndarray:
        """The schedule's sample weights at ``position`` (its densities there, normalized;
        constant weights: :attr:`weights`); float64, shape (K,)."""
        position = check_in_range(position, "position", 0, MAX_N, closed=True)
        if self._plan is None:
            return self.weights
        return self._plan.weights_at(position)

    @property
    def fingerprint(self) -> str:
        """Hex digest of everything that decides which sample each position holds: each source's
        ``fingerprint`` (a view's: its store's and its parameters; else its type, length,
        ``seqlen`` and store fingerprint), the weights or schedule and every
        :meth:`with_schedule` change, ``seed``, ``num_samples`` and ``block_bytes``."""
        return mixture_fingerprint(self)

    @property
    def earlier_fingerprints(self) -> tuple[tuple[str, int], ...]:
        """``((fingerprint, p), ...)``: each mixture this one was changed from
        (:meth:`with_schedule`, in order) and the position before which its samples are this
        one's.  A sampler over this mixture loads the states of those taken at or before ``p``
        (:func:`~mmpack._src.sampling.sampler_state.check_config`); empty for an unchanged mixture."""
        return self._earlier

    @property
    def ordered(self) -> bool:
        """True when the weights vary with the position (a schedule, or a :meth:`with_schedule`
        change): position ``p`` belongs at step ``p``, so samplers read the mixture in its own
        order (:func:`~mmpack._src.core.sample_order.check_shuffle`).  False for constant weights."""
        return self._plan is not None

    def with_schedule(
        self, new: Schedule | Sequence[float], *, from_position: int, num_samples: int | None = None
    ) -> Mixture:
        """This mixture up to ``from_position``, then the weights of ``new`` (a schedule of
        global positions: its weights at positions ``>= from_position`` apply; a weight vector is a
        constant schedule).  Every sample before ``from_position`` is the same; the counts entering
        it carry over (each source's passes continue without repetition) and the new schedule's
        nominal integral starts from them.  ``num_samples``: default this mixture's when it was
        given, else the default rule over the new schedule.
        """
        p = check_in_range(from_position, "from_position", 0, MAX_N, closed=True)
        return changed_mixture(
            self, new if isinstance(new, Schedule) else Schedule([(0, list(new))]), p, num_samples
        )

    def __len__(self) -> int:
        return self._num_samples

    def __repr__(self) -> str:
        w = ", ".join(f"{x:.6g}" for x in self.weights)
        return f"Mixture({len(self._sources)} sources, weights=[{w}], num_samples={self._num_samples}, seed={self._seed})"

    # -- locating ------------------------------------------------------------------------------

    def _occurrence_position(self, k: int, occ: int) -> int | None:
        """Position of draw number ``occ`` of source ``k`` (a Python int, possibly beyond int64;
        None where a schedule never draws it that often)."""
        if self._plan is not None:
            return self._plan.occurrence_position(k, occ)
        cycle, target = divmod(occ, int(self._quotas[k]))
        inside = occurrence_position(
            k, target, self._quotas, self._period, STRIDE, self._seq, self._ckpt
        )
        return cycle * self._period + int(inside)

    def _items_of(self, src: np.ndarray, occ: np.ndarray) -> np.ndarray:
        """Source item numbers of draws ``occ`` of sources ``src`` (int64 arrays of shape (m,))."""
        if self._blocks is not None:
            return self._blocks.items(src, occ, self._lengths)
        return self._passes.items(src, occ)

    def source_of(self, i: int) -> tuple[int, int]:
        """``(k, j)``: sample ``i`` of the mixture is item ``j`` of source ``k`` (negative ``i``
        counts from the end; ``IndexError`` outside the mixture)."""
        i = check_index(i, self._num_samples)
        src, occ = self._locate_unchecked(np.array([i], dtype=np.int64))
        k, o = int(src[0]), int(occ[0])
        if self._blocks is not None:
            return k, int(self._blocks.items(src, occ, self._lengths)[0])
        length = int(self._lengths[k])
        return k, self._passes.permutation(k, o // length)[o % length]

    def source_of_many(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`source_of`.

        Parameters
        ----------
        idx : numpy.ndarray, integer, shape (m,)
            Positions in ``[0, len(self))`` (negative values count from the end).

        Returns
        -------
        sources, items : numpy.ndarray, int64, shape (m,)
        """
        arr = np.asarray(idx)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"idx must be an integer array, got dtype {arr.dtype}")
        arr = np.array(arr, dtype=np.int64, copy=True).reshape(-1)
        arr[arr < 0] += self._num_samples
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self._num_samples):
            bad = arr[(arr < 0) | (arr >= self._num_samples)][0]
            raise IndexError(
                f"index {int(bad)} out of range for a mixture of {self._num_samples} samples"
            )
        src, occ = self._locate_unchecked(arr)
        return src, self._items_of(src, occ)

    def attention_cost(self, indices: Any) -> np.ndarray:
        """Each sample's attention cost (int64, (k,)), its source's ``attention_cost`` of the
        item it is; ``TypeError`` for a source without one."""
        src, items = self.source_of_many(np.asarray(indices, dtype=np.int64))
        out = np.empty(src.shape[0], dtype=np.int64)
        for k in np.unique(src).tolist():
            cost = getattr(self._sources[k], "attention_cost", None)
            if not callable(cost):
                raise TypeError(
                    f"source {k} of the mixture ({type(self._sources[k]).__name__}) has no "
                    "attention_cost"
                )
            mask = src == k
            out[mask] = cost(items[mask])
        return out

    def locate(self, i: int) -> list[dict[str, int]]:
        """Where sample ``i`` comes from, in the shape of the views' ``locate``
        (:meth:`WindowDataset.locate <mmpack.WindowDataset.locate>`): its source's
        ``locate`` of the item it draws, each dict also naming ``"source"`` (the int ``k``,
        replacing any ``"source"`` the dict had).  :meth:`source_of` gives ``(source, item)``.

        Raises
        ------
        IndexError
            ``i`` outside the mixture.
        TypeError
            The source has no ``locate`` method.
        """
        k, j = self.source_of(i)
        locate = getattr(self._sources[k], "locate", None)
        if locate is None:
            raise TypeError(
                f"source {k} ({type(self._sources[k]).__name__}) has no locate(); "
                f"Mixture.source_of({i}) = {(k, j)} names its item"
            )
        return [{**piece, "source": k} for piece in locate(j)]

    def _locate_unchecked(self, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._plan is not None:
            return self._plan.locate(arr)
        src = np.empty_like(arr)
        occ = np.empty_like(arr)
        locate_many(arr, self._quotas, self._period, STRIDE, self._seq, self._ckpt, src, occ)
        return src, occ

    # -- locality ------------------------------------------------------------------------------

    def block_bounds(self, block_bytes: int) -> np.ndarray:
        """Bounds of the mixture's blocks: runs of consecutive positions that read, in each
        source, one contiguous span inside one of its ``block_bytes`` blocks (so at most one
        span per source; see :mod:`mmpack._src.sampling.mixture_blocks`).

        Returns
        -------
        numpy.ndarray, int64, shape (n_blocks + 1,)
            ``[0, ..., len(self)]``, strictly increasing; blocks of unequal sizes.

        Raises
        ------
        ValueError
            The mixture was not built with this ``block_bytes`` (its sources' items are then in
            another order, without that locality).
        """
        if self._blocks is None or block_bytes != self._blocks.block_bytes:
            built = None if self._blocks is None else self._blocks.block_bytes
            raise ValueError(
                f"block_bounds({block_bytes!r}) needs a mixture built with "
                f"Mixture(..., block_bytes={block_bytes!r}); this one has block_bytes={built!r}"
            )
        return mixture_bounds(
            self._blocks, self._lengths, self.counts(), self._positions_of, self._num_samples
        )

    def _positions_of(self, k: int, occ: np.ndarray) -> np.ndarray:
        """Mixture positions of draws ``occ`` (int64, (m,)) of source ``k`` (positive quota)."""
        if self._plan is not None:
            return self._plan.positions_of(k, occ)
        inside = np.flatnonzero(self._seq == k).astype(np.int64)  # one period's draws of k
        cycle, target = np.divmod(occ, int(self._quotas[k]))
        return cycle * self._period + inside[target]

    # -- items ---------------------------------------------------------------------------------

    @staticmethod
    def _tag(item: dict[str, Any], k: int) -> dict[str, Any]:
        out = dict(item)
        out["source"] = k
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, j = self.source_of(i)
        epoch = getattr(i, "epoch", None)
        return self._tag(self._sources[k][j if epoch is None else EpochIndex(j, epoch)], k)

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch | list[dict[str, Any]]:
        """Items of a batch of positions; each source's ``__getitems__`` is called once per batch.

        When every source answers with a :class:`~mmpack.store.SampleBatch` (mmpack's views do),
        the result is one ``SampleBatch`` whose columns are scattered from theirs, plus a
        ``source`` column: no Python work per sample.  Otherwise, a list of dicts."""
        idx = check_indices(indices, len(self))
        epochs = index_epochs(indices, None)
        src, items = self.source_of_many(idx)
        parts = read_sources(self._sources, src, items, epochs)
        if parts and all(isinstance(got, SampleBatch) for _, _, got in parts):
            return scatter_batches(parts, idx.shape[0], src)
        out: list[dict[str, Any] | None] = [None] * idx.shape[0]
        for k, where, got in parts:
            for t, item in zip(where.tolist(), got):
                out[t] = self._tag(item, k)
        return out  # type: ignore[return-value]

    # -- statistics ----------------------------------------------------------------------------

    def counts(self, n: int | None = None) -> np.ndarray:
        """Draws of each source among the first ``n`` samples (default: the whole mixture).

        Returns
        -------
        numpy.ndarray, int64, shape (K,)
        """
        if n is not None:
            n = check_in_range(n, "n", 0, MAX_N, closed=True)
        n = self._num_samples if n is None else n
        if self._plan is not None:
            return self._plan.counts(n)
        out = np.empty(self._quotas.size, dtype=np.int64)
        prefix_counts(n, self._quotas, self._period, STRIDE, self._seq, self._ckpt, out)
        return out

    def repeats(self) -> np.ndarray:
        """How many times each source starts over within the mixture (0: seen at most once).

        Returns
        -------
        numpy.ndarray, int64, shape (K,)
        """
        counts = self.counts()
        lengths = np.maximum(self._lengths, 1)
        return np.where(counts > 0, (counts - 1) // lengths, 0)

    def stats(self) -> MixtureStats:
        """Realized composition of the whole mixture.

        Returns
        -------
        MixtureStats
            ``num_samples``, ``period``, the effective and requested ``weights``, the realized
            ``counts`` and ``proportions``, the exact ``max_prefix_error`` over every prefix and
            its ``error_bound``, the ``epochs`` and ``repeats`` of each source (see
            :class:`~mmpack.sampling.MixtureStats`).
        """
        if self._plan is not None:
            worst, bound = self._plan.max_prefix_error(len(self)), self._plan.error_bound()
        else:
            worst, bound = period_error(self._quotas, self._period, self._seq, len(self))
        return MixtureStats.of(self, normalize_weights(self._raw_weights), worst, bound)
