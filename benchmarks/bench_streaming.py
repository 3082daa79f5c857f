"""Streaming packer vs the seed's linear-scan best fit, on the same lognormal stream.

Both packers see the same sequences (lengths ~ lognormal(mu=5.48, sigma=1.15), rounded, clipped to
``[1, seqlen]``, as int32 numpy arrays), the same buffer size and the same output shapes,
and neither masks (masking costs the same in both and is measured separately).  The baseline
re-implements the seed's ``GreedyBestFitSequencePacker._create_batch``: a deque buffer refilled
when it runs dry, one Python iteration per buffered sequence calling a numba ``find_best_fit``
that scans every row, a numpy slice copy per placed sequence, deferred sequences put back in
order.  It makes exactly the placement decisions of :class:`mmpack.StreamingPacker` (checked
below), so the packing efficiencies must agree; the throughput is the point.

Reported per shape: packing efficiency of each, sequences emitted per second (median of
``repeats`` timed runs after a warm-up run), and the speed-up; plus the StreamingPacker with MLM
masking (``mmpack._src.packing.masking``; the baseline does not mask), and fed from a memory-mapped TokenStore
(no Python call per document).  End to end, both packers must write the same ``int64`` output
(and the StreamingPacker also an ``int64`` attention mask), which bounds the speed-up; the
"placement only" rows time the decisions alone on the lengths (the seed's Python loop with
``find_best_fit`` vs one kernel call per batch), checked to be identical.  The rows of
:mod:`benchmarks.bench_streaming_floor` follow: end to end against the write-once floor
(8 x 2048, buffer 512), numpy arrays and Python lists.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import deque
from typing import Any

import numba
import numpy as np

from mmpack import StreamingPacker

MU, SIGMA = 5.48, 1.15


@numba.njit(cache=True)
def _find_best_fit(remaining_spaces, seq_len):
    valid = seq_len <= remaining_spaces
    if np.any(valid):
        sizes = remaining_spaces[valid]
        best = np.argmin(sizes)
        return np.arange(len(remaining_spaces))[valid][best]
    return -1


def linear_scan_batches(
    seqs, out_batch_size: int, out_pseq_len: int, buffer_size: int, pad_id: int = 0
):
    """The seed's greedy best fit (refill at sequence granularity, deferrals kept in order)."""
    source = iter(seqs)
    buffer: deque = deque()
    exhausted = False
    while True:
        batch = np.full((out_batch_size, out_pseq_len), pad_id, dtype=np.int64)
        seq_counts = np.zeros(out_batch_size, dtype=np.int32)
        cu = [[0] for _ in range(out_batch_size)]
        remaining = np.full(out_batch_size, out_pseq_len, dtype=np.int32)
        deferred = []
        while True:
            if not buffer:
                room = buffer_size - len(deferred)
                while room > 0 and not exhausted:
                    try:
                        buffer.append(next(source))
                        room -= 1
                    except StopIteration:
                        exhausted = True
                if not buffer:
                    break
            seq = buffer.popleft()
            n = len(seq)
            row = _find_best_fit(remaining, n)
            if row != -1:
                end = out_pseq_len - remaining[row]
                batch[row, end : end + n] = seq
                seq_counts[row] += 1
                remaining[row] -= n
                cu[row].append(cu[row][-1] + n)
            else:
                deferred.append(seq)
        buffer.extend(deferred)  # in order (the seed's extendleft reverses them)
        if not np.all(seq_counts > 0):
            return
        for x in cu:
            if x[-1] != out_pseq_len:
                x.append(out_pseq_len)
        yield batch, cu, int(seq_counts.sum()), int(out_pseq_len * out_batch_size - remaining.sum())


