"""What ``--shuffle-docs`` costs a build: the same build with and without a keyed document order.

Corpus: the Python standard library's ``.py`` files (valid UTF-8).  Two cases, each timed in
alternating pairs (plain, shuffled) in one run, ratios the median of the pairs' ratios:

- ``mmpack.build`` of the files tokenized by a locally trained byte-level BPE of 8000 ids (one
  uint16 array per file, ``fsync=False``): the writer alone, where the extra pass shows most;
- ``ingest`` (what ``mmpack build "*.jsonl" -o STORE [--shuffle-docs SEED]`` runs) of the same
  texts written as JSON lines into 8 files, byte-level tokens, with its default ``fsync``.

Run ``python -m benchmarks.bench_shuffle_docs [--quick]``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _pairs(plain: Callable[[], None], shuffled: Callable[[], None], repeats: int):
    """Median seconds of each and the median of the per-pair ratios shuffled / plain."""
    a, b = [], []
    plain()
    shuffled()  # first-use costs (numba compile, page cache) paid before timing
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain()
        t1 = time.perf_counter()
        shuffled()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    ratios = [y / x for x, y in zip(a, b)]
    return float(np.median(a)), float(np.median(b)), float(np.median(ratios))


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    from benchmarks.bench_ingest import _texts
    from benchmarks.bench_store import _stdlib_corpus
    from mmpack import build
    from mmpack.ingest import ingest

    max_bytes = 8_000_000 if quick else 1 << 40
    docs, flat = _stdlib_corpus(max_bytes)
    texts = _texts(max_bytes)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-shuffle-"))
    rows: list[dict[str, Any]] = []
    try:
        files = []
        for k in range(8):
            path = tmp / f"in-{k}.jsonl"
            path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k::8]))
            files.append(str(path))
        cases = [
            (
                f"build(), {len(docs):,} tokenized files, {flat.size:,} uint16 tokens",
                lambda seed: build(
                    tmp / "b", docs, dtype=np.uint16, overwrite=True, fsync=False, shuffle_docs=seed
                ),
            ),
            (
                f"ingest (mmpack build), {len(texts):,} texts, byte-level",
                lambda seed: ingest(files, tmp / "i", overwrite=True, shuffle_docs=seed),
            ),
        ]
        for name, fn in cases:
            plain, shuffled, ratio = _pairs(lambda: fn(None), lambda: fn(7), repeats)
            rows.append(
                {
                    "case": name,
                    "plain s (median)": plain,
                    "--shuffle-docs s (median)": shuffled,
                    "ratio (median of pairs)": ratio,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("build with and without --shuffle-docs", run(quick="--quick" in sys.argv))
