"""Hugging Face collators: cost per batch and DataLoader throughput with 2 workers.

Cases, on a C4-like store (lognormal(5.48, 1.15) document lengths), rows of ``B x seqlen``:

* ``hf_inputs(collate(s), "sdpa")``: the dense ``(B, 1, seqlen, seqlen)`` mask made in the
  collator (in a DataLoader worker, then through shared memory);
* ``DataCollator("sdpa")`` (causal: the mask is made by transformers on the model's device) and
  ``DataCollator("sdpa", causal=False)`` (masked LM: made by the collator's hook on the model);
* ``DataCollator("flash_attention_2")``: the flat varlen layout;
* ``collate`` itself (not a model's inputs), for scale;
* transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``, the same flat
  layout from per-document samples (a dataset of the store's documents, as many per batch as a
  packed batch holds on average): the comparable case for the flash layout.  The sdpa layout
  has no counterpart in transformers (its flattening collator gives one row, no mask).

"per batch": median seconds of one call in this process on fixed samples (the samples' reading
is not counted).  "2 workers": tokens per second a ``DataLoader(num_workers=2)`` delivers to a
loop that touches each batch, shuffled by ``ResumableSampler``; the cases run interleaved,
``reps`` times, medians given.  Ratios are against ``DataCollatorWithFlattening`` per token.

Run ``python -m benchmarks.bench_hf [--quick]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from benchmarks.bench_e2e import _make_store
from benchmarks.timing import per_call_seconds
from mmpack import PackedDataset, ResumableSampler
from mmpack.torch import DataCollator, collate, hf_inputs

EOT = 50256


class _Documents(torch.utils.data.Dataset):
    """The store's documents as ``{"input_ids": array}`` samples (DataCollatorWithFlattening's)."""

    def __init__(self, store) -> None:
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": np.asarray(self.store[int(i)], dtype=np.int64)}


class _DenseMask:
    """The collator a user writes from hf_inputs: the dense mask is made in the worker."""

    def __call__(self, samples):
        return hf_inputs(collate(samples), "sdpa")


class _Encoder(torch.nn.Module):
    """A stand-in model to attach the masked-LM collator's hook to (never run here)."""


def _tokens(batch: dict[str, Any]) -> int:
    return int(batch["input_ids"].numel())


def _throughput(ds, batch_size: int, collate_fn, batches: int) -> float:
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=ResumableSampler(len(ds), seed=0),
        num_workers=2,
        collate_fn=collate_fn,
        persistent_workers=True,
        prefetch_factor=4,
    )
    it = iter(loader)
    for _ in range(3):
        next(it)
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        tokens += _tokens(batch)
        int(batch["input_ids"].view(-1)[0])  # the loop reads the batch
    elapsed = time.perf_counter() - t0
    del it, loader, batch
    return tokens / elapsed


def _cases(store, rows: int, seqlen: int):
    from transformers import DataCollatorWithFlattening

    causal = PackedDataset(store, seqlen, eot=EOT, pad_id=EOT + 1)
    mlm = PackedDataset(
        store, seqlen, eot=EOT, pad_id=EOT + 1, mode="mlm", mask_id=EOT + 2, vocab_size=EOT + 3
    )
    docs = _Documents(store)
    per_batch = max(1, round(rows * seqlen / float(np.mean(store.doc_lens))))
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    return [
        ("collate (mmpack's batch, for scale)", "-", causal, rows, collate),
        ("hf_inputs(collate(s), 'sdpa') (dense mask)", "sdpa", causal, rows, _DenseMask()),
        ("DataCollator('sdpa')", "sdpa", causal, rows, DataCollator("sdpa")),
        (
            "DataCollator('sdpa', causal=False)",
            "sdpa",
            mlm,
            rows,
            DataCollator("sdpa", causal=False, model=_Encoder()),
        ),
        (
            "DataCollator('flash_attention_2')",
            "flash",
            causal,
            rows,
            DataCollator("flash_attention_2"),
        ),
        ("transformers DataCollatorWithFlattening", "flash", docs, per_batch, flat),
    ]


def run(quick: bool = False, reps: int = 3) -> list[dict[str, Any]]:
    rows_per_batch, seqlen = (8, 512) if quick else (8, 2048)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-hf-"))
    try:
        store = _make_store(tmp / "s", 20_000 if quick else 100_000)
        cases = _cases(store, rows_per_batch, seqlen)
        cost: dict[str, float] = {}
        tokens: dict[str, int] = {}
        for name, _, ds, size, fn in cases:
            samples = [ds[i] for i in range(size)]
            tokens[name] = _tokens(fn(samples))
            cost[name] = float(np.median(per_call_seconds(lambda: fn(samples), 5 if quick else 20)))
        batches = 20 if quick else 60
        figures: dict[str, list[float]] = {name: [] for name, *_ in cases}
        for _ in range(reps):
            for name, _, ds, size, fn in cases:
                figures[name].append(_throughput(ds, size, fn, batches))
        ref = cases[-1][0]
        ref_cost = cost[ref] / tokens[ref]
        ref_tps = float(np.median(figures[ref]))
        out = []
        for name, layout, *_ in cases:
            tps = float(np.median(figures[name]))
            out.append(
                {
                    "case": name,
                    "layout": layout,
                    "tokens/batch": tokens[name],
                    "ms/batch": cost[name] * 1e3,
                    "ns/token": cost[name] / tokens[name] * 1e9,
                    "cost x flattening": cost[name] / tokens[name] / ref_cost,
                    "2 workers Mtok/s (median)": tps / 1e6,
                    "runs": " ".join(f"{x / 1e6:.1f}" for x in figures[name]),
                    "throughput x flattening": tps / ref_tps,
                }
            )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 3
    print_table("Hugging Face collators", run(quick="--quick" in sys.argv, reps=reps))
