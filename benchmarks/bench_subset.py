"""Subsets without rewriting: a subset of 10% of a store's documents read through a packed view
against a store built from just those documents, and ``split`` of 10^7 documents.

Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens), uint16
tokens.  Case 1: ``store.where(...)`` keeps a random 10% of the documents (a per-document field
``keep``); a ``PackedDataset`` of rows of 2048 over the subset and one over a store built from
just those documents (the same plan, checked: the same documents in the same rows); every
row read once by both first (pages cached and mapped, kernels compiled); then random batches of
32 rows, each read by both back to back, the subset first on every other batch; the median of
the per-batch ratios (target <= 1.2).  Case 2:
``store.split({"train": 0.99, "validation": 0.01})`` of a store of 10^7 one-token documents,
the median of 5 calls (target < 1 s; ``--quick``: 10^6 documents).

Run ``python -m benchmarks.bench_subset [--quick]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import mmpack
from benchmarks.bench_join import _docs, _paired_batches
from mmpack.store import StoreWriter

PACKED_TARGET = 1.2
SPLIT_TARGET = 1.0


def _packed_row(tmp: Path, quick: bool) -> dict[str, Any]:
    docs = _docs(5_000_000 if quick else 50_000_000)
    keep = np.random.default_rng(0).random(len(docs)) < 0.1
    store = mmpack.build(tmp / "all", docs, fields={"keep": keep.astype(np.int64)}, fsync=False)
    sub = store.where(keep=1)
    just = mmpack.build(tmp / "just", [docs[j] for j in np.flatnonzero(keep)], fsync=False)
    a, b = mmpack.PackedDataset(sub, 2048, eot=0), mmpack.PackedDataset(just, 2048, eot=0)
    for name in ("bin_ptr", "piece_doc", "piece_start", "piece_len"):  # the same rows
        assert np.array_equal(getattr(a.plan, name), getattr(b.plan, name)), name
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, len(a), 32) for _ in range(200 if quick else 1000)]
    for lo in range(0, len(a), 32):  # warm-up: kernels compiled, every row's pages mapped
        a.__getitems__(np.arange(lo, min(lo + 32, len(a))))
        b.__getitems__(np.arange(lo, min(lo + 32, len(b))))
    ts, tj, ratio = _paired_batches(a, b, batches, alternate=True)
    return {
        "case": "packed rows 32x2048, subset of 10% vs a store of just those",
        "documents": len(sub),
        "subset ms/batch": ts * 1e3,
        "own store ms/batch": tj * 1e3,
        "ratio (median of pairs)": ratio,
        "target": PACKED_TARGET,
        "met": ratio <= PACKED_TARGET,
    }


def _split_row(tmp: Path, quick: bool) -> dict[str, Any]:
    n = 1_000_000 if quick else 10_000_000
    with StoreWriter(tmp / "many", fsync=False) as w:
        w.add_batch(np.ones(n, dtype=np.uint16), np.ones(n, dtype=np.int64))
    store = w.store
    assert store is not None
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        parts = store.split({"train": 0.99, "validation": 0.01}, seed=0)
        times.append(time.perf_counter() - t0)
    assert sum(len(p) for p in parts.values()) == n
    median = float(np.median(times))
    return {
        "case": f"split of {n:,} documents (99% / 1%)",
        "documents": n,
        "split s (median of 5)": median,
        "target": SPLIT_TARGET,
        "met": median < SPLIT_TARGET,
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-subset-"))
    try:
        return [_packed_row(tmp, quick), _split_row(tmp, quick)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("subset", run(quick="--quick" in sys.argv))
