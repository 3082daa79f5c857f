"""Provenance: what ``collate(..., provenance=True)`` adds to a batch, and the latency of
``mmpack show --position``.

Batches.  Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens),
uint16 tokens.  Cases: random batches of 32 windows of 2048 tokens with labels, of 32 packed rows
of 2048, and of a two-source mixture of such windows; each batch is read and collated
(``collate(view.__getitems__(idx))``) with and without ``provenance=True``, the two timed
back to back on the same indices, which goes first alternating from batch to batch; the figures
are the ratio of the two medians and the median of the per-batch ratios (target <= 1.10:
provenance costs at most 10% of a batch).

``show --position``.  A store of 10**6 documents (10**5 with ``--quick``) of 1 to 40 tokens;
``mmpack show STORE --seqlen 2048 --position P --seed 1`` in process
(:func:`mmpack.cli.main`, output discarded; median of runs at random positions) and as
a subprocess (``python -m mmpack``, median of runs), beside ``show -i`` of the same sample: the
difference is the sampler's arithmetic (:class:`~mmpack._src.sampling.dealing.Dealing`, which imports
no torch).

Run ``python -m benchmarks.bench_provenance [--quick]``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import mmpack
from benchmarks.bench_join import _docs
from mmpack import Mixture, WindowDataset
from mmpack.cli import main as cli_main
from mmpack.torch import collate

TARGET = 1.10
ROOT = Path(__file__).resolve().parents[1]


def _paired(ds: Any, batches: list[np.ndarray]) -> tuple[float, float, float]:
    """Median seconds of a batch without and with provenance, and the median of their ratios."""
    plain, traced = [], []
    clock = time.perf_counter
    for k, idx in enumerate(batches):
        first = bool(k % 2)  # which goes first alternates: the second finds the pages warmer
        t0 = clock()
        collate(ds.__getitems__(idx), provenance=first)
        t1 = clock()
        collate(ds.__getitems__(idx), provenance=not first)
        t2 = clock()
        plain.append(t2 - t1 if first else t1 - t0)
        traced.append(t1 - t0 if first else t2 - t1)
    ratio = np.array(traced) / np.array(plain)
    return float(np.median(plain)), float(np.median(traced)), float(np.median(ratio))


def _batch_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    docs = _docs(1_000_000 if quick else 20_000_000)
    store = mmpack.build(tmp / "c4", docs, fsync=False)
    other = mmpack.build(tmp / "c4b", docs[: len(docs) // 2], fsync=False)
    cases = (
        ("windows 32x2048 + labels", WindowDataset(store, 2048, eot=0, labels=True)),
        ("packed rows 32x2048", mmpack.PackedDataset(store, 2048, eot=0)),
        (
            "mixture of 2 window views 32x2048",
            Mixture(
                [WindowDataset(s, 2048, eot=0, labels=True) for s in (store, other)], [0.6, 0.4]
            ),
        ),
    )
    rng = np.random.default_rng(1)
    rows = []
    for name, ds in cases:
        batches = [rng.integers(0, len(ds), 32) for _ in range(100 if quick else 1000)]
        _paired(ds, batches[:20])  # warm-up: kernels compiled, pages cached
        plain, traced, ratio = _paired(ds, batches)
        rows.append(
            {
                "case": name,
                "ms/batch": plain * 1e3,
                "ms/batch with provenance": traced * 1e3,
                "ratio of medians": traced / plain,
                "with / without (median of pairs)": ratio,
                "target": TARGET,
                "met": ratio <= TARGET,
            }
        )
    return rows


def _in_process(argv: list[str]) -> float:
    sink = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        code = cli_main(argv)
    elapsed = time.perf_counter() - t0
    assert code == 0, argv
    return elapsed


def _subprocess(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mmpack", *argv], check=True, capture_output=True, env=env
    )
    return time.perf_counter() - t0


def _show_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    n_docs = 10**5 if quick else 10**6
    rng = np.random.default_rng(2)
    lens = rng.integers(1, 41, n_docs)
    flat = (np.arange(int(lens.sum()), dtype=np.int64) % 50257).astype(np.uint16)
    store = mmpack.build(tmp / "docs", np.split(flat, np.cumsum(lens)[:-1]), fsync=False)
    base = ["show", str(store.path), "--seqlen", "2048", "--eot", "0"]
    n = len(WindowDataset(store, 2048, eot=0))
    positions = rng.integers(0, 3 * n, 3 if quick else 15).tolist()
    runs = 1 if quick else 5
    rows = []
    for how, timer, count in (("in process", _in_process, None), ("subprocess", _subprocess, runs)):
        for what in ("--position P --seed 1", "-i I (no sampler)"):
            times = []
            for p in positions[:count]:
                if what.startswith("--position"):
                    which = ["--position", str(p), "--seed", "1"]
                else:
                    which = ["-i", str(p % n)]
                times.append(timer(base + which))
            rows.append(
                {
                    "case": f"show {what}, {how}",
                    "documents": len(store),
                    "runs": len(times),
                    "median ms": float(np.median(times)) * 1e3,
                }
            )
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-provenance-"))
    try:
        return _batch_rows(tmp, quick) + _show_rows(tmp, quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("provenance", run(quick="--quick" in sys.argv))
