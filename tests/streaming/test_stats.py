"""Specification of :mod:`mmpack._src.streaming.stats`: ``StreamingPacker.stats()`` counts one
epoch (reset at the next, the token clock carried across), is frozen and reads as a dict.

Run: ``.venv/bin/python -m pytest tests/streaming/test_stats.py -q``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _packer import KW

from mmpack import StreamingPacker


def test_counters_reset_each_epoch(docs):
    p = StreamingPacker(docs, **KW)
    list(p)
    a = p.stats()
    list(p)
    b = p.stats()
    assert b.epoch == a.epoch + 1 and b.token_count == 2 * a.token_count
    assert dataclasses.replace(b, epoch=a.epoch, token_count=a.token_count) == a
    assert np.isnan(StreamingPacker(docs, **KW).stats().efficiency)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.n_docs = 0  # type: ignore[misc]
    assert a.as_dict()["n_docs"] == a.n_docs
