"""What the block-window order costs in model quality: a tiny causal LM trained with the global
order and with the block order, on a store written in source order and on one built with
``shuffle_docs``, its held-out loss compared.

Corpus: the standard library's ``.py`` files (each cut to its first 4 KiB), sorted by path, so
that neighbouring documents come from one package, as in real corpora grouped by source; byte
tokens (0-255, eot 256).  One file in 20 (chosen by a hash of its path) is held out.  Two stores
of the training files: in path order, and ``build(..., shuffle_docs=0)`` (the documents in a keyed
order).  Windows of 128 tokens; the block order over ``view.block_bounds(64 KiB)`` (blocks of
~500 windows) with 16 blocks per window, so that a run of ``STEPS`` batches of 32 sees a few
windows of a store of ~150 blocks (what a large corpus's first epoch looks like at the defaults:
a run stands in a small part of the epoch's windows at any time).

Model: 2 layers, d = 64, 4 heads, causal self-attention, learned positions, AdamW (lr 3e-3),
``STEPS`` steps, torch on CPU in one thread, the same seed for the model and the sampler in every
configuration.  Loss: mean next-byte cross-entropy over 64 fixed held-out windows (nats).
Reported per configuration: the median over ``SEEDS`` seeds, and each seed's.

Run: ``python -m benchmarks.bench_order_quality`` (``--quick``: one seed, half the steps).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SEQLEN = 128
BATCH = 32
STEPS = 300
SEEDS = (0, 1, 2)
STRIPE_BYTES = 64 << 10
WINDOW_BLOCKS = 16
EOT = 256


def _corpus() -> tuple[list[np.ndarray], list[np.ndarray]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()[:4096]
        except OSError:
            continue
        if not data:
            continue
        doc = np.frombuffer(data, np.uint8).astype(np.uint16)
        key = hashlib.blake2b(str(path.relative_to(root)).encode(), digest_size=2).digest()
        (held if int.from_bytes(key, "little") % 20 == 0 else train).append(doc)
    return train, held


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = 64
            self.tok = nn.Embedding(EOT + 1, d)
            self.pos = nn.Embedding(SEQLEN, d)
            layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 2)
            self.head = nn.Linear(d, EOT + 1)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQLEN))

        def forward(self, x: Any) -> Any:
            h = self.tok(x) + self.pos.weight[: x.shape[1]]
            n = x.shape[1]
            return self.head(self.body(h, mask=self.mask[:n, :n], is_causal=True))

    return LM()


def _loss(model: Any, x: Any) -> Any:
    import torch.nn.functional as F

    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def _train(store: Any, shuffle: Any, seed: int, held: Any, steps: int) -> float:
    import torch

    import mmpack
    from mmpack import ResumableSampler

    view = mmpack.WindowDataset(store, SEQLEN, eot=EOT)
    extra = {}
    if shuffle == "blocks":
        extra = dict(block_bounds=view.block_bounds(STRIPE_BYTES), window_blocks=WINDOW_BLOCKS)
    sampler = ResumableSampler(len(view), shuffle=shuffle, seed=seed, **extra)
    order = np.fromiter(iter(sampler), np.int64, count=steps * BATCH)
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for k in range(steps):
        rows = view.__getitems__(order[k * BATCH : (k + 1) * BATCH]).columns["input_ids"]
        loss = _loss(model, torch.as_tensor(np.asarray(rows, np.int64)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(_loss(model, held))


def run(quick: bool = False) -> list[dict[str, Any]]:
    import torch

    import mmpack

    torch.set_num_threads(1)
    steps = STEPS // 2 if quick else STEPS
    train, held_docs = _corpus()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-quality-") as tmp_name:
        tmp = Path(tmp_name)
        stores = {
            "source order": mmpack.build(tmp / "plain", train),
            "shuffle_docs": mmpack.build(tmp / "shuffled", train, shuffle_docs=0),
        }
        hv = mmpack.WindowDataset(mmpack.build(tmp / "held", held_docs), SEQLEN, eot=EOT)
        pick = np.random.default_rng(0).choice(len(hv), size=64, replace=False)
        held = torch.as_tensor(np.asarray(hv.__getitems__(pick).columns["input_ids"], np.int64))
        n_blocks = (
            len(mmpack.WindowDataset(stores["source order"], SEQLEN).block_bounds(STRIPE_BYTES)) - 1
        )
        rows.append(
            {
                "case": f"corpus: {len(train)} files, {stores['source order'].num_tokens / 1e6:.1f}M "
                f"byte tokens, {n_blocks} blocks of {STRIPE_BYTES >> 10} KiB, {WINDOW_BLOCKS} per "
                f"window; {steps} steps of {BATCH} x {SEQLEN}"
            }
        )
        for store_name, store in stores.items():
            for shuffle in (True, "blocks"):
                t0 = time.perf_counter()
                losses = [
                    _train(store, shuffle, s, held, steps) for s in SEEDS[: 1 if quick else None]
                ]
                rows.append(
                    {
                        "case": f"{store_name}, {'global' if shuffle is True else 'block'} order",
                        "steps": steps,
                        "held-out loss (median)": float(np.median(losses)),
                        "per seed": " / ".join(f"{x:.3f}" for x in losses),
                        "s": time.perf_counter() - t0,
                    }
                )
                print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("order quality: held-out loss", run(quick="--quick" in sys.argv))
