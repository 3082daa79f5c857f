"""Balanced global batches and context-parallel collate: how even, and what they cost.

Corpus: document lengths lognormal, median 600 tokens, sigma 1.5 (heavy-tailed), packed best-fit
into rows of ``seqlen`` 8192 and 32768 (documents longer than a row split), eot after each.  A
row's cost is ``sum(s**2)`` over its segments (``PackedDataset.attention_cost``, here computed
from the plan of the lengths alone, as the view computes it).

Balance rows: ``W = 8`` ranks, ``B = 1..4`` samples each, the epoch's steps drawn by
``ResumableSampler`` (seed 0) with and without ``costs=``.  Per step, the largest rank cost is
divided by that step's optimum: exact for ``B <= 2`` (``B = 1``: any dealing; ``B = 2``: the
sorted pairing), else a lower bound, ``max(ceil(total / W), the costliest sample plus the
B - 1 cheapest others)`` (so the ratio given is an upper bound of the true one).  ``balanced`` is
the mean of that ratio over the steps, ``today`` the same for the round-robin dealing.

Overhead row: ``W = 64``, ``B = 2``, a real ``PackedDataset`` (8192-token rows of a store of the
same corpus): seconds per step of one rank's ``indices`` with ``costs=ds.attention_cost`` minus
without, median of 5 runs over 200 steps.

Collate rows: one batch of 8 rows of 8192 tokens from that view (rows of the median number of
documents), ``collate`` against
``collate(cp_size=C, cp_rank=0)`` and ``cp_rank=None`` (every rank's indices), median of 20
calls; the extra microseconds are divided by the batch's segments (documents and padding).

Run ``python -m benchmarks.bench_balance [--quick]`` (``--quick``: a smaller corpus, seconds).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import mmpack
from mmpack.torch.collate import collate
from mmpack.torch.sampler import ResumableSampler
from mmpack.views.attention_cost import row_costs
from mmpack.views.plan import build_plan

WORLD, OVERHEAD_WORLD = 8, 64


def _lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.maximum(1, rng.lognormal(np.log(600), 1.5, n)).astype(np.int64)


def _plan_costs(lens: np.ndarray, seqlen: int) -> np.ndarray:
    plan = build_plan(lens, seqlen, add_eot=True)
    return row_costs(plan.piece_len.astype(np.int64) + plan.piece_has_eot(), plan.bin_ptr, seqlen)


def _optimum(step: np.ndarray, world: int, batch: int) -> tuple[int, bool]:
    """``(optimum or lower bound, exact)`` of one step's largest rank cost."""
    c = np.sort(step)
    if batch == 1:
        return int(c[-1]), True
    if batch == 2:
        return int((c + c[::-1]).max()), True
    return max(-(-int(c.sum()) // world), int(c[-1] + c[: batch - 1].sum())), False


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
        ratios: dict[str, list[float]] = {"today": [], "balanced": []}
        exact = True
        for t in range(0, take, batch):
            step = np.concatenate([s[t : t + batch] for s in shares["today"]])
            best, exact = _optimum(costs[step], WORLD, batch)
            for name, got in shares.items():
                peak = max(int(costs[s[t : t + batch]].sum()) for s in got)
                ratios[name].append(peak / best)
        rows.append(
            {
                "case": f"balance seqlen {seqlen}, W={WORLD}, B={batch}",
                "steps": take // batch,
                "versus": "optimum" if exact else "lower bound",
                "today": float(np.mean(ratios["today"])),
                "balanced": float(np.mean(ratios["balanced"])),
                "balanced_worst": float(np.max(ratios["balanced"])),
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
    pieces = np.diff(view.plan.bin_ptr)  # a typical batch: 8 rows of the median piece count
    typical = np.flatnonzero(pieces == int(np.median(pieces)))[:8]
    samples = view.__getitems__(typical.tolist())
    segments = int(collate(samples)["cu_seqlens"].shape[0] - 1)
    base = _median(lambda: collate(samples), 20)
    for cp_size in (2, 8):
        for cp_rank in (0, None):
            t = _median(lambda: collate(samples, cp_size=cp_size, cp_rank=cp_rank), 20)
            rows.append(
                {
                    "case": f"collate cp_size={cp_size}, cp_rank={cp_rank}",
                    "segments": segments,
                    "plain_us": base * 1e6,
                    "cp_us": t * 1e6,
                    "us_per_document": (t - base) * 1e6 / segments,
                }
            )
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for seqlen in (8192, 32768):
        docs = (20_000 if quick else 400_000) * (seqlen // 8192)
        rows += _balance_rows(
            _plan_costs(_lengths(rng, docs), seqlen), seqlen, 500 if quick else 2000
        )
    with tempfile.TemporaryDirectory() as tmp:
        lens = _lengths(rng, 2_000 if quick else 20_000)
        docs = (rng.integers(0, 30_000, int(k)).astype(np.uint16) for k in lens)
        store = mmpack.build(Path(tmp) / "s.mmpack", docs, fsync=False)
        rows += _view_rows(mmpack.PackedDataset(store, seqlen=8192, eot=30_001), quick)
    return rows


def main(argv: list[str]) -> None:
    t0 = time.perf_counter()
    for r in run(quick="--quick" in argv):
        if "today" in r:
            print(f"{r['case']:<38} steps {r['steps']:>5}  max rank cost / {r['versus']:<11} "
                  f"today {r['today']:.3f}  balanced {r['balanced']:.4f} "
                  f"(worst {r['balanced_worst']:.3f})")  # fmt: skip
        elif "ms_per_step" in r:
            print(f"{r['case']:<38} steps {r['steps']:>5}  {r['ms_per_step']:.3f} ms per step")
        else:
            print(f"{r['case']:<38} {r['segments']} segments  plain {r['plain_us']:.0f} us  "
                  f"cp {r['cp_us']:.0f} us  +{r['us_per_document']:.2f} us per document")  # fmt: skip
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
