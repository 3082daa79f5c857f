"""One contract over every layout a store can have: local memmap, local Zarr (sharded), remote
memmap and remote Zarr on a real S3 server (SeaweedFS, ``tests/_s3.py``), ``file://`` URLs and a
join of parts.  On random corpora (empty documents, documents longer than a row, ids up to the
dtype's top) every window and packed row of each equals the local memmap store's
(``tests/_contract.py``), which ``tests/views/test_window.py`` and ``tests/views/test_packed.py`` prove
against slow Python twins.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/test_store_contract.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _contract import LAYOUTS, assert_views_equal
from _zarr_stores import _small
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    _small(monkeypatch)  # small Zarr inner chunks and shards: many shards from few tokens


corpora = st.lists(
    st.one_of(
        st.integers(0, 0),  # empty documents
        st.integers(1, 40),
        st.integers(60, 300),  # longer than a row (seqlen 64)
    ),
    min_size=3,
    max_size=60,
)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=4, deadline=None)
@given(lengths=corpora, seed=st.integers(0, 2**32 - 1))
def test_every_layout_serves_the_reference_rows(layout, lengths, seed, s3_server, tmp_path_factory):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 65536, size=n).astype(np.uint16) for n in lengths]
    if sum(lengths) < 70:
        docs.append(np.arange(70, dtype=np.uint16))  # at least one window of 64 + 1
    docs[0][:1] = 65535  # the dtype's top id (the eot) inside a document
    tmp = tmp_path_factory.mktemp(layout)
    reference = mmpack.build(tmp / "reference", docs, fsync=False)
    store = LAYOUTS[layout](tmp, docs, s3=s3_server)
    assert_views_equal(store, reference, seqlen=64, same_fingerprint=layout != "joined-parts")
