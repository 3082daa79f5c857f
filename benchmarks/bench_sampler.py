"""ResumableSampler, Permutation and Mixture: throughput, memory, resume cost, lookup cost vs length.

Every figure is measured after a warm-up call (kernels compiled, caches filled), over many timed
calls; each row reports the median and the 99th percentile of the per-call time, converted to a
rate where that reads better (``p99`` is then the rate at the slow tail, so it is the lower one).

* ``sampler.indices``: vectorised positions -> indices, 8192 per call, at n = 10**6 and 10**11;
* ``sampler iter``: the Python iterator a DataLoader pulls from, timed per 8192 ``next`` calls;
* ``permutation.map``: the raw keyed permutation, 8192 indices per call;
* ``blocks``: the same two sampler figures in the block-window order (``shuffle="blocks"``,
  256 blocks a window) for blocks of 1000 samples at n = 10**6 and 10**11 and of 8 samples at
  n = 10**6 (a chunk of 8192 positions then spans 4 windows), and the first lookup of an epoch,
  which builds its window offsets (one pass over the block ids), for 10**5 and 10**6 blocks;
* ``memory``: tracemalloc peak while building a sampler over 10**11 and drawing 100 000 indices;
* ``resume``: ``load_state_dict`` + first index at position 0 and at n/2 (n = 10**11): equal
  times, as nothing is replayed;
* ``mixture``: ``source_of_many`` (8192 random positions per call) and scalar ``source_of`` on a
  3-source mixture of 10**6 and of 10**9 samples: the same cost, as lookups do not depend on length;
  then sources so small that a batch spans thousands of passes (one permutation per pass touched).

* ``skips``: ``indices`` and ``iter`` with 100 skipped ranges of 1000 positions in the epoch
  against none (n = 10**6), side by side, and the ratio of the rates.

Run ``python -m benchmarks.bench_sampler [--quick] [--skips]`` (``--quick`` takes about 10 s;
``--skips`` runs only the skip rows).
"""

from __future__ import annotations

import itertools
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from mmpack import Mixture, Permutation, ResumableSampler
from mmpack.sampling import BlockOrder, uniform_bounds

CHUNK = 8192


def _times(fn: Callable[[], Any], calls: int) -> np.ndarray:
    fn()  # warm-up
    out = np.empty(calls)
    for t in range(calls):
        t0 = time.perf_counter()
        fn()
        out[t] = time.perf_counter() - t0
    return out


def _rate_row(case: str, n: int, times: np.ndarray, per_call: int) -> dict[str, Any]:
    return {
        "case": case,
        "n": n,
        "unit": "indices/s",
        "median": per_call / float(np.median(times)),
        "p99": per_call / float(np.percentile(times, 99)),
        "calls": times.size,
    }


def _time_row(case: str, n: int, times: np.ndarray, unit: str = "us") -> dict[str, Any]:
    scale = 1e6 if unit == "us" else 1e3
    return {
        "case": case,
        "n": n,
        "unit": unit,
        "median": float(np.median(times)) * scale,
        "p99": float(np.percentile(times, 99)) * scale,
        "calls": times.size,
    }


