"""Packed rows for the collate and row-boundary tests: one row as a view returns it, and rows
drawn by hypothesis (a batch of rows' boundaries and the samples a view would return for them)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from mmpack._src.core.constants import IGNORE_INDEX


@st.composite
def row_batches(draw):
    """``(seqlen, rows)``: 1 to 6 rows of ``seqlen`` tokens, each one's int32 boundaries."""
    seqlen = draw(st.integers(1, 40))
    n = draw(st.integers(1, 6))
    rows = []
    for _ in range(n):
        cuts = draw(st.lists(st.integers(0, seqlen), max_size=6))
        rows.append(np.array([0, *sorted(cuts), seqlen], dtype=np.int32))
    return seqlen, rows


def samples_from_rows(seqlen: int, rows: list[np.ndarray]) -> list[dict]:
    """The samples of ``rows``: ids, positions restarting at every boundary, ignored labels."""
    samples = []
    for b, cu in enumerate(rows):
        pos = np.zeros(seqlen, dtype=np.int64)
        for s, e in zip(cu[:-1], cu[1:]):
            pos[s:e] = np.arange(e - s)
        samples.append(
            {
                "input_ids": np.arange(seqlen, dtype=np.int64) + 1000 * b,
                "position_ids": pos,
                "labels": np.full(seqlen, IGNORE_INDEX, dtype=np.int64),
                "cu_seqlens": cu,
                "max_seqlen": int(np.diff(cu).max()),
            }
        )
    return samples


def packed_row(rng: np.random.Generator, lengths: list[int], pad: int = 0, source: int = 0) -> dict:
    """A packed row as a view returns it: documents of ``lengths`` then ``pad`` padding tokens."""
    seg = list(lengths) + ([pad] if pad else [])
    seqlen = sum(seg)
    cu = np.concatenate([[0], np.cumsum(seg)]).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in seg]).astype(np.int64)
    ids = rng.integers(1, 1000, seqlen)
    labels = ids.copy()
    if pad:
        ids[seqlen - pad :] = 0
        labels[seqlen - pad :] = IGNORE_INDEX
    mask = np.ones(seqlen, dtype=np.int64)
    if pad:
        mask[seqlen - pad :] = 0
    return {
        "input_ids": ids,
        "position_ids": pos,
        "labels": labels,
        "attention_mask": mask,
        "cu_seqlens": cu,
        "max_seqlen": int(max(seg)),
        "source": source,
    }
