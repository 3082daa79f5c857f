"""Shards of a source (mmpack._src.streaming.shards): a store's shard is a range of its documents
that keeps the store's read-ranges path."""

from __future__ import annotations

import numpy as np
from _packer import distinct_docs as _docs

from mmpack import build
from mmpack._src.streaming.shards import StoreDocRange, shard_source


def test_a_store_shard_keeps_the_read_ranges_path(tmp_path):
    store = build(tmp_path / "s", _docs(20))
    shard, store_like = shard_source(store, 1, 2, indexed=True, store_like=True, eot=None)
    assert store_like and isinstance(shard, StoreDocRange)
    assert np.array_equal(shard.offsets, store.offsets[10:21])
    assert shard_source(store, 0, 1, indexed=True, store_like=True, eot=None) == (store, True)
