"""Plans packed per region: bins against the whole-store best fit, and build time.

Corpora of ``N`` document lengths (10^6, 10^7; quick: 10^6) from
:func:`benchmarks.bench_packing._lengths` (``lognormal(5.48, 1.15)``: C4-like, median ~240
tokens; ``lognormal(6.4, 1.3)``: longer web/code documents with a heavier tail past ``L``)
packed with an eot after every document into bins of ``L`` tokens (2048, 8192; quick: 2048),
best-fit decreasing over the whole store and per region of ``bins/region * L`` tokens
(``region_tokens``; the default, ``"auto"``, is ``DEFAULT_REGION_BINS = 8192`` bins a region).

Columns: ``regions``; ``bins`` and ``whole bins`` (the whole-store plan's); ``bin cost``
(``bins / whole bins - 1``); ``obfd bins``: OLMo-core's optimized best-fit decreasing over the
same items (:func:`obfd_bins`, a pure-Python twin; the whole-store best fit's count, ties
aside); ``build s`` and ``whole build s``, medians of interleaved repeats
after a compile warm-up (the whole ``build_plan`` call), and their ratio; at the default ``R``,
``parts build s``: the same plan built in parts and joined into the cache file
(:func:`~mmpack.packing.build_plan_in_parts`, serially, about 2^25 tokens a part).
Target (``met``): ``bin cost <= 0.01%`` at the default ``R``, and the whole-store best fit no
more bins than ``obfd bins`` (a plan per region packs fewer documents together, so it is held to
the whole-store count plus 0.01%; on corpora of one region, as the equivalence tests',
it uses no more bins than OLMo-core).

Run ``python -m benchmarks.bench_regions [--quick]`` (or ``python -m benchmarks regions``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_packing import _lengths
from mmpack._src.core.options import DEFAULT_REGION_BINS
from mmpack.packing import PlanSpec, build_plan, build_plan_in_parts

TARGET_COST = 1e-4
BINS_PER_REGION = (1024, 2048, 4096, DEFAULT_REGION_BINS)


def obfd_items(lens: np.ndarray, seqlen: int, eot: int = 1) -> np.ndarray:
    """The items a plan packs for documents of ``lens`` tokens (``long_docs="split"``): each
    document's ``lens + eot`` slots cut into full bins of ``seqlen`` and a remainder (int64)."""
    t = np.asarray(lens, dtype=np.int64) + int(eot)
    t = t[t > 0]
    full = (t - 1) // seqlen
    rest = t - full * seqlen
    return np.concatenate([np.full(int(full.sum()), seqlen, dtype=np.int64), rest])


def obfd_bins(items: np.ndarray, seqlen: int) -> int:
    """Bins of OLMo-core's optimized best-fit decreasing (``InstancePacker``, a slow twin written
    from its documented algorithm): items sorted by size, largest first; a max segment tree over
    the remaining capacities ``1..seqlen`` (leaf ``c - 1`` holds ``c`` while a bin has ``c`` free
    slots, the last leaf always ``seqlen``: a fresh bin) finds the smallest capacity that holds
    an item, the first bin of that capacity (a queue per capacity) takes it.  Pure Python,
    O(n log seqlen)."""
    n_leaves = 1 << max(0, (int(seqlen) - 1).bit_length())
    tree = [0] * (2 * n_leaves)
    queues: dict[int, deque[int]] = {}

    def update(leaf: int, weight: int) -> None:
        i = n_leaves + leaf
        tree[i] = weight
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    update(seqlen - 1, seqlen)
    n_bins = 0
    for size in sorted((int(x) for x in items), reverse=True):
        i = 1
        while i < n_leaves:  # leftmost leaf with a weight >= size
            i = 2 * i if tree[2 * i] >= size else 2 * i + 1
        capacity = i - n_leaves + 1
        if capacity == seqlen:
            bin_id = n_bins
            n_bins += 1
        else:
            queue = queues[capacity]
            bin_id = queue.popleft()
            if not queue:
                update(capacity - 1, 0)
        space = capacity - size
        if space > 0:
            queue = queues.setdefault(space, deque())
            if not queue:
                update(space - 1, space)
            queue.append(bin_id)
    return n_bins


class _OffsetsStore:
    """The attributes a plan built in parts reads, for lengths that are not a real store."""

    def __init__(self, path: Path, lens: np.ndarray) -> None:
        self.cache_dir = path / "cache"
        self.offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        self.fingerprint = "bench0000000000b"
        self.paged_offsets = self.offsets  # searched and sliced as the store's paged offsets
        self.num_tokens = int(self.offsets[-1])

    def doc_bounds(self, lo: int, hi: int) -> np.ndarray:
        return self.offsets[lo : hi + 1]


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _case(dist: str, n: int, seqlen: int, tmp: Path) -> list[dict[str, Any]]:
    lens = _lengths(dist, n, seqlen)
    whole = build_plan(lens, seqlen, add_eot=True)
    obfd = obfd_bins(obfd_items(lens, seqlen), seqlen)
    plans = {
        b: build_plan(lens, seqlen, add_eot=True, region_tokens=b * seqlen) for b in BINS_PER_REGION
    }
    times: dict[Any, list[float]] = {b: [] for b in (None, *BINS_PER_REGION)}
    for _ in range(3 if n <= 1_000_000 else 2):  # interleaved: the same load for every R
        for b in times:
            r = None if b is None else b * seqlen
            times[b].append(
                _seconds(lambda r=r: build_plan(lens, seqlen, add_eot=True, region_tokens=r))
            )
    t_whole = float(np.median(times[None]))
    rows = []
    for b, plan in plans.items():
        t = float(np.median(times[b]))
        row: dict[str, Any] = {
            "case": f"{dist} N={n:.0e} L={seqlen}",
            "bins/region": b,
            "region_tokens": b * seqlen,
            "regions": plan.n_regions,
            "bins": plan.n_bins,
            "whole bins": whole.n_bins,
            "bin cost": plan.n_bins / whole.n_bins - 1.0,
            "obfd bins": obfd,
            "build s": t,
            "whole build s": t_whole,
            "build / whole": t / t_whole,
        }
        if b == DEFAULT_REGION_BINS:
            folder = tmp / f"{dist}-{n}-{seqlen}"
            store = _OffsetsStore(folder, lens)
            row["parts build s"] = _seconds(
                lambda: build_plan_in_parts(
                    store, PlanSpec(seqlen, add_eot=True, region_tokens="auto")
                )
            )
            shutil.rmtree(folder, ignore_errors=True)
            row["target"] = f"bin cost <= {TARGET_COST:.2%} at the default R, whole bins <= obfd"
            row["met"] = bool(row["bin cost"] <= TARGET_COST and whole.n_bins <= obfd)
        rows.append(row)
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = [1_000_000] if quick else [1_000_000, 10_000_000]
    seqlens = [2048] if quick else [2048, 8192]
    warm = np.array([1, 5, 3000, 0], dtype=np.int64)
    build_plan(warm, 2048, add_eot=True, region_tokens=2)  # compile outside the timings
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-regions-"))
    try:
        for dist in ("lognormal(5.48,1.15)", "lognormal(6.4,1.3)"):
            for n in sizes:
                for seqlen in seqlens:
                    rows += _case(dist, n, seqlen, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("plans per region: bin cost and build time", run(quick="--quick" in sys.argv[1:]))
