"""Packed samples for the context-parallel tests: the padding id, the fields of a batch, a row
cut at given points and a hypothesis strategy of batches of them."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

PAD, IGNORE = 7, -100
FIELDS = ("input_ids", "position_ids", "targets", "attention_mask", "loss_mask")


def sample(rng, seqlen, cuts):
    """A row of ``seqlen`` tokens cut at ``cuts``: next-token labels, ignored at each segment's
    last token and at random."""
    cu = np.array([0, *sorted(cuts), seqlen], dtype=np.int32)
    pos = np.concatenate([np.arange(b - a) for a, b in zip(cu[:-1], cu[1:])])
    ids = rng.integers(10, 1000, seqlen)
    labels = np.roll(ids, -1)
    labels[cu[1:] - 1] = IGNORE
    labels[rng.random(seqlen) < 0.1] = IGNORE
    attn = np.ones(seqlen, dtype=np.int64)
    return {"input_ids": ids, "position_ids": pos, "labels": labels, "attention_mask": attn,
            "cu_seqlens": cu}  # fmt: skip


@st.composite
def batches(draw):
    """1 to 4 rows of one length up to 40, each cut at up to 5 points."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    b, seqlen = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    samples = []
    for _ in range(b):
        k = draw(st.integers(0, min(5, seqlen - 1)))
        cuts = rng.choice(np.arange(1, seqlen), k, replace=False) if k else []
        samples.append(sample(rng, seqlen, cuts))
    return samples
