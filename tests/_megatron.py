"""Helpers for the tests that run the real megatron-core (installed with the CPU torch pin):
its imports (quieted) and datasets built with its own ``IndexedDatasetBuilder``."""

from __future__ import annotations

import warnings

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from megatron.core.datasets import gpt_dataset
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import (
        IndexedDataset,
        IndexedDatasetBuilder,
    )
    from megatron.core.datasets.utils import Split

__all__ = [
    "GPTDataset",
    "IndexedDataset",
    "Split",
    "build_megatron",
    "gpt_config",
    "gpt_dataset",
    "random_docs",
]


def random_docs(
    rng: np.random.Generator, n: int, vocab: int, max_len: int = 60
) -> list[np.ndarray]:
    """``n`` documents of random length in ``[0, max_len)`` (some empty) over ``[0, vocab)``."""
    return [rng.integers(0, vocab, int(rng.integers(0, max_len))) for _ in range(n)]


def build_megatron(prefix, docs, dtype=np.int32, split: bool = False) -> str:
    """Write ``docs`` with Megatron's builder: one sequence per document, or with ``split`` each
    document cut into up to three "sentences" (``preprocess_data.py --split-sentences``)."""
    prefix = str(prefix)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d in docs:
        if split and d.size >= 3:
            cuts = [d.size // 3, d.size // 3, d.size - 2 * (d.size // 3)]
            b.add_document(torch.from_numpy(np.asarray(d)), cuts)
        else:
            b.add_item(torch.from_numpy(np.asarray(d).astype(np.int64)))
            b.end_document()
    b.finalize(prefix + ".idx")
    return prefix


class _Tokenizer:
    """The few attributes GPTDataset reads from a tokenizer."""

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab
        self.eod = vocab - 1
        self.pad = vocab - 2  # never produced by random_docs(vocab - 2)
        self.unique_identifiers = {"class": "TestTokenizer", "vocab": vocab}


def gpt_config(seqlen: int, vocab: int, cache) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=seqlen,
        blend=None,
        split="1,0,0",
        path_to_cache=str(cache),
        tokenizer=_Tokenizer(vocab),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
