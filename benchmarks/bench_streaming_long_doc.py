"""StreamingPacker per-batch time on one long document vs the same tokens as short documents.

One document of ``2**26`` tokens (int32 numpy array) split by ``long_docs="split"`` into
``2**20`` pieces of ``seqlen = 64``, against the same tokens as ``2**20`` documents of 64
tokens (views of the same array); 16 rows per batch, ``buffer_size=512``.  Pieces are admitted
lazily, so both must cost the same per batch (the ratio is the point: admitting every piece of
the long document at once would copy the held pieces at every batch).

Run: ``PYTHONPATH=. python benchmarks/bench_streaming_long_doc.py [batches]``; prints the median
and p99 per-batch time of each (over ``batches`` batches after 50 warm-up batches) and the
ratio long / short.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from mmpack import StreamingPacker

TOKENS = 2**26
P = 64


def per_batch(source, batches: int) -> np.ndarray:
    packer = StreamingPacker(source, batch_size=16, seqlen=P, buffer_size=512)
    it = iter(packer)
    t_first = time.perf_counter()
    for _ in itertools.islice(it, 50):  # warm-up (and the first batch's admission)
        pass
    first = time.perf_counter() - t_first
    out = np.empty(batches)
    for k in range(batches):
        t0 = time.perf_counter()
        next(it)
        out[k] = time.perf_counter() - t0
    print(f"    first 50 batches {first * 1e3:.1f} ms, pieces held {packer.stats().n_held}")
    return out


def main(batches: int = 2000) -> None:
    doc = (np.arange(TOKENS, dtype=np.int64) % 50_000 + 1).astype(np.int32)
    short = [doc[a : a + P] for a in range(0, TOKENS, P)]
    results = {}
    for name, source in (("one 2**26-token document", [doc]), ("2**20 documents of 64", short)):
        print(name)
        t = per_batch(source, batches)
        results[name] = t
        print(
            f"    per batch: median {np.median(t) * 1e3:.3f} ms, p99 {np.percentile(t, 99) * 1e3:.3f} ms"
        )
    long_t, short_t = (np.median(v) for v in results.values())
    print(f"ratio long / short (median per batch): {long_t / short_t:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
