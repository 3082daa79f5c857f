"""Specification of :mod:`mmpack._src.views.window_stats`: ``WindowDataset.stats()`` against the
samples of the window view's reference (covered, dropped, pad and eot tokens; frozen).

Run: ``.venv/bin/python -m pytest tests/views/test_window_stats.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _windows import corpora, naive_windows
from hypothesis import given
from hypothesis import strategies as st
from reference import naive_stream

import mmpack
from mmpack import WindowDataset


@given(
    docs=corpora,
    seqlen=st.integers(1, 12),
    stride=st.integers(1, 20),
    use_eot=st.booleans(),
    labels=st.booleans(),
    drop_last=st.booleans(),
)
def test_stats_count_what_the_samples_hold(
    tmp_path_factory, docs, seqlen, stride, use_eot, labels, drop_last
):
    """``stats()`` against the samples themselves: the stream tokens some window holds (its
    ``width`` tokens, the label token included), the pad tokens of ``input_ids``, the eots."""
    store = mmpack.build(tmp_path_factory.mktemp("w") / "s", docs)
    eot = 7 if use_eot else None
    ds = WindowDataset(store, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last)
    stats = ds.stats()
    stream, _ = naive_stream(docs, eot)
    width = seqlen + int(labels)
    covered = np.zeros(len(stream), dtype=bool)
    for i in range(len(ds)):
        covered[i * stride : i * stride + width] = True
    samples = naive_windows(docs, seqlen, stride, eot, labels, drop_last, -1)
    padding = sum(s["input_ids"].count(-1) for s in samples)
    assert stats == type(stats)(
        seqlen=seqlen,
        stride=stride,
        n_samples=len(ds),
        n_full=sum(i * stride + width <= len(stream) for i in range(len(ds))),
        n_partial=sum(i * stride + width > len(stream) for i in range(len(ds))),
        n_docs=len(docs),
        n_tokens=sum(len(d) for d in docs),
        eot_tokens=len(docs) if use_eot else 0,
        stream_tokens=len(stream),
        covered_tokens=int(covered.sum()),
        dropped_tokens=int((~covered).sum()),
        padding_tokens=padding,
    )
    assert stats.as_dict()["covered_tokens"] == stats.covered_tokens
    with pytest.raises(AttributeError):
        stats.n_samples = 0  # frozen, as every view's stats()