class _Source:
    """A source of ``n`` samples returning tiny dicts (only ``__len__`` matters for lookups)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        return {"x": np.array([j], dtype=np.int64)}


def _block_rows(calls: int) -> list[dict[str, Any]]:
    """The sampler's figures in the block-window order, and the cost of an epoch's start."""
    rows = []
    for n, size in ((10**6, 1000), (10**11, 1000 * 10**6 // 1000), (10**6, 8)):
        bounds = uniform_bounds(n, size)
        sampler = ResumableSampler(n, seed=1, shuffle="blocks", block_bounds=bounds)
        starts = itertools.cycle(range(0, len(sampler) - CHUNK, CHUNK))
        case = f"blocks of {size}: sampler.indices"
        rows.append(
            _rate_row(
                case, n, _times(lambda: sampler.indices(s := next(starts), s + CHUNK), calls), CHUNK
            )
        )
        it = itertools.chain.from_iterable(itertools.repeat(sampler))

        def pull() -> None:
            for _ in range(CHUNK):
                next(it)

        rows.append(_rate_row(f"blocks of {size}: sampler iter", n, _times(pull, calls), CHUNK))
    for n_blocks in (10**5, 10**6):
        order = BlockOrder(n_blocks * 100, uniform_bounds(n_blocks * 100, 100), seed=3)
        epochs = itertools.count()
        times = _times(lambda: order.window_offsets(next(epochs)), max(3, calls // 20))
        rows.append(_time_row(f"epoch start ({n_blocks:,} blocks)", n_blocks * 100, times, "ms"))
    return rows


def _skip_rows(calls: int) -> list[dict[str, Any]]:
    """The sampler with 100 skipped ranges in its epoch against none, measured side by side."""
    n = 10**6
    plain = ResumableSampler(n, seed=1)
    edited = ResumableSampler(n, seed=1)
    for k in range(100):  # 100 ranges of 1000 positions, spread over the epoch
        edited.skip(k * (n // 100) + 5000, k * (n // 100) + 6000)
    rows, medians = [], {}
    for label, sampler in (("none", plain), ("100 ranges", edited)):
        starts = itertools.cycle(range(0, len(sampler) - CHUNK, CHUNK))
        times = _times(lambda: sampler.indices(s := next(starts), s + CHUNK), calls)
        medians["indices", label] = float(np.median(times))
        rows.append(_rate_row(f"skips ({label}): sampler.indices", n, times, CHUNK))
        it = itertools.chain.from_iterable(itertools.repeat(sampler))

        def pull() -> None:
            for _ in range(CHUNK):
                next(it)

        times = _times(pull, calls)
        medians["iter", label] = float(np.median(times))
        rows.append(_rate_row(f"skips ({label}): sampler iter", n, times, CHUNK))
    for path in ("indices", "iter"):
        ratio = medians[path, "none"] / medians[path, "100 ranges"]
        rows.append(
            {
                "case": f"skips: {path} rate, 100 ranges : none",
                "n": n,
                "unit": "x",
                "median": ratio,
                "p99": ratio,
                "calls": calls,
            }
        )
    return rows


def run(quick: bool = False, only: str | None = None) -> list[dict[str, Any]]:
    """Measure everything; one dict per figure (``case``, ``n``, ``unit``, ``median``, ``p99``)."""
    calls = 40 if quick else 300
    if only == "skips":
        return _skip_rows(calls)
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)

    for n in (10**6, 10**11):
        sampler = ResumableSampler(n, seed=1)
        starts = itertools.cycle(range(0, len(sampler) - CHUNK, CHUNK))
        rows.append(
            _rate_row(
                "sampler.indices (vectorised)",
                n,
                _times(lambda: sampler.indices(s := next(starts), s + CHUNK), calls),
                CHUNK,
            )
        )
        it = itertools.chain.from_iterable(itertools.repeat(sampler))  # epoch after epoch

        def pull() -> None:
            for _ in range(CHUNK):
                next(it)

        rows.append(_rate_row("sampler iter (per index)", n, _times(pull, calls), CHUNK))
        perm = Permutation(n, seed=1)
        idx = rng.integers(0, n, CHUNK)
        rows.append(_rate_row("permutation.map", n, _times(lambda: perm.map(idx), calls), CHUNK))

    rows += _block_rows(calls)
    rows += _skip_rows(calls)

    n = 10**11
    tracemalloc.start()
    sampler = ResumableSampler(n, seed=2)
    it = iter(sampler)
    for _ in range(100_000):
        next(it)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rows.append(
        {
            "case": "memory: build + 100k draws (tracemalloc peak)",
            "n": n,
            "unit": "KiB",
            "median": peak / 1024,
            "p99": peak / 1024,
            "calls": 1,
        }
    )

    state = sampler.state_dict()
    resume_times = {}
    for where, position in (("0", 0), ("n/2", len(sampler) // 2)):
        st = {**state, "position": position}

        def resume() -> None:
            fresh = ResumableSampler(n, seed=2)
            fresh.load_state_dict(st)
            next(iter(fresh))

        resume_times[where] = _times(resume, calls)
        rows.append(_time_row(f"resume at position {where}", n, resume_times[where]))
    ratio = float(np.median(resume_times["n/2"]) / np.median(resume_times["0"]))
    rows.append(
        {
            "case": "resume time ratio n/2 : 0",
            "n": n,
            "unit": "x",
            "median": ratio,
            "p99": ratio,
            "calls": calls,
        }
    )

    sources = [_Source(10**9), _Source(2 * 10**9), _Source(3 * 10**9)]
    medians = {}
    for num_samples in (10**6, 10**9):
        mixture = Mixture(sources, [0.5, 0.3, 0.2], num_samples=num_samples, seed=0)
        positions = rng.integers(0, num_samples, CHUNK)
        times = _times(lambda: mixture.source_of_many(positions), calls)
        medians[num_samples] = float(np.median(times))
        rows.append(_rate_row("mixture.source_of_many (3 sources)", num_samples, times, CHUNK))
        scalar = iter(rng.integers(0, num_samples, 10 * calls + 10).tolist())
        rows.append(
            _rate_row(
                "mixture.source_of (scalar)",
                num_samples,
                _times(lambda: mixture.source_of(next(scalar)), 10 * calls),
                1,
            )
        )
    ratio = medians[10**9] / medians[10**6]
    rows.append(
        {
            "case": "mixture lookup time ratio 1e9 : 1e6",
            "n": 10**9,
            "unit": "x",
            "median": ratio,
            "p99": ratio,
            "calls": calls,
        }
    )
    # Small sources repeat many times: a batch then spans many passes, one permutation each.
    small = Mixture(
        [_Source(10**5), _Source(10**6), _Source(10**7)], [0.5, 0.3, 0.2], num_samples=10**9
    )
    positions = rng.integers(0, 10**9, CHUNK)
    rows.append(
        _rate_row(
            "mixture.source_of_many (small sources, ~5000 passes)",
            10**9,
            _times(lambda: small.source_of_many(positions), calls),
            CHUNK,
        )
    )
    return rows


def main(argv: list[str]) -> None:
    t0 = time.perf_counter()
    rows = run(quick="--quick" in argv, only="skips" if "--skips" in argv else None)
    print(f"{'case':<46} {'n':>15} {'median':>14} {'p99':>14}  unit")
    for r in rows:
        print(
            f"{r['case']:<46} {r['n']:>15,} {r['median']:>14,.2f} {r['p99']:>14,.2f}  {r['unit']}"
        )
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
