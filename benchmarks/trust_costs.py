"""What the store layer's integrity checks cost (issue 13): ``python -m benchmarks.trust_costs``.

Three measurements, each printed as medians side by side:

- ``plan``: loading a cached 10M-document packing plan, which checks its arrays (XXH64 each, plan format 3);
- ``verify_reads``: random ``WindowDataset`` batches (64 windows of 2048) over 100M uint16
  tokens with ``mmpack.open(..., verify_reads=True)`` against the plain memory map, plus the
  one-time cost of checking each 16 MiB stripe on first touch, and a full ``verify()``;
- ``build``: ``mmpack.build`` from 300k numpy documents (each copied as it is taken, so a source
  may reuse its output buffer);
- ``node_cache``: a remote store (``file://``, 64 MB of uint16 tokens in 16 KiB check pages)
  whose node cache holds every page, read by a new reader in shuffled batches of 32 windows of
  2048: its first pass checks every cached page once (XXH64), against a first pass whose
  pages are marked checked beforehand (the same page faults, no hashing) and a later pass.
- ``join``: opening a join of 1,000 small parts (each part's files mapped and closed), and random
  ``WindowDataset`` batches over a join of 32 parts (100M uint16 tokens) with
  ``verify_reads=True`` against the plain join, paired medians.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import numpy as np

import mmpack
from mmpack import WindowDataset
from mmpack._src.packing.plan_file import ARRAYS
from mmpack.packing import PlanSpec, build_plan, load_plan, plan_cache_key, save_plan


def _median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def bench_plan(tmp: str) -> None:
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 3000, 10_000_000)
    plan = build_plan(lens, 2048, add_eot=True)
    key = plan_cache_key("f" * 16, PlanSpec(2048, add_eot=True))
    path = f"{tmp}/p.mmplan"
    save_plan(plan, path, key)
    ms = _median_ms(lambda: load_plan(path, key), 7)
    size = sum(getattr(plan, name).nbytes for name, _ in ARRAYS)
    print(
        f"plan: {len(lens):,} documents, {size / 1e6:.0f} MB of arrays: load_plan (header + XXH64 "
        f"of every array, page cache warm) median {ms:.1f} ms"
    )


def _window_batches(store, nb: int, seed: int) -> np.ndarray:
    ds = WindowDataset(store, 2048)
    rng = np.random.default_rng(seed)
    ds.__getitems__(rng.integers(0, len(ds), 64))  # compile / warm up
    ts = []
    for _ in range(nb):
        idx = rng.integers(0, len(ds), 64)
        t = time.perf_counter()
        ds.__getitems__(idx)
        ts.append(time.perf_counter() - t)
    return np.array(ts)


def bench_verify_reads(tmp: str) -> None:
    rng = np.random.default_rng(0)

    def docs():
        left = 100_000_000
        while left > 0:
            n = min(left, int(rng.integers(100, 4000)))
            left -= n
            yield rng.integers(0, 50000, n, dtype=np.uint16)

    mmpack.build(f"{tmp}/s", docs(), fsync=False)
    for _ in range(2):
        plain = _window_batches(mmpack.open(f"{tmp}/s"), 300, 1)
        store = mmpack.open(f"{tmp}/s", verify_reads=True)
        first = _window_batches(store, 300, 1)
        steady = _window_batches(store, 300, 2)
        n_stripes = len(store.meta["checksum"]["tokens"])
        print(
            f"verify_reads: plain memmap median {np.median(plain) * 1e3:.3f} ms/batch | "
            f"verify_reads steady {np.median(steady) * 1e3:.3f} ms/batch "
            f"({np.median(steady) / np.median(plain):.2f}x) | first 300 batches "
            f"{first.sum():.2f} s vs {plain.sum():.2f} s plain ({n_stripes} stripes checked)"
        )
    t = time.perf_counter()
    mmpack.open(f"{tmp}/s").verify()
    print(f"verify(): {time.perf_counter() - t:.2f} s for 200 MB")


def bench_build(tmp: str) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, int(n)).astype(np.uint16) for n in rng.integers(1, 900, 300_000)]
    ts = []
    for k in range(5):
        t = time.perf_counter()
        mmpack.build(f"{tmp}/b{k}", docs, fsync=False)
        ts.append(time.perf_counter() - t)
    print(f"build: 300k uint16 numpy documents, median {np.median(ts):.3f} s")


def bench_node_cache(tmp: str) -> None:
    rng = np.random.default_rng(0)

    def docs():
        left = 32_000_000
        while left > 0:
            n = min(left, int(rng.integers(100, 4000)))
            left -= n
            yield rng.integers(0, 50000, n, dtype=np.uint16)

    url = f"file://{tmp}/remote"
    mmpack.build(url, docs())
    cache = f"{tmp}/cache"
    fill = mmpack.open(url, cache_dir=cache, cache_limit=1 << 34)
    for a in range(0, fill.num_tokens, 1 << 22):
        fill.read_range(a, min(fill.num_tokens, a + (1 << 22)))
    del fill

    def first_pass(precheck: bool) -> tuple[float, float, int]:
        store = mmpack.open(url, cache_dir=cache, cache_limit=1 << 34)
        ds = WindowDataset(store, 2048)
        order = np.random.default_rng(1).permutation(len(ds))
        ds.__getitems__(order[:32])  # compile / warm up
        cf = store._backend.node_cache.mapped
        if precheck:
            cf.checked[:] = 1
        batches = [order[i : i + 32] for i in range(32, len(order) - 31, 32)]
        t = time.perf_counter()
        for b in batches:
            ds.__getitems__(b)
        first = time.perf_counter() - t
        t = time.perf_counter()
        for b in batches:
            ds.__getitems__(b)
        return first, time.perf_counter() - t, cf.npages

    runs: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(6):  # interleaved: the same load on both
        for precheck in (False, True):
            runs[precheck].append(first_pass(precheck))
    checked = float(np.median([r[0] for r in runs[False]]))
    unchecked = float(np.median([r[0] for r in runs[True]]))
    later = float(np.median([r[1] for r in runs[False] + runs[True]]))
    npages = runs[False][0][2]
    print(
        f"node_cache: new reader's first pass {checked:.3f} s (every page checked) vs "
        f"{unchecked:.3f} s (marked checked beforehand), later passes {later:.3f} s: "
        f"{(checked - unchecked) / npages * 1e6:.1f} us per 16 KiB page checked, once "
        f"({npages} pages)"
    )


def bench_join(tmp: str) -> None:
    rng = np.random.default_rng(0)
    mmpack.build(f"{tmp}/small", [[1, 2, 3], [4, 5]], fsync=False)
    for k in range(1000):
        shutil.copytree(f"{tmp}/small", f"{tmp}/many/p{k}")
    mmpack.join([f"{tmp}/many/p{k}" for k in range(1000)], f"{tmp}/many-j", fsync=False)
    print(
        f"join: open of 1,000 parts, median {_median_ms(lambda: mmpack.open(f'{tmp}/many-j'), 5):.0f} ms"
    )
    per_part = 100_000_000 // 32
    for k in range(32):
        left, docs = per_part, []
        while left > 0:
            n = min(left, int(rng.integers(100, 4000)))
            left -= n
            docs.append(rng.integers(0, 50000, n, dtype=np.uint16))
        mmpack.build(f"{tmp}/p{k}", docs, fsync=False)
    mmpack.join([f"{tmp}/p{k}" for k in range(32)], f"{tmp}/j", fsync=False)
    for _ in range(2):
        plain = _window_batches(mmpack.open(f"{tmp}/j"), 300, 1)
        store = mmpack.open(f"{tmp}/j", verify_reads=True)
        first = _window_batches(store, 300, 1)
        steady = _window_batches(store, 300, 2)
        print(
            f"join verify_reads: plain median {np.median(plain) * 1e3:.3f} ms/batch | "
            f"verify_reads steady {np.median(steady) * 1e3:.3f} ms/batch "
            f"({np.median(steady) / np.median(plain):.2f}x) | first 300 batches "
            f"{first.sum():.2f} s vs {plain.sum():.2f} s plain"
        )


def main(argv: list[str]) -> None:
    topics = argv or ["plan", "verify_reads", "build", "node_cache", "join"]
    benches = {
        "plan": bench_plan,
        "verify_reads": bench_verify_reads,
        "build": bench_build,
        "node_cache": bench_node_cache,
        "join": bench_join,
    }
    for topic in topics:
        tmp = tempfile.mkdtemp(prefix="mmpack-bench-")
        try:
            benches[topic](tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
