"""Packed random access against the physical floor, measured side by side.

A C4-like store (lognormal(5.48, 1.15); 1M documents, 100k in ``--quick``) packed into 2048-token
bins by best-fit decreasing.  ``ds[i]`` (causal labels, attention mask, position ids, cu_seqlens;
int64, and int32 outputs)
against ``raw[s:s+2048].copy()`` of the same mapped bytes (interleaved, after an untimed pass over
every sample); ``__getitems__`` of 32/128 bins against
copying the same number of bytes row by row into a reused buffer; the same with MLM corruption.

Run ``python -m benchmarks.bench_packed [--quick]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_window import _lengths, _make_store, _raw_view, side_by_side
from benchmarks.timing import median_p99, per_call_seconds
from mmpack import PackedDataset

SEQLEN = 2048
EOT = 50256


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-packed-"))
    rows: list[dict[str, Any]] = []
    try:
        n_docs = 100_000 if quick else 1_000_000
        store = _make_store(tmp / "c4", _lengths(n_docs, 5.48, 1.15))
        raw = _raw_view(store)
        views = {
            "causal": PackedDataset(store, SEQLEN, eot=EOT, pad_id=EOT + 1),
            "causal int32": PackedDataset(store, SEQLEN, eot=EOT, pad_id=EOT + 1, dtype="int32"),
            "mlm": PackedDataset(
                store,
                SEQLEN,
                eot=EOT,
                pad_id=EOT + 1,
                mode="mlm",
                mask_id=EOT + 2,
                vocab_size=EOT + 3,
            ),
        }
        rng = np.random.default_rng(0)
        n_single = 5000 if quick else 50_000
        # ds[i] of both views and the floor interleaved, after a pass that touches every page.
        singles = {
            name: (ds.__getitem__, rng.integers(0, len(ds), size=n_single).tolist())
            for name, ds in views.items()
        }
        starts = rng.integers(0, raw.size - SEQLEN, size=n_single).tolist()
        singles["floor"] = (lambda s: raw[s : s + SEQLEN].copy(), starts)
        secs = side_by_side(singles)
        floor = median_p99(secs["floor"])
        for name, ds in views.items():
            ours = median_p99(secs[name])
            rows.append(
                {
                    "case": f"ds[i] {name}",
                    "p50 us": ours[0] * 1e6,
                    "p99 us": ours[1] * 1e6,
                    "floor p50 us": floor[0] * 1e6,
                    "floor": "raw[s:s+L].copy()",
                    "ratio": ours[0] / floor[0],
                    "target": "<= 3" if name.startswith("causal") else "",
                    "met": ours[0] / floor[0] <= 3 if name.startswith("causal") else "",
                }
            )
            for batch in (32, 128):
                calls = 30 if quick else 200
                batches = rng.integers(0, len(ds), size=(calls, batch))
                flat = rng.integers(0, raw.size - SEQLEN, size=(calls, batch))
                buf = np.empty((batch, SEQLEN), dtype=raw.dtype)
                counter = iter(range(10**9))

                def gather() -> None:
                    ds.__getitems__(batches[next(counter) % calls])

                def numpy_floor() -> None:
                    for k, s in enumerate(flat[next(counter) % calls]):
                        buf[k] = raw[s : s + SEQLEN]

                t_ours = median_p99(per_call_seconds(gather, calls))
                t_floor = median_p99(per_call_seconds(numpy_floor, calls))
                tokens = batch * SEQLEN
                ratio = t_floor[0] / t_ours[0]
                rows.append(
                    {
                        "case": f"__getitems__ x{batch} {name}",
                        "Mtok/s": tokens / t_ours[0] / 1e6,
                        "p99 Mtok/s": tokens / t_ours[1] / 1e6,
                        "floor Mtok/s": tokens / t_floor[0] / 1e6,
                        "floor": "buf[k] = raw[s:s+L] (reused)",
                        "ratio": ratio,
                        "target": ">= 0.7 of floor" if name.startswith("causal") else "",
                        "met": ratio >= 0.7 if name.startswith("causal") else "",
                    }
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table
    from benchmarks.timing import load_average

    print("load average before:", load_average())
    result = run(quick="--quick" in sys.argv)
    print("load average after:", load_average())
    print_table("packed access", result)
