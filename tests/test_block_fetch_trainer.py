"""One fetch per block through Hugging Face ``Trainer`` (the recipe of docs/guide/torch.md: a
``Trainer`` whose ``_get_train_sampler`` returns a block-order ``ResumableSampler``) over a view
of a real S3 server (SeaweedFS, ``tests/_s3.py``) behind the counting proxy: accelerate's
DataLoader iterates the sampler, so the sampler drives the whole-block fetch; over two epochs
the model sees the local store's batches in the same order, each block is fetched once per
epoch in whole parts, the node cache holds two windows at most and readers (the workers
included) fetch (almost) nothing of their own.  A tiny Llama built from a config
(``tests/test_hf_trainer.py``), nothing downloaded.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/test_block_fetch_trainer.py``.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from _block_fetch import _two_epochs, assert_each_block_once
from _remote_stores import _build_with_page, _corpus, _url
from _s3 import DelayProxy, isolate_cache_and_env
from _trainer import EOT, _args, _model

import mmpack
from mmpack import ResumableSampler
from mmpack.torch import DataCollator, collate

SEQLEN = 64
CHECK = 4096  # the store's check pages (one-byte tokens: 64 samples), the smallest allowed
BLOCK = 2 * CHECK  # bytes per sample block (view.block_bounds)
W = 2  # blocks per window (16 steps)
PART = CHECK  # two parts per block
B = 16
SEED = 42  # TrainingArguments' default seed: the sampler's key


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def stores(s3_server, tmp_path_factory):
    docs = [d % 90 + 1 for d in _corpus(n_docs=280, seed=7)]  # the tiny model's vocabulary
    remote = _build_with_page(_url(), docs, s3_server.options, CHECK)
    local = mmpack.build(tmp_path_factory.mktemp("local") / "s", docs)
    return remote, local


def _sampler(view):
    return ResumableSampler(
        view, shuffle="blocks", block_bounds=view.block_bounds(BLOCK), window_blocks=W, seed=SEED
    )


class BlockTrainer(transformers.Trainer):
    """The recipe: the training order of a block-order ResumableSampler over the view."""

    def _get_train_sampler(self, train_dataset=None):
        self.sampler = _sampler(self.train_dataset)
        return self.sampler


def _expected(local, epochs):
    """The ``input_ids`` of every batch the same sampler draws over the local store."""
    view = mmpack.WindowDataset(local, SEQLEN, eot=EOT, labels=True)
    s = _sampler(view)
    out = []
    for epoch in range(epochs):
        s.set_epoch(epoch)
        order = list(s)
        for i in range(0, len(order), B):
            out.append(collate([view[int(j)] for j in order[i : i + B]])["input_ids"])
    return out


@pytest.mark.parametrize(
    "workers,start", [(0, None), (2, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)]
)
def test_a_trainer_over_a_block_sampler_fetches_whole_blocks(
    workers, start, stores, s3_server, tmp_path
):
    """``Trainer`` with the block-order sampler, 0 and 2 workers (forked and spawned), two
    epochs: the batches the model sees equal the local store's in the same order; each block is
    fetched once per epoch in whole parts (readers fetch nothing of their own); the node cache,
    sampled at every step, holds two windows at most."""
    remote, local = stores
    proxy = DelayProxy(s3_server.port, delay=0.0)
    try:
        store = mmpack.open(
            remote.location,
            storage_options=dict(s3_server.options, endpoint=proxy.endpoint),
            cache_dir=tmp_path / "cache",
            cache_limit=1 << 30,
        )
        view = mmpack.WindowDataset(store, SEQLEN, eot=EOT, labels=True)
        spans = store.span_fetcher
        assert spans.fetcher.page == CHECK and store.dtype.itemsize == 1
        spans.part_pages = PART // CHECK
        sizer, sizes, bound = _two_epochs(view, _sampler(view))
        assert sizer.order.n_windows > 3
        model = _model(True, "sdpa")
        seen, peak = [], [0]

        def record(module, args, kwargs):  # in the training loop's process
            seen.append(kwargs["input_ids"].clone())
            peak[0] = max(peak[0], int(spans.cache.state.sum()) * CHECK)

        model.register_forward_pre_hook(record, with_kwargs=True)
        args = _args(
            tmp_path / "run",
            per_device_train_batch_size=B,
            num_train_epochs=2,
            logging_steps=1000,
            dataloader_num_workers=workers,
            dataloader_multiprocessing_context=start,
        )
        trainer = BlockTrainer(
            model=model, args=args, train_dataset=view, data_collator=DataCollator("sdpa")
        )
        before = proxy.requests, proxy.bytes_down
        trainer.train()
        fetcher = trainer.sampler.window_fetcher
        assert fetcher is not None  # the sampler over the remote view drives the fetch
        fetcher.wait()
        want = _expected(local, 2)
        assert len(seen) == len(want)
        for got, ref in zip(seen, want):
            assert torch.equal(got, ref)
        opens = 4 * workers * 2 if start == "spawn" else 0  # a spawned worker opens the store
        assert_each_block_once(store, proxy, before, sizer, sizes, bound, peak[0], opens)
        fetcher.close()
    finally:
        proxy.close()
