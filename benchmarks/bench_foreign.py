"""Foreign formats served in place: opening a Megatron dataset and indexing a flat EOS file.

Cases (each the median of 5 runs, paired with its reference run alternately):

- ``megatron open``: ``mmpack.open(PREFIX)`` of a synthetic ``.idx`` of S sequences (one per
  document, C4-like lengths) over a sparse ``.bin`` (no disk used), against megatron-core's own
  ``IndexedDataset(PREFIX)`` when it is installed.  The first open validates the whole index
  (document index, lengths, pointer contiguity), builds ``offsets``, hashes the ``.idx`` and
  caches the result; a reopen maps the cached ``offsets`` (and, like every mmpack store, checks
  that they never decrease).  Megatron only maps the index, so the ratio is the price of that
  validation.
- ``eos scan``: the first ``mmpack.open(PATH, format="eos-separated")`` of a uint16 file (one
  numba pass, index written to the cache) against ``(np.memmap(...) == eos).nonzero()``, the
  way OLMo-core finds documents; and the cached reopen.

Run ``python -m benchmarks.bench_foreign [--quick]``.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import mmpack
from mmpack._src.formats.foreign import INDEX_SETTLE_NS
from mmpack._src.formats.megatron import MAGIC
from mmpack.formats import eos_offsets


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _write_megatron(prefix: Path, lens: np.ndarray) -> None:
    s = lens.size
    ptrs = np.zeros(s, dtype="<i8")
    np.cumsum(lens[:-1].astype(np.int64) * 4, out=ptrs[1:])
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, 4, s, s + 1))
        f.write(lens.astype("<i4").tobytes())
        f.write(ptrs.tobytes())
        f.write(np.arange(s + 1, dtype="<i8").tobytes())
    with open(str(prefix) + ".bin", "wb") as f:
        f.truncate(int(lens.sum()) * 4)  # sparse: opening never reads it


def run(quick: bool = False) -> list[dict[str, Any]]:
    seqs = 1_000_000 if quick else 10_000_000
    flat_tokens = 20_000_000 if quick else 200_000_000
    repeats = 5
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-foreign-"))
    os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache")
    rows: list[dict[str, Any]] = []
    try:
        lens = np.maximum(rng.lognormal(5.48, 1.15, size=seqs), 1).astype(np.int32)
        _write_megatron(tmp / "meg", lens)
        time.sleep(INDEX_SETTLE_NS / 1e9)  # a file changed in the last 2 s is never cached
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from megatron.core.datasets.indexed_dataset import IndexedDataset
        except ImportError:
            IndexedDataset = None
        ours, cached, theirs = [], [], []
        mmpack.open(tmp / "meg")  # loads numba (offsets check of > 4 Mi documents) once
        for _ in range(repeats):
            if IndexedDataset is not None:
                theirs.append(_seconds(lambda: IndexedDataset(str(tmp / "meg"))))
            shutil.rmtree(tmp / "cache", ignore_errors=True)
            ours.append(_seconds(lambda: mmpack.open(tmp / "meg")))
            cached.append(_seconds(lambda: mmpack.open(tmp / "meg")))
        for case, runs in (("first open", ours), ("reopen, cached offsets", cached)):
            row = {
                "case": f"megatron {case}, {seqs:,} sequences",
                "mmpack_s": float(np.median(runs)),
            }
            if theirs:
                row["reference_s"] = float(np.median(theirs))
                row["reference"] = "megatron-core IndexedDataset"
                row["ratio"] = row["mmpack_s"] / row["reference_s"]
            rows.append(row)

        flat = rng.integers(1, 50_000, flat_tokens, dtype=np.uint16)
        flat[rng.integers(0, flat_tokens, flat_tokens // 240)] = 0
        path = tmp / "flat.npy"
        flat.tofile(path)
        del flat
        time.sleep(INDEX_SETTLE_NS / 1e9)
        mmpack.open(tmp / "meg")  # warm numba's cache of the kernel before timing
        first, numpy_scan = [], []
        for _ in range(repeats):
            shutil.rmtree(tmp / "cache", ignore_errors=True)
            eos_offsets(np.zeros(1, np.uint16), 0)
            numpy_scan.append(
                _seconds(lambda: (np.memmap(path, dtype=np.uint16, mode="r") == 0).nonzero())
            )
            first.append(
                _seconds(lambda: mmpack.open(path, format="eos-separated", eos=0, dtype="uint16"))
            )
        cached = [
            _seconds(lambda: mmpack.open(path, format="eos-separated", eos=0, dtype="uint16"))
            for _ in range(repeats)
        ]
        rows.append(
            {
                "case": f"eos scan (first open), {flat_tokens:,} uint16 tokens",
                "mmpack_s": float(np.median(first)),
                "reference_s": float(np.median(numpy_scan)),
                "reference": "(np.memmap == eos).nonzero()",
                "ratio": float(np.median(first)) / float(np.median(numpy_scan)),
            }
        )
        rows.append(
            {"case": "eos-separated reopen (cached index)", "mmpack_s": float(np.median(cached))}
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("foreign formats", run(quick="--quick" in sys.argv))