def seed_placement(lens: np.ndarray, R: int, P: int, buf: int, max_batches: int) -> list[int]:
    """Placement decisions only (no tokens): the seed's Python loop with ``find_best_fit``."""
    source = iter(lens.tolist())
    buffer: deque = deque()
    exhausted, rows_out = False, []
    for _ in range(max_batches):
        remaining = np.full(R, P, dtype=np.int32)
        deferred = []
        while True:
            if not buffer:
                room = buf - len(deferred)
                while room > 0 and not exhausted:
                    try:
                        buffer.append(next(source))
                        room -= 1
                    except StopIteration:
                        exhausted = True
                if not buffer:
                    break
            n = buffer.popleft()
            row = _find_best_fit(remaining, n)
            if row != -1:
                remaining[row] -= n
                rows_out.append(int(row))
            else:
                deferred.append(n)
        buffer.extend(deferred)
    return rows_out


def kernel_placement(lens: np.ndarray, R: int, P: int, buf: int, max_batches: int) -> list[int]:
    """Placement decisions only: mmpack's kernel, one call per batch over the held lengths."""
    from mmpack._src.kernels.plan_bestfit import place_batch, row_index

    bits, off = row_index(R, P)
    remaining = np.full(R, -1, dtype=np.int64)
    counts = np.zeros(R, dtype=np.int64)
    held = lens[:0]
    pos, placed_rows = 0, []
    out = np.empty((2, 2 * buf), dtype=np.int64)
    for _ in range(max_batches):
        processed = deferred = 0
        while True:  # the first call starts the batch (empty rows)
            k, d = place_batch(
                held[None], processed, held.shape[0], buf - deferred, bits, off, remaining,
                counts, P, R, out,
            )  # fmt: skip
            processed, deferred = k, deferred + d
            if deferred >= buf or processed < held.shape[0] or pos == lens.shape[0]:
                break
            take = lens[pos : pos + buf]
            pos += take.shape[0]
            held = np.concatenate([held, take])
            if out.shape[1] < held.shape[0]:
                out = np.concatenate([out, np.empty_like(out)], axis=1)
        rows = out[0, :processed]
        placed_rows.append(rows[rows >= 0])
        held = np.concatenate([held[:processed][rows < 0], held[processed:]])
    return np.concatenate(placed_rows).tolist()


