"""Loss masks: batched reads of a store with a per-token loss mask against the same tokens
without one.

Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens), uint16
tokens, each document's mask 0 on its first quarter (a prompt) and 1 on the rest; built twice,
with and without the mask.  Cases: random batches of 32 windows of 2048 tokens with labels
(``WindowDataset.__getitems__``) and of 32 packed rows of 2048 (``PackedDataset.__getitems__``),
masked vs plain timed alternately on the same indices, the median of the per-batch ratios
(target <= 1.3).

Run ``python -m benchmarks.bench_lossmask [--quick]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import mmpack
from benchmarks.bench_join import _docs, _paired_batches
from mmpack import WindowDataset

TARGET = 1.3


def _masked(docs: list[np.ndarray]):
    for d in docs:
        mask = np.ones(d.shape[0], dtype=np.uint8)
        mask[: d.shape[0] // 4] = 0
        yield {"input_ids": d, "loss_mask": mask}


def run(quick: bool = False) -> list[dict[str, Any]]:
    num_tokens = 5_000_000 if quick else 50_000_000
    docs = _docs(num_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-lossmask-"))
    rows: list[dict[str, Any]] = []
    try:
        plain = mmpack.build(tmp / "plain", docs, fsync=False)
        masked = mmpack.build(tmp / "masked", _masked(docs), fsync=False)
        rng = np.random.default_rng(1)
        for name, make in (
            ("windows 32x2048 + labels", lambda s: WindowDataset(s, 2048, eot=0, labels=True)),
            ("packed rows 32x2048", lambda s: mmpack.PackedDataset(s, 2048, eot=0)),
        ):
            a, b = make(masked), make(plain)
            batches = [rng.integers(0, len(a), 32) for _ in range(200 if quick else 1000)]
            for idx in batches[:20]:  # warm-up: kernels compiled, pages cached
                a.__getitems__(idx)
                b.__getitems__(idx)
            tm, tp, ratio = _paired_batches(a, b, batches)
            rows.append(
                {
                    "case": name,
                    "tokens": plain.num_tokens,
                    "masked ms/batch": tm * 1e3,
                    "plain ms/batch": tp * 1e3,
                    "masked / plain (median of pairs)": ratio,
                    "target": TARGET,
                    "met": ratio <= TARGET,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("lossmask", run(quick="--quick" in sys.argv))
