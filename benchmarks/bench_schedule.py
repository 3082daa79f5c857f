"""Mixture schedules: index rate of a 100-segment schedule against constant weights.

Four sources of 10**8 samples, a mixture of 10**9 samples; the constant mixture has the weights
of the schedule's first segment.  Schedules: 100 constant segments of 10**7 positions with random
weights, and 100 linear points (each drawn by its closed form, no per-piece tables).  Each timed call is
``source_of_many`` on 8192 positions, either *consecutive* (a run starting at a random offset, as a
sequential or block order reads) or *random*; a call of the constant mixture and one of the
schedule alternate, so both see the same machine, and each row gives both medians and their ratio
(schedule / constant; 1 is equal speed).  Construction time of each schedule is reported too.

Prefix error above eight sources (the bound of :mod:`mmpack._src.sampling.schedule_plan` is 1.5 samples
up to eight): the worst ``|count_k(p) - F_k(p)|`` over every prefix and source against the
schedule's integral (``Mixture.stats().max_prefix_error``), and the plan's own bound, over keyed
random schedules of two kinds: *one-hot stages* (a Dirichlet(1) warm-up of 3-40 positions, then each
source in a keyed order holds all the weight for 20 positions while the others stand still) and
*linear* (two Dirichlet(0.2) points 2000 positions apart, held 500 more).

Run ``python -m benchmarks.bench_schedule [--quick]`` (``--quick`` takes a few seconds).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from mmpack import Mixture, Schedule

CHUNK = 8192
N = 10**9


class _Source:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": np.zeros(1, np.int64)}


def _schedule(rng: np.random.Generator, interpolate: str) -> Schedule:
    points = [(s * N // 100, rng.dirichlet(np.ones(4)).tolist()) for s in range(100)]
    return Schedule(points, interpolate=interpolate)


def _side_by_side(a: Mixture, b: Mixture, batches: list[np.ndarray]) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, calls alternating."""
    ta, tb = [], []
    for idx in [batches[0], *batches]:  # the first pair warms up
        t0 = time.perf_counter()
        a.source_of_many(idx)
        t1 = time.perf_counter()
        b.source_of_many(idx)
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return float(np.median(ta[1:])), float(np.median(tb[1:]))


def _worst_prefix_error(schedule: Schedule, n: int) -> tuple[float, float]:
    """The worst prefix error of a mixture of ``schedule`` over ``n`` positions against the
    schedule's integral, and the plan's bound (:class:`~mmpack.sampling.MixtureStats`;
    tests/sampling/test_schedule.py checks the integral it uses against an exact one)."""
    mixture = Mixture([_Source(10**6) for _ in range(schedule.num_sources)], schedule,
                      num_samples=n, seed=1)  # fmt: skip
    stats = mixture.stats()
    return float(stats.max_prefix_error), float(stats.error_bound)


def _prefix_rows(rng: np.random.Generator, trials: int) -> list[dict[str, Any]]:
    rows = []
    for kind, sizes in (("one-hot stages", (9, 12, 16)), ("linear", (12, 16, 32))):
        for k in sizes:
            worst, bound = 0.0, 0.0
            for _ in range(trials):
                if kind == "linear":
                    points = [(0, rng.dirichlet(np.full(k, 0.2)).tolist()),
                              (2000, rng.dirichlet(np.full(k, 0.2)).tolist())]  # fmt: skip
                    schedule, n = Schedule(points, interpolate="linear"), 2500
                else:
                    points, start = (
                        [(0, rng.dirichlet(np.ones(k)).tolist())],
                        int(rng.integers(3, 40)),
                    )
                    for j in rng.permutation(k).tolist():
                        points.append((start, np.eye(k)[j].tolist()))
                        start += 20
                    schedule, n = Schedule(points, interpolate="constant"), start
                w, b = _worst_prefix_error(schedule, n)
                worst, bound = max(worst, w), max(bound, b)
            rows.append({"case": f"prefix error, {kind}, {k} sources", "worst": worst,
                         "bound": bound, "trials": trials})  # fmt: skip
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    calls = 30 if quick else 300
    sources = [_Source(10**8) for _ in range(4)]
    rows = []
    for interpolate in ("constant", "linear"):
        schedule = _schedule(rng, interpolate)
        t0 = time.perf_counter()
        scheduled = Mixture(sources, schedule, num_samples=N)
        build = time.perf_counter() - t0
        constant = Mixture(sources, schedule.weights_at(0).tolist(), num_samples=N)
        for kind in ("consecutive", "random"):
            if kind == "random":
                batches = [rng.integers(0, N, CHUNK) for _ in range(calls)]
            else:
                batches = [int(s) + np.arange(CHUNK) for s in rng.integers(0, N - CHUNK, calls)]
            tc, ts = _side_by_side(constant, scheduled, batches)
            rows.append(
                {
                    "case": f"100 {interpolate} segments, {kind} positions",
                    "rows": int(scheduled._plan.rows.shape[0]),
                    "build_s": build,
                    "constant_idx_per_s": CHUNK / tc,
                    "schedule_idx_per_s": CHUNK / ts,
                    "ratio": tc / ts,
                    "calls": calls,
                }
            )
    return rows + _prefix_rows(rng, 4 if quick else 60)


def main(argv: list[str]) -> None:
    t0 = time.perf_counter()
    rows = run(quick="--quick" in argv)
    for r in rows:
        if "worst" in r:
            print(f"{r['case']:<46} worst {r['worst']:.3f}  plan bound {r['bound']:.3f}  "
                  f"({r['trials']} schedules)")  # fmt: skip
            continue
        print(
            f"{r['case']:<46} rows {r['rows']:>5}  build {r['build_s']:.2f} s  constant "
            f"{r['constant_idx_per_s']:>12,.0f}/s  schedule {r['schedule_idx_per_s']:>12,.0f}/s  "
            f"ratio {r['ratio']:.3f}"
        )
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
