"""megatron-core's GPTDataset order: building its three indices, mmpack against megatron-core.

One synthetic Megatron dataset (``.idx`` of S sequences of 1..64 tokens, mean 32.5, over a sparse
``.bin``: building the order reads no token), ``num_samples`` samples of 64 tokens asked for
(two epochs).  Cases, each the median of 5 runs, alternating with megatron-core's
``GPTDataset(...)`` construction (its document, sample and shuffle index; no cache path, so
nothing is written):

- ``build_order``: the three arrays alone (:func:`mmpack.formats.build_order`);
- ``MegatronGPTDataset, uncached``: the view, i.e. the ``.idx`` validated again plus the order;
- ``MegatronGPTDataset, cached``: a second view of the same parameters (the order's file
  mapped and its digests and ranges checked: what each DataLoader worker pays);
- ``batch of 64``: random samples, one ``__getitems__`` against 64 ``GPTDataset[i]`` calls
  (``create_attention_mask=False``), per sample (tokens of the sparse file: zero pages).

Run ``python -m benchmarks.bench_megatron_order [--quick]``.
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
from mmpack._src.formats.megatron import MAGIC
from mmpack.formats import MegatronGPTDataset, build_order

SEQLEN = 64
SEED = 1234


class _Tokenizer:
    """The attributes GPTDataset reads from a tokenizer."""

    vocab_size = 50_000
    eod = 49_999
    unique_identifiers = {"class": "BenchTokenizer"}


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
        f.truncate(int(lens.sum()) * 4)  # sparse


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _megatron(prefix: Path, num_samples: int, create_attention_mask: bool = True) -> Any:
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    cfg = GPTDatasetConfig(
        random_seed=SEED,
        sequence_length=SEQLEN,
        blend=None,
        split="1,0,0",
        path_to_cache=None,
        tokenizer=_Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=create_attention_mask,
    )
    ds = IndexedDataset(str(prefix))
    indices = np.arange(len(ds.sequence_lengths), dtype=np.int32)
    return GPTDataset(ds, str(prefix), indices, num_samples, Split.train, cfg)


def run(quick: bool = False) -> list[dict[str, Any]]:
    seqs = 100_000 if quick else 1_000_000
    num_samples = seqs
    repeats = 5
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-megatron-order-"))
    os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache")
    rows: list[dict[str, Any]] = []
    try:
        import logging

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core.datasets.gpt_dataset  # noqa: F401
        logging.getLogger("megatron").setLevel(logging.ERROR)
        lens = np.random.default_rng(0).integers(1, 65, seqs).astype(np.int32)
        prefix = tmp / "meg"
        _write_megatron(prefix, lens)
        store = mmpack.open(prefix)
        sizes = np.asarray(lens)
        everything = np.arange(seqs, dtype=np.int32)
        order = build_order(sizes, everything, SEQLEN, seed=SEED, num_samples=num_samples)
        view = MegatronGPTDataset(store, SEQLEN, seed=SEED, num_samples=num_samples, cache=False)
        view.__getitems__(np.arange(4))  # compile the kernels before timing
        theirs, ours, uncached, cached = [], [], [], []
        for _ in range(repeats):
            theirs.append(_seconds(lambda: _megatron(prefix, num_samples)))
            ours.append(
                _seconds(
                    lambda: build_order(
                        sizes, everything, SEQLEN, seed=SEED, num_samples=num_samples
                    )
                )
            )
            uncached.append(
                _seconds(
                    lambda: MegatronGPTDataset(
                        store, SEQLEN, seed=SEED, num_samples=num_samples, cache=False
                    )
                )
            )
            MegatronGPTDataset(store, SEQLEN, seed=SEED, num_samples=num_samples)  # writes it
            cached.append(
                _seconds(
                    lambda: MegatronGPTDataset(store, SEQLEN, seed=SEED, num_samples=num_samples)
                )
            )
        ref = float(np.median(theirs))
        what = (
            f"{seqs:,} sequences, {num_samples:,} samples of {SEQLEN} asked, "
            f"{len(order):,} built, {order.num_epochs} epochs"
        )
        for case, runs in (
            ("build_order", ours),
            ("MegatronGPTDataset, uncached", uncached),
            ("MegatronGPTDataset, cached", cached),
        ):
            med = float(np.median(runs))
            rows.append(
                {
                    "case": f"{case}: {what}",
                    "mmpack_s": med,
                    "reference_s": ref,
                    "reference": "megatron-core GPTDataset(...)",
                    "ratio": med / ref,
                }
            )
        rows.append(_serving(prefix, view, num_samples, repeats))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _serving(prefix: Path, view: MegatronGPTDataset, num_samples: int, repeats: int) -> dict:
    gpt = _megatron(prefix, num_samples, create_attention_mask=False)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, len(view), 64) for _ in range(repeats * 4)]
    ours, theirs = [], []
    for b in batches:
        theirs.append(_seconds(lambda: [gpt[int(i)] for i in b]) / 64)
        ours.append(_seconds(lambda: view.__getitems__(b)) / 64)
    med, ref = float(np.median(ours)), float(np.median(theirs))
    return {
        "case": f"batch of 64 random samples of {SEQLEN} tokens, per sample",
        "mmpack_s": med,
        "reference_s": ref,
        "reference": "megatron-core GPTDataset[i]",
        "ratio": med / ref,
    }


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("megatron order", run(quick="--quick" in sys.argv))
