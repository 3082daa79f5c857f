"""Packing plans: build speed (documents/s) and quality (bins against the lower bound).

Corpora of ``N`` document lengths (10^5 .. 10^7; quick: 10^5, 10^6) packed into bins of ``L``
tokens (2048 .. 32768) with an eot after every document:

- ``lognormal(5.48, 1.15)``: C4-like (median ~240 tokens);
- ``lognormal(6.4, 1.3)``: longer web/code documents (median ~600, a heavier tail past ``L``);
- ``gamma(5, 20)``: short, narrow (mean 100);
- ``adversarial``: every document ``L/2 + 1`` tokens without eot: no two fit a bin, so every
  algorithm needs ``N`` bins for a lower bound of about ``N/2``.

Columns: ``bfd Mdocs/s`` (median of repeats after a compile warm-up; the whole ``build_plan``
call), ``bins/lower`` (bins over ``ceil(tokens / L)``) and ``excess`` (that ratio minus 1), ``efficiency`` (real tokens incl. eot
over ``bins * L``), ``frac_long`` / ``frac_split`` (documents longer than a bin / split), the same
for ``algorithm="online"`` (1024 open bins), and ``reopen ms``: loading the cached plan file
(format 4, XXH64 per array) with :func:`cached_plan` (median of 7).
``chunk frac_split`` is the fraction of documents concatenate-and-chunk would cut.
Target (``met``): BFD at least 10M documents/s at N >= 10^6, and at most 1e-4 bins over the lower
bound on the lognormal corpora (1% on gamma).

Run ``python -m benchmarks.bench_packing [--quick]``; ``--reopen`` measures only the reopen
columns (N = 10^6 and 10^7, L = 2048).  Plans per region: :mod:`benchmarks.bench_regions`.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.packing import PlanSpec, build_plan, cached_plan

TARGET_DOCS_PER_S = 10e6


def _lengths(dist: str, n: int, seqlen: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dist == "lognormal(5.48,1.15)":
        return rng.lognormal(5.48, 1.15, n).astype(np.int64)
    if dist == "lognormal(6.4,1.3)":
        return rng.lognormal(6.4, 1.3, n).astype(np.int64)
    if dist == "gamma(5,20)":
        return rng.gamma(5.0, 20.0, n).astype(np.int64)
    if dist == "adversarial":
        return np.full(n, seqlen // 2 + 1, dtype=np.int64)
    raise ValueError(dist)


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


class _DirStore:
    """The attributes :func:`cached_plan` reads, for a folder that is not a real store."""

    def __init__(self, path: Path, doc_lens: np.ndarray) -> None:
        self.path = path
        self.cache_dir = path / "cache"
        self.doc_lens = doc_lens
        self.offsets = np.concatenate([[0], np.cumsum(doc_lens)]).astype(np.int64)
        self.fingerprint = "bench0000000000a"
        self.mapped_offsets = self.offsets

    def doc_bounds(self, lo: int, hi: int) -> np.ndarray:
        return self.offsets[lo : hi + 1]


def _chunk_split_fraction(lens: np.ndarray, seqlen: int, eot: bool) -> float:
    """Fraction of documents that concatenate-and-chunk (cut the stream every ``seqlen`` tokens)
    splits: those with a cut strictly inside them."""
    ends = np.cumsum(lens + int(eot))
    cuts = np.arange(seqlen, int(ends[-1]), seqlen)
    doc = np.searchsorted(ends, cuts, side="right")  # the document each cut falls in
    inside = cuts != np.concatenate([[0], ends])[doc]
    return np.unique(doc[inside]).size / lens.size


def _reopen_ms(folder: Path, lens: np.ndarray, seqlen: int, eot: bool) -> dict[str, float]:
    """Median ms of :func:`cached_plan` reopening its file (7 repeats)."""
    store = _DirStore(folder, lens)
    store.path.mkdir()
    cached_plan(store, PlanSpec(seqlen, add_eot=eot))
    t = [
        _median_seconds(lambda: cached_plan(store, PlanSpec(seqlen, add_eot=eot)), 1)
        for _ in range(7)
    ]
    return {"reopen ms": float(np.median(t)) * 1e3}


def run_reopen() -> list[dict[str, Any]]:
    """Only the reopen columns: every corpus at N = 10^6 and 10^7, L = 2048."""
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-reopen-"))
    for dist in ["lognormal(5.48,1.15)", "lognormal(6.4,1.3)", "gamma(5,20)", "adversarial"]:
        for n in (1_000_000, 10_000_000):
            lens = _lengths(dist, n, 2048)
            row: dict[str, Any] = {"case": f"{dist} N={n:.0e} L=2048"}
            row.update(_reopen_ms(tmp / f"{dist}-{n}", lens, 2048, dist != "adversarial"))
            rows.append(row)
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = [100_000, 1_000_000] if quick else [100_000, 1_000_000, 10_000_000]
    seqlens = [2048, 32768] if quick else [2048, 8192, 32768]
    dists = ["lognormal(5.48,1.15)", "lognormal(6.4,1.3)", "gamma(5,20)", "adversarial"]
    warm = np.array([1, 5, 3000, 0], dtype=np.int64)
    for algorithm in ("bfd", "online"):
        build_plan(warm, 2048, add_eot=True, algorithm=algorithm)  # compile outside the timings
        build_plan(warm, 2048, add_eot=False, algorithm=algorithm)
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-packing-"))
    for dist in dists:
        for n in sizes:
            for seqlen in seqlens:
                lens = _lengths(dist, n, seqlen)
                eot = dist != "adversarial"
                repeats = 3 if n <= 1_000_000 else 2
                plan = build_plan(lens, seqlen, add_eot=eot)
                t_bfd = _median_seconds(lambda: build_plan(lens, seqlen, add_eot=eot), repeats)
                stream = build_plan(lens, seqlen, add_eot=eot, algorithm="online")
                t_stream = _median_seconds(
                    lambda: build_plan(lens, seqlen, add_eot=eot, algorithm="online"), 1
                )
                s, ss = plan.stats, stream.stats
                row: dict[str, Any] = {
                    "case": f"{dist} N={n:.0e} L={seqlen}",
                    "bfd Mdocs/s": n / t_bfd / 1e6,
                    "bins": s.n_bins,
                    "lower": s.lower_bound_bins,
                    "bins/lower": s.n_bins / max(s.lower_bound_bins, 1),
                    "excess": s.excess_bins,
                    "efficiency": s.efficiency,
                    "frac_long": s.frac_long,
                    "frac_split": s.frac_split,
                    "chunk frac_split": _chunk_split_fraction(lens, seqlen, eot),
                    "stream Mdocs/s": n / t_stream / 1e6,
                    "stream excess": ss.excess_bins,
                    "stream efficiency": ss.efficiency,
                }
                if n >= 1_000_000 and seqlen == 2048:
                    row.update(_reopen_ms(tmp / f"{dist}-{n}", lens, seqlen, eot))
                if n >= 1_000_000:
                    fast = n / t_bfd >= TARGET_DOCS_PER_S
                    # 1e-4 on the lognormal corpora (the benchmark issue), 1% elsewhere.
                    bound = 1e-4 if dist.startswith("lognormal") else 1e-2
                    tight = dist == "adversarial" or s.excess_bins <= bound
                    row["met"] = bool(fast and tight)
                rows.append(row)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    if "--reopen" in sys.argv[1:]:
        print_table("packing plans: reopening a cached plan", run_reopen())
    else:
        print_table("packing plans", run(quick="--quick" in sys.argv[1:]))
