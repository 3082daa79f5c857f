"""How a :class:`~mmpack.Mixture` with a :class:`~mmpack.Schedule`
deals its positions to its sources: nested two-way splits of the schedule's integral, located
by arithmetic.

Targets.  On the schedule's axis ``x`` (positions, or tokens consumed) each source has a density
``f_k(x)``, linear between two points (its normalized weight, or for ``unit="tokens"`` its token
weight over its tokens per sample); its *target* ``F_k(x)`` is the integral of ``f_k`` from the
schedule's origin (starting at its count there), and position ``p`` lies where the targets sum
to ``p``.  Algorithm: the sources are the leaves of a binary tree; the root's count at ``p`` is
``p``, and a node ``G`` of count ``m`` gives its child ``A`` the count ``round(F_A(F_G^{-1}(m)))``,
which grows by 0 or 1 with ``m``, so position ``p`` goes to the leaf reached through the children
whose count grows between ``p`` and ``p + 1``.  The rounding is done on the child of smaller
density with floating-point formulas monotone in ``m`` (:mod:`mmpack._src.kernels.schedule`), the
switches between stretches checked at construction, so the counts are exactly consistent.

Prefix bound: every prefix holds ``|count_k(p) - F_k(p)|`` within ``1/2 (1 + sum over the
ancestors A of k below the root of max f_k / f_A)`` (:func:`_tree_bound`, up to positions of
about ``2**50``).  The plan takes the tree of least bound among Huffman's and
:data:`TREE_CANDIDATES` balanced ones: 1/2 for two sources, at most 1 for three or four, 1.5 for
five to eight (:meth:`SchedulePlan.error_bound`; tests/sampling/test_schedule.py checks every prefix).

Cost: memory O(segments * K); construction O(segments * K * depth) per tree tried; a lookup one
descent of ``ceil(log2 K)`` levels (``python -m benchmarks.bench_schedule``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.core.permutation_keys import MAX_N
from mmpack._src.kernels.mixture import locate_many, occurrence_position, prefix_counts
from mmpack._src.kernels.schedule import (
    ROW,
    row_count,
    split_counts,
    split_locate,
    split_positions,
)
from mmpack._src.sampling.weights import STRIDE, chairman_table

__all__ = [
    "ChairmanPrefix",
    "Regime",
    "SchedulePlan",
    "build_regime",
]


@dataclass(frozen=True)
class Regime:
    """A schedule from a position on, on its axis ``x``.

    ``start``: the first position; ``x0``: its ``x``; ``counts`` (int64, (K,)): the counts
    entering it; ``xs`` (float64, (n,)) stretch starts (``xs[0] == x0``, the last stretch has no
    end); ``dens`` / ``slopes`` (float64, (n, K)): each source's density at each start and its
    change per unit of ``x``."""

    start: int
    x0: float
    counts: np.ndarray
    xs: np.ndarray
    dens: np.ndarray
    slopes: np.ndarray


@dataclass(frozen=True)
class ChairmanPrefix:
    """Positions ``[0, stop)`` of a mixture of constant weights (its chairman sequence) before
    its first schedule change."""

    quotas: np.ndarray
    period: int
    stop: int


def build_regime(
    schedule: Any, start: int, x0: int, counts: np.ndarray, tokens_per_sample: np.ndarray | None
) -> Regime:
    """The regime of ``schedule`` from position ``start`` (at ``x0`` on its axis), entered with
    ``counts``; ``tokens_per_sample`` for a ``unit="tokens"`` schedule."""
    starts, weights, slopes = schedule.segments(x0)
    if tokens_per_sample is not None:
        per = tokens_per_sample[None, :].astype(np.float64)
        weights, slopes = weights / per, slopes / per
    return Regime(
        int(start), float(x0), counts.astype(np.int64), np.array(starts, np.float64),
        weights, slopes,
    )  # fmt: skip


# ----------------------------------------------------------------------------- the tree
Tree = list[tuple[list[int], list[int]]]
"""Internal nodes ``(left leaves, right leaves)``, parents first (the root first)."""

TREE_CANDIDATES = 64
"""Trees tried per schedule: Huffman's and balanced trees over keyed orders of the sources."""