def _stream(n: int, row_len: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.clip(np.round(rng.lognormal(MU, SIGMA, size=n)), 1, row_len).astype(np.int64)
    flat = rng.integers(1, 50000, size=int(lens.sum()), dtype=np.int32)
    return np.split(flat, np.cumsum(lens)[:-1])


def _timed(fn, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up (compilation, caches)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _run_linear(seqs, bs, P, buf, max_batches):
    n_seqs = n_tok = n_batches = 0
    for _batch, _cu, seqs_in_batch, tokens_in_batch in linear_scan_batches(seqs, bs, P, buf):
        n_batches += 1
        n_seqs += seqs_in_batch
        n_tok += tokens_in_batch
        if n_batches == max_batches:
            break
    return n_batches, n_seqs, n_tok


def _run_packer(source, bs, P, buf, max_batches, **kw):
    packer = StreamingPacker(source, batch_size=bs, seqlen=P, buffer_size=buf, **kw)
    n_batches = 0
    for _ in packer:
        n_batches += 1
        if n_batches == max_batches:
            break
    stats = packer.stats()
    return n_batches, stats.n_pieces, stats.n_tokens


def _check_same_placements(seqs, bs, P, buf, n_batches: int) -> None:
    ref = linear_scan_batches(seqs, bs, P, buf)
    packer = StreamingPacker(seqs, batch_size=bs, seqlen=P, buffer_size=buf)
    for _, (want, got) in zip(range(n_batches), zip(ref, packer)):
        assert np.array_equal(want[0], got["input_ids"]), "placements differ"
        assert [list(x) for x in want[1]] == [x.tolist() for x in got["cu_seqlens"]]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure both packers on two shapes; returns one row per (shape, packer)."""
    shapes = [
        # ModernBERT: global batch 512, micro batch 32, 1024 tokens -> 16 rows of 32768.
        {"name": "16x32768", "bs": 16, "P": 32768, "buf": 5120, "batches": 8 if quick else 40},
        {"name": "16x8192", "bs": 16, "P": 8192, "buf": 1024, "batches": 20 if quick else 150},
    ]
    repeats = 1 if quick else 5
    rows: list[dict[str, Any]] = []
    for sh in shapes:
        bs, P, buf, nb = sh["bs"], sh["P"], sh["buf"], sh["batches"]
        mean_len = float(np.exp(MU + SIGMA**2 / 2))
        n_seqs = int(nb * bs * P / mean_len * 1.1) + 3 * buf
        seqs = _stream(n_seqs, P)
        _check_same_placements(seqs, bs, P, buf, min(nb, 4))

        cases = {
            "linear-scan (seed)": lambda: _run_linear(seqs, bs, P, buf, nb),
            "StreamingPacker": lambda: _run_packer(seqs, bs, P, buf, nb),
            "StreamingPacker mlm": lambda: _run_packer(
                seqs, bs, P, buf, nb, mode="mlm", mask_id=4, vocab_size=50000
            ),
        }
        with tempfile.TemporaryDirectory() as tmp:
            store = None
            try:
                from mmpack import build

                store = build(f"{tmp}/store", seqs)
                cases["StreamingPacker, TokenStore"] = lambda store=store: _run_packer(
                    store, bs, P, buf, nb
                )
            except ImportError:  # pragma: no cover - the store is part of mmpack
                pass
            base = None
            for name, fn in cases.items():
                seconds, (n_batches, n_emitted, n_tok) = _timed(fn, repeats)
                rate = n_emitted / seconds
                base = rate if base is None else base
                rows.append(
                    {
                        "shape": sh["name"],
                        "buffer": buf,
                        "packer": name,
                        "batches": n_batches,
                        "efficiency": n_tok / (n_batches * bs * P),
                        "seqs_per_s": rate,
                        "speedup": rate / base,
                        "seconds": seconds,
                    }
                )
            cases.clear()
            store = None  # unmapped before the folder goes

        # Placement decisions alone (lengths only, no tokens): the algorithmic part.
        lens = np.array([len(x) for x in seqs], dtype=np.int64)
        assert seed_placement(lens, bs, P, buf, 3) == kernel_placement(lens, bs, P, buf, 3)
        base = None
        for name, fn in (
            ("placement only: seed loop", seed_placement),
            ("placement only: kernel", kernel_placement),
        ):
            seconds, placed = _timed(lambda fn=fn: fn(lens, bs, P, buf, nb), repeats)
            rate = len(placed) / seconds
            base = rate if base is None else base
            rows.append(
                {
                    "shape": sh["name"],
                    "buffer": buf,
                    "packer": name,
                    "batches": nb,
                    "efficiency": float("nan"),
                    "seqs_per_s": rate,
                    "speedup": rate / base,
                    "seconds": seconds,
                }
            )
    from benchmarks.bench_streaming_floor import run as run_floor

    return rows + run_floor(quick)  # end to end against the write-once floor (8 x 2048)


def main(argv: list[str]) -> None:
    from benchmarks.bench_streaming_floor import print_rows

    rows = run(quick="--quick" in argv)
    print_rows([r for r in rows if "shape" not in r])
    rows = [r for r in rows if "shape" in r]
    print(
        f"{'shape':>9} {'buffer':>6} {'packer':<28} {'batches':>7} {'efficiency':>10} "
        f"{'seqs/s':>11} {'speed-up':>8}"
    )
    for r in rows:
        print(
            f"{r['shape']:>9} {r['buffer']:>6} {r['packer']:<28} {r['batches']:>7} "
            f"{r['efficiency']:>10.5f} {r['seqs_per_s']:>11,.0f} {r['speedup']:>7.1f}x"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
