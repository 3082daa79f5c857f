"""Specification of :mod:`mmpack._src.sampling.mixture_batches`: a mixture's batched read asks
each source once and gives the items one by one would; sources are compatible whatever the
shape of their ``cu_seqlens``, and refused for other fixed shapes or keys.

Run: ``.venv/bin/python -m pytest tests/sampling/test_mixture_batches.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _mixture_sources import FakeSource, PlainSource, two_stores
from torch.utils.data import DataLoader

from mmpack import Mixture


def test_getitems_batches_each_source_once():
    sources = [FakeSource(30, 0), PlainSource(30, 1), FakeSource(30, 2)]
    mixture = Mixture(sources, [0.5, 0.25, 0.25], num_samples=300, seed=2)
    batch = [5, 299, 0, 17, 5, 100, -1, 42, 43, 44]
    got = mixture.__getitems__(batch)
    assert len(got) == len(batch)
    for i, item in zip(batch, got):
        ref = mixture[i]
        assert item.keys() == ref.keys()
        for key in ref:
            np.testing.assert_array_equal(item[key], ref[key])
    assert len(sources[0].batch_calls) == 1 and len(sources[2].batch_calls) == 1
    assert mixture.__getitems__([]) == []


@pytest.mark.parametrize("kind", ["window", "window_labels", "packed"])
def test_mixture_of_views_of_different_stores(tmp_path, kind):
    """The shape of ``cu_seqlens`` varies from sample to sample: it is not a compatibility rule
    (the old check compared sample 0's and refused these sources)."""
    from mmpack import PackedDataset, WindowDataset

    a, b = two_stores(tmp_path)
    if kind == "packed":
        views = [PackedDataset(s, seqlen=64, eot=0, pad_id=99) for s in (a, b)]
    else:
        views = [WindowDataset(s, 32, eot=0, labels=kind == "window_labels") for s in (a, b)]
    assert views[0][0]["cu_seqlens"].shape != views[1][0]["cu_seqlens"].shape
    mixture = Mixture(views, [0.5, 0.5], num_samples=40, seed=3)
    batch = mixture.__getitems__(list(range(40)))
    for i in range(40):
        k, j = mixture.source_of(i)
        want = views[k][j]
        for key, value in want.items():
            np.testing.assert_array_equal(batch[i][key], value)
        assert int(batch[i]["source"]) == k
        # locate has the views' shape, each piece also naming its source
        assert mixture.locate(i) == [{**p, "source": k} for p in views[k].locate(j)]
    from mmpack.torch import collate

    loader = DataLoader(mixture, batch_size=8, collate_fn=collate)
    assert sum(x["input_ids"].shape[0] for x in loader) == 40


def test_mixture_still_refuses_other_fixed_shapes_and_keys(tmp_path):
    from mmpack import PackedDataset, WindowDataset

    a, b = two_stores(tmp_path)
    with pytest.raises(ValueError, match="incompatible samples"):
        Mixture([WindowDataset(a, 32), WindowDataset(b, 16)], [1, 1])
    with pytest.raises(ValueError, match="incompatible samples"):
        Mixture([WindowDataset(a, 32), WindowDataset(b, 32, labels=True)], [1, 1])
    with pytest.raises(ValueError, match="incompatible samples"):
        Mixture([WindowDataset(a, 64, labels=True), PackedDataset(b, seqlen=64)], [1, 1])