def _huffman(share: np.ndarray) -> Tree:
    """Huffman's tree on ``share`` (float64, (K,)): heavy sources near the root."""
    heap = [(float(s), k, [k]) for k, s in enumerate(share.tolist())]
    heapq.heapify(heap)
    merged: Tree = []
    tick = len(heap)
    while len(heap) > 1:
        sa, _, a = heapq.heappop(heap)
        sb, _, b = heapq.heappop(heap)
        merged.append((b, a))
        heapq.heappush(heap, (sa + sb, tick, a + b))
        tick += 1
    return merged[::-1]


def _balanced(order: list[int]) -> Tree:
    """The balanced tree over ``order`` (halves, recursively), parents first."""
    if len(order) < 2:
        return []
    half = (len(order) + 1) // 2
    return [(order[:half], order[half:]), *_balanced(order[:half]), *_balanced(order[half:])]


def _ends(regime: Regime) -> np.ndarray:
    """Each source's density at both ends of every stretch; float64, (2n - 1, K)."""
    tail = regime.dens[:-1] + regime.slopes[:-1] * np.diff(regime.xs)[:, None]
    return np.maximum(np.vstack([regime.dens, tail]), 0.0)


def _tree_bound(ends: np.ndarray, tree: Tree) -> float:
    """The prefix bound of the module docstring for ``tree``: ``1/2 (1 + sum over the non-root
    ancestors A of a source k of max f_k / f_A)``, worst source; densities at the stretch ends
    ``ends`` (a ratio of two linear densities is monotone on a stretch, so its largest value is
    at an end; 1 where the ancestor has no density)."""
    worst = 0.0
    for k in range(ends.shape[1]):
        total = 1.0
        for left, right in tree[1:]:
            if k in left or k in right:
                den = ends[:, left + right].sum(axis=1)
                ratio = np.where(den > 0, ends[:, k] / np.where(den > 0, den, 1.0), 1.0)
                total += float(ratio.max())
        worst = max(worst, 0.5 * total)
    return worst


def _choose_tree(regime: Regime) -> Tree:
    """The tree of least :func:`_tree_bound` among Huffman's (on each source's largest and mean
    share) and balanced trees over :data:`TREE_CANDIDATES` keyed orders (a pure function of
    the regime)."""
    ends = _ends(regime)
    total = ends.sum(axis=1, keepdims=True)
    share = ends / np.where(total > 0, total, 1.0)
    k_src = ends.shape[1]
    candidates = [_huffman(share.max(axis=0)), _huffman(share.mean(axis=0))]
    rng = np.random.default_rng(0)
    candidates.append(_balanced(list(range(k_src))))
    for _ in range(TREE_CANDIDATES if k_src > 2 else 0):
        candidates.append(_balanced(rng.permutation(k_src).tolist()))
    bounds = [_tree_bound(ends, t) for t in candidates]
    return candidates[int(np.argmin(bounds))]


Sums = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(F, f, s)`` of :func:`_integrals`."""


def _integrals(regime: Regime, members: list[int]) -> Sums:
    """``(F, f, s)`` of a set of sources at each stretch start: target, density, slope."""
    f = regime.dens[:, members].sum(axis=1)
    s = regime.slopes[:, members].sum(axis=1)
    big_f = np.empty_like(f)
    big_f[0] = float(regime.counts[members].sum())
    lengths = np.diff(regime.xs)
    for j in range(lengths.size):
        big_f[j + 1] = big_f[j] + lengths[j] * (f[j] + 0.5 * s[j] * lengths[j])
    return big_f, f, s


def _at(sums: Sums, j: int, u: float) -> tuple[float, float]:
    """Integral and density of ``sums`` at ``u`` into stretch ``j``."""
    big, den, sl = sums
    value = float(big[j] + u * (den[j] + 0.5 * sl[j] * u))
    return value, max(float(den[j] + sl[j] * u), 0.0)


def _cuts(d0: float, ds: float, length: float) -> list[float]:
    """``[0, (crossing,) length]``: a stretch cut where the children's densities cross."""
    if ds != 0 and 0 < -d0 / ds < length:
        return [0.0, -d0 / ds, length]
    return [0.0, length]


