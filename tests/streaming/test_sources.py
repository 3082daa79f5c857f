"""The packer's sources (mmpack._src.streaming.sources): every form of documents and batches
recognised (lists, arrays, tensors, dicts, batches of them, generators), a token store read as a
store, and what is no source refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _packer import KW, expected_rows
from reference import rows_of

from mmpack import StreamingPacker


def test_source_formats(docs):
    want = expected_rows(docs, **KW)
    batches = [docs[i : i + 4] for i in range(0, len(docs), 4)]
    variants = {
        "generator of lists": (list(d) for d in docs),
        "arrays": [np.asarray(d, dtype=np.uint16) for d in docs],
        "tensors": [torch.tensor(d) for d in docs],
        "dicts": [{"input_ids": d, "other": 1} for d in docs],
        "batches of lists": batches,
        "batches of dicts": [[{"input_ids": d} for d in b] for b in batches],
        "hf-style batches": ({"input_ids": b} for b in batches),
        "generator of batches": (b for b in batches),
    }
    for name, source in variants.items():
        assert expected_rows(source, **KW) == want, name
    explicit = expected_rows(iter(batches), source_format="batches", **KW)
    assert explicit == want
    # a batch whose first sequence is empty is still recognised from the next element
    assert expected_rows([[[], docs[0]], docs[1:4]], **KW) == expected_rows(docs[:4], **KW)


def test_token_store_source(docs, tmp_path):
    from mmpack import build

    store = build(tmp_path / "s", [np.asarray(d) for d in docs])
    packer = StreamingPacker(store, **KW)
    assert packer._store_like
    assert [rows_of(b) for b in packer] == expected_rows(docs, **KW)


def test_invalid_sources():
    with pytest.raises(TypeError, match="text"):
        list(StreamingPacker(["hello"], **KW))
    with pytest.raises(ValueError, match="non-integer token 0.5"):
        list(StreamingPacker([np.full(3, 0.5)], **KW))
    with pytest.raises(TypeError, match="input_ids"):
        list(StreamingPacker([{"text": "x"}], **KW))
    with pytest.raises(TypeError, match="iterable"):
        StreamingPacker(5, **KW)
