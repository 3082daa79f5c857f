"""End to end: tokens/s a ``torch.utils.data.DataLoader`` delivers to the training loop.

The packed view (causal and MLM) and the window view, batch 32 x 2048, shuffled by
``ResumableSampler``, collated by ``mmpack.torch.collate``, with 0 and 2 worker processes, on a
C4-like store (lognormal(5.48, 1.15) lengths).  Compared with what a GPU consumes: ~17k tokens/s
for a 7B model on one H100 (NeMo's published figure) and ~0.4M tokens/s for a 124M model: the
ratio column says how many GPUs' worth of data one loader feeds.

Run ``python -m benchmarks.bench_e2e [--quick]``.

``--workers`` measures what DataLoader workers cost with the default path: the packed causal view
through a plain ``DataLoader`` with ``collate`` (int64; in a worker it ships its batches through
reused shared buffers, :mod:`mmpack._src.torch.transfer`) at 0, 1 and 2 workers, ``Collator(dtype=
torch.int32)`` at 2 workers, and ``mmpack.torch.loader`` with its defaults (0 workers) and with 2
workers, next to the *naive floor*: a collate that only allocates three fresh int64 (32, 2048)
tensors per batch, through the same sampler and 2 workers (what torch's own transfer costs).  The
cases run interleaved, ``--reps`` times (default 3); the table gives medians and the ratio of
medians to the floor (target: the 2-worker default paths >= 2x).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from mmpack import PackedDataset, ResumableSampler, WindowDataset
from mmpack.store import StoreWriter
from mmpack.torch import collate

BATCH, SEQLEN, EOT = 32, 2048, 50256
GPU_7B = 17_000
GPU_124M = 400_000


def _make_store(path: Path, n_docs: int):
    rng = np.random.default_rng(0)
    lens = np.maximum(rng.lognormal(5.48, 1.15, size=n_docs).astype(np.int64), 1)
    with StoreWriter(path, dtype=np.uint16, fsync=False) as w:
        tokens = rng.integers(0, 50000, size=int(lens.sum()), dtype=np.uint16)
        w.add_batch(tokens, lens)
    return w.store


def _tokens_per_second(ds, workers: int, batches: int, collate_fn=collate) -> float:
    return _tokens_per_second_with(ds, workers, batches, collate_fn)


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-e2e-"))
    rows: list[dict[str, Any]] = []
    try:
        store = _make_store(tmp / "s", 100_000 if quick else 1_000_000)
        views = {
            "packed causal": PackedDataset(store, SEQLEN, eot=EOT, pad_id=EOT + 1),
            "packed mlm": PackedDataset(
                store,
                SEQLEN,
                eot=EOT,
                pad_id=EOT + 1,
                mode="mlm",
                mask_id=EOT + 2,
                vocab_size=EOT + 3,
            ),
            "window": WindowDataset(store, SEQLEN, eot=EOT, labels=True),
        }
        batches = 20 if quick else 200
        for name, ds in views.items():
            for workers in (0, 2):
                tps = _tokens_per_second(ds, workers, batches)
                rows.append(
                    {
                        "case": f"{name}, {workers} workers",
                        "Mtok/s": tps / 1e6,
                        "x 7B GPU (17k tok/s)": tps / GPU_7B,
                        "x 124M GPU (0.4M tok/s)": tps / GPU_124M,
                        "target": "never the bottleneck (> 1x)",
                        "met": tps > GPU_124M,
                    }
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


class _FreshTensors:
    """The naive floor: three fresh int64 (B, SEQLEN) tensors per batch, whatever the samples."""

    def __call__(self, samples):
        import torch

        return {
            k: torch.zeros(len(samples), SEQLEN, dtype=torch.int64)
            for k in ("input_ids", "labels", "position_ids")
        }


def _tokens_per_second_with(ds, workers: int, batches: int, collate_fn) -> float:
    sampler = ResumableSampler(len(ds), seed=0)
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
    )
    return _drain(loader, batches)


def _drain(loader, batches: int) -> float:
    it = iter(loader)
    for _ in range(3):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        int(batch["input_ids"][0, 0])  # the loop reads the batch
    elapsed = time.perf_counter() - t0
    del it, loader, batch
    return batches * BATCH * SEQLEN / elapsed


def _loader_tokens_per_second(ds, workers: int | None, batches: int) -> float:
    import mmpack.torch

    options = {} if workers is None else {"num_workers": workers}
    return _drain(mmpack.torch.loader(ds, BATCH, **options), batches)


def run_workers(quick: bool = False, reps: int = 3) -> list[dict[str, Any]]:
    import torch

    from mmpack.torch import Collator

    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-workers-"))
    try:
        store = _make_store(tmp / "s", 50_000 if quick else 200_000)
        ds = PackedDataset(store, SEQLEN, eot=EOT, pad_id=EOT + 1)
        floor_case = "naive floor (3 fresh int64 tensors), 2 workers"
        cases = [(floor_case, lambda n: _tokens_per_second_with(ds, 2, n, _FreshTensors()))]
        cases += [
            (
                f"collate int64, {w} workers",
                lambda n, w=w: _tokens_per_second_with(ds, w, n, collate),
            )
            for w in (0, 1, 2)
        ]
        int32 = Collator(dtype=torch.int32)
        cases += [
            ("Collator int32, 2 workers", lambda n: _tokens_per_second_with(ds, 2, n, int32)),
            ("loader(), defaults (0 workers)", lambda n: _loader_tokens_per_second(ds, None, n)),
            ("loader(num_workers=2)", lambda n: _loader_tokens_per_second(ds, 2, n)),
        ]
        batches = 30 if quick else 100
        figures: dict[str, list[float]] = {name: [] for name, _ in cases}
        for _ in range(reps):
            for name, measure in cases:
                figures[name].append(measure(batches))
        floor = float(np.median(figures[floor_case]))
        rows = []
        for name, _ in cases:
            med = float(np.median(figures[name]))
            row: dict[str, Any] = {
                "case": name,
                "Mtok/s (median)": med / 1e6,
                "runs": " ".join(f"{x / 1e6:.0f}" for x in figures[name]),
                "x floor": med / floor,
            }
            if name in ("collate int64, 2 workers", "loader(num_workers=2)"):
                row.update(target=">= 2x floor", met=med / floor >= 2)
            rows.append(row)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    if "--workers" in sys.argv:
        reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 3
        print_table("DataLoader workers", run_workers(quick="--quick" in sys.argv, reps=reps))
    else:
        print_table("end to end", run(quick="--quick" in sys.argv))