def _node_rows(regime: Regime, left: list[int], right: list[int]) -> list[list[float]]:
    """The rows of a node (module docstring of :mod:`mmpack._src.kernels.schedule`)."""
    node = _integrals(regime, left + right)
    sides = (_integrals(regime, left), _integrals(regime, right))
    ends = [*np.diff(regime.xs).tolist(), math.inf]
    rows = []
    for j, length in enumerate(ends):
        d0 = float(sides[0][1][j] - sides[1][1][j])
        ds = float(sides[0][2][j] - sides[1][2][j])
        cuts = _cuts(d0, ds, length)
        for u0, u1 in zip(cuts[:-1], cuts[1:]):
            mid = u0 + 0.5 if math.isinf(u1) else (u0 + u1) / 2
            side = 0 if d0 + ds * mid <= 0 else 1  # the child of smaller density is computed
            child = sides[side]
            g0_int, g0 = _at(node, j, u0)
            a0_int, a0 = _at(child, j, u0)
            a1_int, a1 = (math.inf, 0.0) if math.isinf(u1) else _at(child, j, u1)
            rows.append(
                [float(side), u1 - u0, g0_int, g0, float(node[2][j]), a0_int, a0,
                 float(child[2][j]), a1_int, a1]
            )  # fmt: skip
    return rows


def _check_switches(rows: np.ndarray, levels: np.ndarray) -> None:
    """Raise each row's first level until every switch between rows adds 0 or 1 to the left
    child (a switch can only be off by a rounding of the two closed forms)."""
    for r in range(1, levels.size):
        while True:
            m = int(levels[r])
            before = _row(levels, m - 1)
            after = _row(levels, m)
            if before == after:
                break
            step = row_count(rows, after, m) - row_count(rows, before, m - 1)
            if step in (0, 1):
                break
            levels[r:] = np.maximum(levels[r:], m + 1)


def _row(levels: np.ndarray, m: int) -> int:
    return int(np.searchsorted(levels, m, side="right")) - 1


