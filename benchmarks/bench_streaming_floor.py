"""The streaming packer end to end against the write-once floor and ModernBERT's packer.

One stream, the issue's setup: 30,000 sequences with lengths ~ lognormal(5.48, 1.15) clipped to
``[1, 2048]`` (12.6M tokens), packed into batches of 8 rows of 2048 with a buffer of 512, given
first as int32 numpy arrays, then as Python lists (what Hugging Face tokenizers return).  Timed
side by side in one run, interleaved, after a warm-up (compilation excluded); medians of
``repeats`` runs, in wall-clock seconds and in CPU seconds of the thread (the latter is what a
shared, loaded machine measures best; ratios are taken to the floor of the same clock).

- **floor (write-once)**: a plain Python loop that writes every sequence once into fresh int64
  ``(8, 2048)`` batches (next fit: no placement decision, no attention mask, no ``cu_seqlens``);
  for lists, the list-to-array conversion is part of the floor, either one ``np.array`` per
  sequence, or one ``np.fromiter`` per incoming batch of 512 sequences.
- **StreamingPacker**: ``mmpack.StreamingPacker`` end to end (best fit, ``input_ids``,
  ``attention_mask``, ``cu_seqlens``, ``max_seqlen``), its efficiency printed.
- **ModernBERT's packer**: the seed's ``GreedyBestFitSequencePacker._create_batch`` as
  re-implemented in :mod:`benchmarks.bench_streaming` (same placements), on the same input.

Run: ``python -m benchmarks.bench_streaming_floor`` (also part of ``python -m benchmarks
streaming``); ``--quick`` runs a 6,000-sequence stream once.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.timing import load_average
from mmpack import StreamingPacker

ROWS, ROW_LEN, BUFFER, INCOMING = 8, 2048, 512, 512


def floor_arrays(seqs: list[Any]) -> int:
    """Write every sequence once into fresh int64 (ROWS, ROW_LEN) batches; returns batches."""
    batch = np.empty((ROWS, ROW_LEN), dtype=np.int64)
    r = c = n_batches = 0
    for s in seqs:
        n = len(s)
        if c + n > ROW_LEN:
            r, c = r + 1, 0
            if r == ROWS:
                n_batches += 1
                batch = np.empty((ROWS, ROW_LEN), dtype=np.int64)
                r = 0
        batch[r, c : c + n] = s
        c += n
    return n_batches


def floor_lists_per_sequence(seqs: list[list[int]]) -> int:
    """The write-once floor, each list converted by its own ``np.array``."""
    return floor_arrays([np.array(s) for s in seqs])


def floor_lists_per_batch(seqs: list[list[int]]) -> int:
    """The write-once floor, each incoming batch of lists converted by one ``np.fromiter``."""
    views: list[np.ndarray] = []
    for i in range(0, len(seqs), INCOMING):
        chunk = seqs[i : i + INCOMING]
        lens = [len(s) for s in chunk]
        flat = np.fromiter(itertools.chain.from_iterable(chunk), np.int64, sum(lens))
        ends = list(itertools.accumulate(lens))
        views += [flat[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    return floor_arrays(views)


def packer(seqs: list[Any]) -> int:
    p = StreamingPacker(seqs, batch_size=ROWS, seqlen=ROW_LEN, buffer_size=BUFFER)
    return sum(1 for _ in p)


def modernbert(seqs: list[Any]) -> int:
    from benchmarks.bench_streaming import linear_scan_batches

    return sum(1 for _ in linear_scan_batches(seqs, ROWS, ROW_LEN, BUFFER))


def _interleaved(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Wall and thread-CPU seconds of each case: warm-up, then ``repeats`` interleaved rounds."""
    for fn in cases.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu[name].append(time.thread_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {k: [statistics.median(wall[k]), statistics.median(cpu[k])] for k in cases}


def run(quick: bool = False) -> list[dict[str, Any]]:
    from benchmarks.bench_streaming import _stream

    n_seqs, repeats = (6000, 3) if quick else (30000, 11)
    arrays = _stream(n_seqs, ROW_LEN)
    lists = [a.tolist() for a in arrays]
    p = StreamingPacker(arrays, batch_size=ROWS, seqlen=ROW_LEN, buffer_size=BUFFER)
    n_batches = sum(1 for _ in p)
    efficiency = p.stats().efficiency
    rows: list[dict[str, Any]] = []
    for kind, seqs, floors in (
        ("numpy", arrays, {"floor (write-once)": floor_arrays}),
        (
            "lists",
            lists,
            {
                "floor: np.array per list": floor_lists_per_sequence,
                "floor: np.fromiter per batch": floor_lists_per_batch,
            },
        ),
    ):
        cases = {name: (lambda f=f: f(seqs)) for name, f in floors.items()}
        cases["StreamingPacker"] = lambda: packer(seqs)
        cases["ModernBERT's packer"] = lambda: modernbert(seqs)
        got = _interleaved(cases, repeats)
        base_wall, base_cpu = got[next(iter(floors))]
        mb_wall, mb_cpu = got["ModernBERT's packer"]
        for name, (wall, cpu) in got.items():
            row: dict[str, Any] = {
                "input": kind,
                "case": name,
                "seqs": n_seqs,
                "seconds": wall,
                "cpu_seconds": cpu,
                "x_floor": wall / base_wall,
                "x_floor_cpu": cpu / base_cpu,
                "modernbert_over_this_cpu": mb_cpu / cpu,
            }
            if name == "StreamingPacker":
                row["batches"] = n_batches
                row["efficiency"] = efficiency
                if kind == "numpy":
                    row["target"] = "<= 1.5x floor, >= 3x ModernBERT"
                    row["met"] = cpu <= 1.5 * base_cpu and mb_cpu >= 3 * cpu
                else:
                    row["target"] = "<= ModernBERT (lists)"
                    row["met"] = cpu <= mb_cpu
            rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"load average {load_average()}; medians; ratios to the first floor of each input")
    print(
        f"{'input':<6} {'case':<30} {'wall s':>8} {'x floor':>8} {'cpu s':>8} {'x floor':>8} "
        f"{'MB/this':>8}"
    )
    for r in rows:
        print(
            f"{r['input']:<6} {r['case']:<30} {r['seconds']:>8.4f} {r['x_floor']:>8.2f} "
            f"{r['cpu_seconds']:>8.4f} {r['x_floor_cpu']:>8.2f} "
            f"{r['modernbert_over_this_cpu']:>8.2f}"
            + (f"  efficiency {r['efficiency']:.4f}" if "efficiency" in r else "")
        )


def main(argv: list[str]) -> None:
    print_rows(run(quick="--quick" in argv))


if __name__ == "__main__":
    main(sys.argv[1:])
