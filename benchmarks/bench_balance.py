"""Balanced global batches and context-parallel collate: how even, and what they cost.

Corpus: document lengths lognormal, median 600 tokens, sigma 1.5 (heavy-tailed), packed best-fit
into rows of ``seqlen`` 8192 and 32768 (documents longer than a row split), eot after each.  A
row's cost is ``sum(s**2)`` over its segments (``PackedDataset.attention_cost``, here computed
from the plan of the lengths alone, as the view computes it).

Balance rows: ``W = 8`` ranks, ``B = 1..4`` samples each, the epoch's first steps drawn by
``ResumableSampler`` (seed 0) with and without ``costs=``.  Per step, the largest rank cost is
divided by that step's optimum, found exactly by :func:`optimal_largest_load` (branch and bound
from the dealing found, capped at ``NODE_CAP`` nodes a step).  ``balanced`` is the mean of that
ratio over the steps whose optimum the search proved, ``bound`` the same mean over every step
with the unproven ones divided by a lower bound of their optimum instead (so the true mean lies
at or below it), ``today`` the round-robin dealing's ratio.

Overhead row: ``W = 64``, ``B = 2``, a real ``PackedDataset`` (8192-token rows of a store of the
same corpus, big enough for 200 steps; ``--quick``: fewer): seconds per step of one rank's
``indices`` with ``costs=ds.attention_cost`` minus without, median of 5 runs.

Collate rows: 8 rows of 8192 tokens drawn at random from that view (the corpus's own mix of
documents per row), int64 and int32 tokens, ``collate`` against ``collate(cp_size=C,
cp_rank=0)`` and ``cp_rank=None`` (every rank's indices), the least time of 2,000 calls each,
the two run in alternating blocks of 20 (``bench_window.side_by_side``: the machine's other
load only adds, and both see the same machine); the extra microseconds are divided by the batch's segments (document pieces and
row padding).

Run ``python -m benchmarks.bench_balance [--quick] [--cp-only]`` (``--quick``: a smaller
corpus, seconds; ``--cp-only``: the collate rows alone, over the smaller store of
``--quick``, so its rows hold other documents than a full run's).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch

import mmpack
from benchmarks.bench_window import side_by_side
from mmpack import ResumableSampler
from mmpack.packing import build_plan, row_costs
from mmpack.torch import collate

WORLD, OVERHEAD_WORLD = 8, 64
NODE_CAP = 2_000_000


def _lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.maximum(1, rng.lognormal(np.log(600), 1.5, n)).astype(np.int64)


def _plan_costs(lens: np.ndarray, seqlen: int) -> np.ndarray:
    plan = build_plan(lens, seqlen, add_eot=True)
    return row_costs(plan.piece_len.astype(np.int64) + plan.piece_has_eot(), plan.bin_ptr, seqlen)


def optimal_largest_load(
    costs: Any, world: int, upper: int, node_cap: int = NODE_CAP
) -> tuple[int, int, bool]:
    """``(optimum, lower, proven)``: the smallest largest rank cost over every dealing of
    ``costs`` (``m * world`` integers) to ``world`` ranks of ``m`` samples each, found by branch
    and bound below the achievable ``upper``; ``lower`` a bound of it from the costs alone;
    ``proven`` False when the search stopped at ``node_cap`` nodes (the value is then the best
    dealing found, at or above the optimum)."""
    c = np.sort(np.asarray(costs, dtype=np.int64))[::-1].copy()
    n = c.shape[0]
    m = n // world
    suffix = np.zeros(n + 1, dtype=np.int64)
    suffix[:-1] = np.cumsum(c[::-1])[::-1]
    lower = -(-int(suffix[0]) // world)
    for j in range(1, m + 1):  # some rank holds j of the world * (j - 1) + 1 costliest
        top = int(c[world * (j - 1) + 1 - j : world * (j - 1) + 1].sum())
        lower = max(lower, top + (int(suffix[n - (m - j)]) if m > j else 0))
    best, proven = _search(c, suffix, world, m, int(upper), lower, node_cap)
    return int(best), lower, bool(proven)


@numba.njit(cache=True)
def _search(c, suffix, world, m, best, lower, node_cap):  # type: ignore[no-untyped-def]
    """Depth-first: costs in decreasing order, each to a rank with room (one of each set of
    ranks of equal load and count), pruned where a rank would reach ``best`` even with its
    remaining places taken by the cheapest costs, or the ranks' room below ``best`` cannot take
    the rest; every dealing found lowers ``best``; stops at ``lower``."""
    n = c.shape[0]
    if best <= lower or n == 0:
        return best, True
    load = np.zeros(world, dtype=np.int64)
    held = np.zeros(world, dtype=np.int64)
    choice = np.full(n + 1, -1, dtype=np.int64)
    i = 0
    nodes = 0
    while True:
        if i == n:
            best = load.max()
            if best <= lower:
                return best, True
            i -= 1
            load[choice[i]] -= c[i]
            held[choice[i]] -= 1
        limit = best - 1
        found = -1
        room = suffix[i]
        if choice[i] == -1:
            room = 0
            for r in range(world):
                if held[r] < m:
                    room += limit - load[r]
        if room >= suffix[i]:
            for r in range(choice[i] + 1, world):
                if held[r] == m:
                    continue
                dup = False
                for q in range(r):
                    if held[q] == held[r] and load[q] == load[r]:
                        dup = True
                        break
                k = m - held[r] - 1
                if dup or load[r] + c[i] + (suffix[n - k] if k > 0 else 0) > limit:
                    continue
                found = r
                break
        if found < 0:
            choice[i] = -1
            if i == 0:
                return best, True
            i -= 1
            load[choice[i]] -= c[i]
            held[choice[i]] -= 1
            continue
        choice[i] = found
        load[found] += c[i]
        held[found] += 1
        nodes += 1
        if nodes > node_cap:
            return best, False
        i += 1
        choice[i] = -1


def _balance_rows(costs: np.ndarray, seqlen: int, steps: int) -> list[dict[str, Any]]:
    n = costs.shape[0]
    rows = []
    for batch in (1, 2, 3, 4):
        table = costs

        def lookup(idx: np.ndarray) -> np.ndarray:
            return table[idx]

        take = min(steps, n // (WORLD * batch)) * batch
        shares = {}
        for name, kw in (("today", {}), ("balanced", {"costs": lookup, "batch_size": batch})):
            shares[name] = [
                ResumableSampler(n, rank=r, world_size=WORLD, **kw).indices(0, take)
                for r in range(WORLD)
            ]
        ratios: dict[str, list[float]] = {"today": [], "balanced": [], "bound": []}
        proven = 0
        for t in range(0, take, batch):
            peaks = {
                name: max(int(costs[s[t : t + batch]].sum()) for s in got)
                for name, got in shares.items()
            }
            step = np.concatenate([s[t : t + batch] for s in shares["today"]])
            best, lower, exact = optimal_largest_load(costs[step], WORLD, peaks["balanced"])
            proven += exact
            ratios["bound"].append(peaks["balanced"] / (best if exact else lower))
            if exact:
                ratios["today"].append(peaks["today"] / best)
                ratios["balanced"].append(peaks["balanced"] / best)
        rows.append(
            {
                "case": f"balance seqlen {seqlen}, W={WORLD}, B={batch}",
                "steps": take // batch,
                "proven": proven,
                "today": float(np.mean(ratios["today"])),
                "balanced": float(np.mean(ratios["balanced"])),
                "balanced_worst": float(np.max(ratios["balanced"])),
                "bound": float(np.mean(ratios["bound"])),
            }
        )
    return rows


def _median(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _collate_rows(view: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    pick = np.random.default_rng(1).choice(len(view), 8, replace=False)
    samples = view.__getitems__(np.sort(pick).tolist())
    segments = int(collate(samples)["cu_seqlens"].shape[0] - 1)
    for dtype in (torch.int64, torch.int32):
        for cp_size in (2, 8):
            for cp_rank in (0, None):
                calls = range(2000)  # 100 rounds alternating blocks of 20 calls
                seconds = side_by_side(
                    {
                        "plain": (lambda _: collate(samples, dtype=dtype), calls),
                        "cp": (
                            lambda _: collate(
                                samples, dtype=dtype, cp_size=cp_size, cp_rank=cp_rank
                            ),
                            calls,
                        ),
                    },
                    rounds=100,
                )
                base, t = float(seconds["plain"].min()), float(seconds["cp"].min())
                rows.append(
                    {
                        "case": f"collate {str(dtype)[6:]} cp_size={cp_size}, cp_rank={cp_rank}",
                        "segments": segments,
                        "plain_us": base * 1e6,
                        "cp_us": t * 1e6,
                        "us_per_document": (t - base) * 1e6 / segments,
                    }
                )
    return rows


def _view_rows(view: Any, quick: bool) -> list[dict[str, Any]]:
    batch, steps = 2, 50 if quick else 200
    n = len(view)
    plain = ResumableSampler(n, rank=3, world_size=OVERHEAD_WORLD)
    balanced = ResumableSampler(
        n, rank=3, world_size=OVERHEAD_WORLD, costs=view.attention_cost, batch_size=batch
    )
    take = min(steps * batch, len(plain))
    t_plain = _median(lambda: plain.indices(0, take), 5)
    t_bal = _median(lambda: balanced.indices(0, take), 5)
    rows: list[dict[str, Any]] = [
        {
            "case": f"balance overhead, W={OVERHEAD_WORLD}, B={batch}, seqlen {view.seqlen}",
            "steps": take // batch,
            "ms_per_step": (t_bal - t_plain) / (take / batch) * 1e3,
        }
    ]
    return rows + _collate_rows(view)


def run(quick: bool = False, cp_only: bool = False) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for seqlen in () if cp_only else (8192, 32768):
        docs = (20_000 if quick else 100_000) * (seqlen // 8192)
        rows += _balance_rows(
            _plan_costs(_lengths(rng, docs), seqlen), seqlen, 50 if quick else 200
        )
    with tempfile.TemporaryDirectory() as tmp:
        lens = _lengths(rng, 5_000 if quick or cp_only else 125_000)  # 125,000: 200 steps
        pool = rng.integers(0, 30_000, int(lens.max())).astype(np.uint16)
        store = mmpack.build(Path(tmp) / "s.mmpack", (pool[:k] for k in lens), fsync=False)
        view = mmpack.PackedDataset(store, seqlen=8192, eot=30_001)
        rows += _collate_rows(view) if cp_only else _view_rows(view, quick)
    return rows


def main(argv: list[str]) -> None:
    t0 = time.perf_counter()
    for r in run(quick="--quick" in argv, cp_only="--cp-only" in argv):
        if "today" in r:
            print(f"{r['case']:<38} steps {r['steps']:>4} (optimum proven {r['proven']:>4})  "
                  f"max rank cost / optimum: today {r['today']:.3f}  balanced "
                  f"{r['balanced']:.4f} (worst {r['balanced_worst']:.3f}, all steps <= "
                  f"{r['bound']:.4f})")  # fmt: skip
        elif "ms_per_step" in r:
            print(f"{r['case']:<38} steps {r['steps']:>5}  {r['ms_per_step']:.3f} ms per step")
        else:
            print(f"{r['case']:<38} {r['segments']} segments  plain {r['plain_us']:.0f} us  "
                  f"cp {r['cp_us']:.0f} us  +{r['us_per_document']:.2f} us per document")  # fmt: skip
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