class SchedulePlan:
    """The regimes of a scheduled mixture and lookups in them.

    Parameters
    ----------
    regimes : list of Regime
        Starts strictly increasing; the first at 0 unless ``prefix`` is given, then at its stop.
    prefix : ChairmanPrefix, optional
        Positions before the first regime drawn by constant weights.
    """

    def __init__(self, regimes: list[Regime], prefix: ChairmanPrefix | None = None) -> None:
        self.regimes = regimes
        self.prefix = prefix
        self._build()

    def __getstate__(self) -> dict[str, Any]:
        return {"regimes": self.regimes, "prefix": self.prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._build()

    def _build(self) -> None:
        k_src = self.regimes[0].dens.shape[1]
        nodes: list[list[int]] = []
        rows: list[list[float]] = []
        levels: list[np.ndarray] = []
        heads = []
        self._trees: list[Tree] = []
        self._cum: list[np.ndarray] = []
        for regime in self.regimes:
            self._cum.append(np.stack([_integrals(regime, [k])[0] for k in range(k_src)], axis=1))
            tree = _choose_tree(regime)
            self._trees.append(tree)
            base = len(nodes)
            heads.append([regime.start, base])
            index = {tuple(sorted(a + b)): base + i for i, (a, b) in enumerate(tree)}
            for left, right in tree:
                kids = [index.get(tuple(sorted(c)), -c[0] - 1) if len(c) > 1 else -c[0] - 1
                        for c in (left, right)]  # fmt: skip
                own = np.array(_node_rows(regime, left, right), np.float64)
                lv = np.ceil(own[:, 2]).astype(np.int64)
                lv = np.maximum.accumulate(lv)
                _check_switches(own, lv)
                nodes.append([*kids, len(rows), own.shape[0]])
                rows.extend(own.tolist())
                levels.append(lv)
        self.heads = np.array(heads, np.int64)
        self.nodes = np.array(nodes, np.int64)
        self.rows = np.array(rows, np.float64).reshape(-1, ROW)
        self.levels = np.concatenate(levels)
        if self.prefix is not None:
            c = self.prefix.quotas
            self._seq, self._ckpt = chairman_table(tuple(c.tolist()), self.prefix.period)
        self._check_entry()

    def _check_entry(self) -> None:
        """Each regime starts exactly at its entering counts (a guard on the closed forms)."""
        for regime in self.regimes:
            got = self.counts(regime.start)
            if not np.array_equal(got, regime.counts):
                raise AssertionError(f"regime at {regime.start}: counts {got} != {regime.counts}")

    def _scratch(self, width: int = 0) -> np.ndarray:
        """Scratch space of the kernels, one per call (plans are shared between threads)."""
        shape = (self.nodes.shape[0], width) if width else (self.nodes.shape[0],)
        return np.empty(shape, np.int64)

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.heads, self.nodes, self.levels, self.rows

    @property
    def split_start(self) -> int:
        return int(self.heads[0, 0])

    @property
    def positive(self) -> np.ndarray:
        """Sources drawn with positive density somewhere; bool, shape (K,)."""
        out = np.zeros(self.regimes[0].dens.shape[1], bool)
        for e in self.regimes:
            out |= (e.dens > 0).any(axis=0)
        if self.prefix is not None:
            out |= self.prefix.quotas > 0
        return out

    def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source and occurrence of positions ``idx`` (int64, (m,), ``>= 0``)."""
        src = np.empty_like(idx)
        occ = np.empty_like(idx)
        early = idx < self.split_start
        if early.any():
            p = self.prefix
            assert p is not None
            s, o = np.empty_like(idx[early]), np.empty_like(idx[early])
            locate_many(idx[early], p.quotas, p.period, STRIDE, self._seq, self._ckpt, s, o)
            src[early], occ[early] = s, o
            late = ~early
            s, o = np.empty_like(idx[late]), np.empty_like(idx[late])
            split_locate(idx[late], *self._tables(), self._scratch(3), s, o)
            src[late], occ[late] = s, o
            return src, occ
        split_locate(idx, *self._tables(), self._scratch(3), src, occ)
        return src, occ

    def counts(self, n: int) -> np.ndarray:
        """Draws of each source among positions ``[0, n)``; int64, (K,)."""
        out = np.empty(self.regimes[0].dens.shape[1], np.int64)
        if n < self.split_start:
            p = self.prefix
            assert p is not None
            prefix_counts(n, p.quotas, p.period, STRIDE, self._seq, self._ckpt, out)
        else:
            split_counts(n, *self._tables(), self._scratch(), out)
        return out

    def positions_of(self, k: int, occ: np.ndarray) -> np.ndarray:
        """Positions of draws ``occ`` (int64, (m,)) of source ``k``; -1 for a draw that never
        comes (before position ``2**62``)."""
        out = np.empty_like(occ)
        start = self.split_start
        early = np.zeros(occ.shape, bool)
        if self.prefix is not None:
            entering = int(self.regimes[0].counts[k])
            early = occ < entering
            p = self.prefix
            for t in np.flatnonzero(early).tolist():
                cycle, target = divmod(int(occ[t]), int(p.quotas[k]))
                inside = occurrence_position(
                    k, target, p.quotas, p.period, STRIDE, self._seq, self._ckpt
                )
                out[t] = cycle * p.period + int(inside)
        late = np.flatnonzero(~early)
        got = np.empty(late.size, np.int64)
        counts = np.empty(self.regimes[0].dens.shape[1], np.int64)
        split_positions(k, occ[late], start, MAX_N, *self._tables(), self._scratch(), counts, got)
        out[late] = got
        return out

    def occurrence_position(self, k: int, occ: int) -> int | None:
        """Position of draw number ``occ`` of source ``k`` (None: never drawn that often)."""
        got = int(self.positions_of(k, np.array([occ], np.int64))[0])
        return None if got < 0 else got

    def weights_at(self, position: int) -> np.ndarray:
        """The schedule's sample weights at ``position`` (normalized densities); float64, (K,)."""
        if position < self.split_start:
            assert self.prefix is not None
            return self.prefix.quotas / self.prefix.period
        e = int(np.searchsorted(self.heads[:, 0], position, side="right")) - 1
        regime = self.regimes[e]
        j, x = self._x_of(e, position)
        dens = np.maximum(regime.dens[j] + regime.slopes[j] * (x - regime.xs[j]), 0.0)
        return dens / dens.sum()

    def _x_of(self, e: int, position: int) -> tuple[int, float]:
        """``(stretch, x)``: where regime ``e``'s total target reaches ``position``."""
        regime = self.regimes[e]
        big = self._cum[e].sum(axis=1)
        f, s = regime.dens.sum(axis=1), regime.slopes.sum(axis=1)
        j = max(int(np.searchsorted(big, position, side="right")) - 1, 0)
        z = position - big[j]
        if s[j] == 0:
            return j, float(regime.xs[j] + (z / f[j] if f[j] > 0 else 0.0))
        root = math.sqrt(max(f[j] * f[j] + 2 * s[j] * z, 0.0))
        return j, float(regime.xs[j] + 2 * z / (f[j] + root))

    def targets(self, position: int) -> np.ndarray:
        """Each source's target (the schedule's integral) at ``position``; float64, (K,)."""
        e = int(np.searchsorted(self.heads[:, 0], position, side="right")) - 1
        regime = self.regimes[e]
        j, x = self._x_of(e, position)
        u = x - regime.xs[j]
        return self._cum[e][j] + u * (regime.dens[j] + 0.5 * regime.slopes[j] * u)

    def error_bound(self) -> float:
        """The prefix bound of the module docstring for this plan (worst regime), in samples,
        with a margin of ``1e-6`` for the floating-point arithmetic."""
        bounds = [_tree_bound(_ends(e), t) for e, t in zip(self.regimes, self._trees)]
        return max(bounds) + 1e-6

    def max_prefix_error(self, n: int, limit: int = 4096) -> float:
        """Largest ``|count_k(p) - target_k(p)|`` over the positions ``p <= n`` among the first
        ``limit`` of each regime (float64 targets)."""
        worst = 0.0
        ends = [*self.heads[1:, 0].tolist(), n]
        for e, regime in enumerate(self.regimes):
            lo, hi = regime.start, min(ends[e], n, regime.start + limit)
            if hi < lo:
                break
            pos = np.arange(lo, hi + 1, dtype=np.int64)
            src, _ = self.locate(pos[:-1])
            got = np.zeros((pos.size, regime.dens.shape[1]), np.int64)
            got[0] = self.counts(lo)
            got[np.arange(1, pos.size), src] = 1
            got = np.cumsum(got, axis=0)
            want = np.stack([self.targets(int(p)) for p in pos.tolist()])
            worst = max(worst, float(np.abs(got - want).max()))
        return worst

    def truncated(self, p: int) -> list[Regime]:
        """The regimes that start before ``p``."""
        return self.regimes[: int(np.searchsorted(self.heads[:, 0], p, side="left"))]
