"""Joins: time and bytes written by ``mmpack.join`` against the parts' size, and the read cost of a
joined store against one store holding the same documents.

Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens), uint16
tokens, cut into ``parts`` stores of equal document counts.  Cases: ``join`` (median of 5,
each into a fresh folder), the bytes it wrote (manifest + global offsets) over the parts' bytes;
random batches of 32 windows of 2048 tokens (``WindowDataset.__getitems__``) and of packed rows,
joined vs single, paired medians.

Run ``python -m benchmarks.bench_join [--quick]``.
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
from mmpack import WindowDataset


def _docs(num_tokens: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(5.48, 1.15, size=num_tokens // 200).astype(np.int64), 1)
    lens = lens[np.cumsum(lens) <= num_tokens]
    flat = (np.arange(int(lens.sum()), dtype=np.int64) * 7919 % 50257).astype(np.uint16)
    return np.split(flat, np.cumsum(lens)[:-1])


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _paired_batches(
    a, b, batches: list[np.ndarray], alternate: bool = False
) -> tuple[float, float, float]:
    """Medians of ``a``'s and ``b``'s times per batch and of their per-batch ratios, each batch
    read by both back to back (``alternate``: ``b`` first on every other batch, so that
    neither side always follows the other)."""
    ta, tb = [], []
    for k, idx in enumerate(batches):
        first, second = (b, a) if alternate and k % 2 else (a, b)
        t0 = time.perf_counter()
        first.__getitems__(idx)
        t1 = time.perf_counter()
        second.__getitems__(idx)
        t2 = time.perf_counter()
        ta.append(t1 - t0 if first is a else t2 - t1)
        tb.append(t2 - t1 if first is a else t1 - t0)
    ratios = np.array(ta) / np.array(tb)
    return float(np.median(ta)), float(np.median(tb)), float(np.median(ratios))


def run(quick: bool = False) -> list[dict[str, Any]]:
    num_tokens = 5_000_000 if quick else 50_000_000
    n_parts = 8 if quick else 32
    docs = _docs(num_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-join-"))
    rows: list[dict[str, Any]] = []
    try:
        cuts = np.linspace(0, len(docs), n_parts + 1).astype(int)
        parts = [
            mmpack.build(tmp / f"part-{k:03d}", docs[a:b], fsync=False)
            for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))
        ]
        single = mmpack.build(tmp / "single", docs, fsync=False)
        parts_bytes = sum(_size(p.path) for p in parts)
        token_bytes = single.num_tokens * 2
        times = []
        for r in range(5):
            t0 = time.perf_counter()
            joined = mmpack.join(parts, tmp / f"join-{r}")
            times.append(time.perf_counter() - t0)
        written = _size(tmp / "join-0")
        rows.append(
            {
                "case": "join",
                "parts": n_parts,
                "documents": len(single),
                "tokens": single.num_tokens,
                "seconds (median of 5)": float(np.median(times)),
                "bytes written": written,
                "parts' bytes": parts_bytes,
                "written / token bytes": written / token_bytes,
                "met": written / token_bytes <= 0.01,
            }
        )
        rng = np.random.default_rng(1)
        for name, make in (
            ("windows 32x2048", lambda s: WindowDataset(s, 2048, eot=0)),
            ("packed rows 32x2048", lambda s: mmpack.PackedDataset(s, 2048, eot=0)),
        ):
            a, b = make(joined), make(single)
            batches = [rng.integers(0, len(a), 32) for _ in range(200 if quick else 1000)]
            for idx in batches[:20]:  # warm-up: kernels compiled, pages cached
                a.__getitems__(idx)
                b.__getitems__(idx)
            tj, ts, ratio = _paired_batches(a, b, batches)
            rows.append(
                {
                    "case": name,
                    "joined ms/batch": tj * 1e3,
                    "single ms/batch": ts * 1e3,
                    "joined / single (median of pairs)": ratio,
                    "joined Mtok/s": 32 * 2048 / tj / 1e6,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("join", run(quick="--quick" in sys.argv))
