"""``SampleBatch``, what every view's ``__getitems__`` returns: a sequence of the samples' dicts
backed by whole-batch columns, and ``mmpack._src.torch.collate``'s columnar fast path over it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import mmpack
from mmpack.store import SampleBatch
from mmpack.torch import collate

DOCS = [list(range(1, n)) for n in [15, 13, 11, 13, 15, 8, 14, 8, 11, 10, 1, 30]]


def views(path):
    store = mmpack.build(path, DOCS)
    return {
        "window": mmpack.WindowDataset(store, 8, 3, eot=420, drop_last=False),
        "window+labels": mmpack.WindowDataset(store, 8, 3, eot=420, labels=True, drop_last=False),
        "packed": mmpack.PackedDataset(store, 16, eot=420, pad_id=0),
        "packed-mlm": mmpack.PackedDataset(
            store, 16, eot=420, pad_id=0, mode="mlm", mask_id=421, vocab_size=422
        ),
    }


@pytest.mark.parametrize("kind", ["window", "window+labels", "packed", "packed-mlm"])
def test_batch_items_equal_single_samples(tmp_path, kind):
    ds = views(tmp_path / "s")[kind]
    idx = [0, len(ds) - 1, 2, 0]
    batch = ds.__getitems__(idx)
    assert isinstance(batch, SampleBatch) and len(batch) == 4
    for got, i in zip(batch, idx):
        want = ds[i]
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            assert type(got[key]) is type(want[key])
    assert len(batch[1:3]) == 2


@pytest.mark.parametrize("kind", ["window", "window+labels", "packed", "packed-mlm"])
def test_collate_fast_path_equals_per_sample_path(tmp_path, kind):
    ds = views(tmp_path / "s")[kind]
    idx = [0, 5 % len(ds), len(ds) - 1, 2 % len(ds)]
    fast = collate(ds.__getitems__(idx))
    slow = collate([ds[i] for i in idx])
    assert fast.keys() == slow.keys()
    for key in fast:
        if key == "cu_seqlens_rows":
            assert all(torch.equal(a, b) for a, b in zip(fast[key], slow[key]))
        elif isinstance(fast[key], torch.Tensor):
            assert torch.equal(fast[key], slow[key]), key
            assert fast[key].is_contiguous()
        else:
            assert fast[key] == slow[key], key
    # Tensors never alias each other: editing inputs in place leaves labels alone.
    if "targets" in fast:
        before = fast["targets"].clone()
        fast["input_ids"].fill_(-5)
        assert torch.equal(fast["targets"], before)


def test_default_collate_works_on_fixed_length_fields(tmp_path):
    """torch's own collate indexes and iterates the batch (``cu_seqlens`` differ in length, so
    it is left out here)."""
    ds = views(tmp_path / "s")["window+labels"]
    batch = ds.__getitems__([0, 1, 2])
    stacked = default_collate([{k: v for k, v in s.items() if k != "cu_seqlens"} for s in batch])
    assert stacked["input_ids"].shape == (3, 8)
    assert torch.equal(stacked["labels"][0], torch.from_numpy(ds[0]["labels"]))


def test_mixture_of_views_returns_one_batch(tmp_path):
    """A mixture over mmpack views scatters the sources' batches into one ``SampleBatch`` with a
    ``source`` column; every item equals the mixture's single-item read, and collates."""
    store = mmpack.build(tmp_path / "s", DOCS)
    windows = mmpack.WindowDataset(store, 16, 5, eot=420, labels=True)
    packed_like = mmpack.WindowDataset(store, 16, 16, eot=420, labels=True)
    mix = mmpack.Mixture([windows, packed_like], [0.7, 0.3], num_samples=40, seed=1)
    idx = [0, 3, 17, 39, 5, 5]
    batch = mix.__getitems__(idx)
    assert isinstance(batch, SampleBatch)
    for got, i in zip(batch, idx):
        want = mix[i]
        assert got.keys() == want.keys() and got["source"] == want["source"]
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    fast = collate(batch)
    slow = collate([mix[i] for i in idx])
    for key in ("input_ids", "targets", "position_ids", "cu_seqlens", "source"):
        assert torch.equal(fast[key], slow[key]), key
