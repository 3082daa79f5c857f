"""Specification of :mod:`mmpack._src.torch.boundaries`: the batch-wide ``cu_seqlens`` of a
batch's rows and the rows read from ``position_ids``, through :func:`mmpack.torch.collate`.

Run: ``.venv/bin/python -m pytest tests/torch/test_boundaries.py -q``.
"""

from __future__ import annotations

import numpy as np
import torch
from _rows import row_batches, samples_from_rows
from hypothesis import given

from mmpack._src.torch.boundaries import position_boundaries
from mmpack.torch import collate


def _flat_reference(rows: list[np.ndarray], seqlen: int) -> list[int]:
    """Obviously-right batch cu_seqlens: shift, concatenate, drop repeats."""
    out: list[int] = []
    for b, cu in enumerate(rows):
        for c in cu:
            v = int(c) + b * seqlen
            if not out or out[-1] != v:
                out.append(v)
    return out


@given(row_batches())
def test_flat_cu_seqlens_matches_reference(batch_spec):
    seqlen, rows = batch_spec
    batch = collate(samples_from_rows(seqlen, rows))
    flat = batch["cu_seqlens"].tolist()
    assert flat == _flat_reference(rows, seqlen)
    assert flat[0] == 0 and flat[-1] == len(rows) * seqlen
    assert all(a < b for a, b in zip(flat, flat[1:]))
    assert batch["max_seqlen"] == max(b - a for a, b in zip(flat, flat[1:]))
    assert [r.tolist() for r in batch["cu_seqlens_rows"]] == [r.tolist() for r in rows]


def test_samples_without_cu_seqlens_are_one_segment_per_row():
    samples = [{"input_ids": np.arange(6), "labels": np.arange(6)} for _ in range(3)]
    batch = collate(samples)
    assert batch["cu_seqlens"].tolist() == [0, 6, 12, 18]
    assert batch["max_seqlen"] == 6
    assert [r.tolist() for r in batch["cu_seqlens_rows"]] == [[0, 6]] * 3


def _position_reference(pos: np.ndarray) -> list[int]:
    """Obviously-right cuts of one row: 0, every t whose position does not continue t - 1, end."""
    return [0] + [t for t in range(1, len(pos)) if pos[t] != pos[t - 1] + 1] + [len(pos)]


@given(row_batches())
def test_samples_without_cu_seqlens_are_cut_where_their_positions_restart(batch_spec):
    """What transformers' Trainer leaves of a view's sample (it drops ``cu_seqlens``, which its
    model's forward does not name): the rows keep their documents, read from position_ids."""
    seqlen, rows = batch_spec
    samples = samples_from_rows(seqlen, rows)
    with_cu = collate(samples)
    without = collate([{k: v for k, v in s.items() if k != "cu_seqlens"} for s in samples])
    assert torch.equal(without["cu_seqlens"], with_cu["cu_seqlens"])
    assert without["max_seqlen"] == with_cu["max_seqlen"]
    got = [r.tolist() for r in without["cu_seqlens_rows"]]
    assert got == [_position_reference(s["position_ids"]) for s in samples]
    assert got == [sorted(set(r.tolist())) for r in rows]  # the rows without empty segments
    flat, lens = position_boundaries(np.stack([s["position_ids"] for s in samples]))
    assert lens.tolist() == [len(r) for r in got] and flat.tolist() == sum(got, [])
