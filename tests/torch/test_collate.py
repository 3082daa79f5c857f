"""Specification of :mod:`mmpack._src.torch.collate`.

Run: ``.venv/bin/python -m pytest tests/torch/test_collate.py -q``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from _rows import packed_row as _row
from _rows import row_batches, samples_from_rows
from hypothesis import given

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack.torch import Collator, collate


def test_worked_example_from_the_docstring():
    rng = np.random.default_rng(0)
    batch = collate([_row(rng, [3, 5]), _row(rng, [2, 4], pad=2)])
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 10, 14, 16]
    assert batch["max_seqlen"] == 5
    assert isinstance(batch["max_seqlen"], int)
    assert [r.tolist() for r in batch["cu_seqlens_rows"]] == [[0, 3, 8], [0, 2, 6, 8]]
    assert all(r.dtype == torch.int32 for r in batch["cu_seqlens_rows"])
    assert batch["source"].tolist() == [0, 0]


@given(row_batches())
def test_flattened_position_ids_restart_at_every_flat_segment(batch_spec):
    seqlen, rows = batch_spec
    batch = collate(samples_from_rows(seqlen, rows))
    pos = batch["position_ids"].view(-1)
    flat = batch["cu_seqlens"].tolist()
    for s, e in zip(flat[:-1], flat[1:]):
        assert pos[s:e].tolist() == list(range(e - s))
    # input_ids.view(-1) keeps row-major order: token t of row b sits at b * seqlen + t.
    assert batch["input_ids"].view(-1).tolist() == [
        1000 * b + t for b in range(len(rows)) for t in range(seqlen)
    ]


def test_varlen_false_omits_only_the_batch_cu_seqlens():
    rng = np.random.default_rng(1)
    samples = [_row(rng, [4, 4]), _row(rng, [8])]
    batch = collate(samples, varlen=False)
    assert "cu_seqlens" not in batch
    assert batch["max_seqlen"] == 8
    assert len(batch["cu_seqlens_rows"]) == 2
    assert Collator(varlen=False)(samples).keys() == batch.keys()


def test_torch_tensor_samples():
    rng = np.random.default_rng(3)
    samples = []
    for _ in range(2):
        s = _row(rng, [2, 6])
        samples.append({k: torch.as_tensor(v) for k, v in s.items()})
    batch = collate(samples)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["cu_seqlens"].tolist() == [0, 2, 8, 10, 16]
    assert batch["source"].dtype == torch.int64


def test_pad_to_multiple_of_adds_one_padding_segment_per_row():
    rng = np.random.default_rng(5)
    samples = [_row(rng, [3, 7]), _row(rng, [10])]
    batch = Collator(pad_to_multiple_of=8, pad_id=7)(samples)
    assert batch["input_ids"].shape == (2, 16)
    assert (batch["input_ids"][:, 10:] == 7).all()
    assert (batch["targets"][:, 10:] == IGNORE_INDEX).all()
    assert (batch["attention_mask"][:, 10:] == 0).all()
    assert batch["position_ids"][:, 10:].tolist() == [list(range(6))] * 2
    np.testing.assert_array_equal(batch["input_ids"][0, :10].numpy(), samples[0]["input_ids"])
    assert [r.tolist() for r in batch["cu_seqlens_rows"]] == [[0, 3, 10, 16], [0, 10, 16]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 10, 16, 26, 32]
    assert batch["max_seqlen"] == 10


def test_pad_to_multiple_of_is_a_no_op_on_aligned_rows():
    rng = np.random.default_rng(6)
    samples = [_row(rng, [3, 5]), _row(rng, [8])]
    a = collate(samples)
    b = Collator(pad_to_multiple_of=4)(samples)
    assert a.keys() == b.keys()
    for key in ("input_ids", "targets", "position_ids", "cu_seqlens"):
        assert torch.equal(a[key], b[key])


def test_collator_pickles_and_validates():
    c = Collator(pad_to_multiple_of=64, pad_id=3)
    c2 = pickle.loads(pickle.dumps(c))
    assert c2.pad_to_multiple_of == 64 and c2.varlen
    assert "pad_to_multiple_of=64" in repr(c2)
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            Collator(pad_to_multiple_of=bad)


def test_works_as_dataloader_collate_fn_with_getitems():
    rng = np.random.default_rng(7)
    rows = [_row(rng, [2, 6], source=i % 2) for i in range(10)]

    class View(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

        def __getitems__(self, indices):
            return [rows[i] for i in indices]

    loader = torch.utils.data.DataLoader(View(), batch_size=4, collate_fn=collate)
    batches = list(loader)
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    assert batches[2]["cu_seqlens"].tolist() == [0, 2, 8, 10, 16]
    assert batches[0]["source"].tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("samples", "error", "match"),
    [
        ([], ValueError, "empty"),
        ({"input_ids": np.arange(3)}, TypeError, "sequence"),
        ([np.arange(3)], TypeError, r"samples\[0\]"),
        ([{"input_ids": np.arange(3)}, {"labels": np.arange(3)}], ValueError, "missing"),
        ([{"input_ids": np.arange(3)}, {"input_ids": np.arange(4)}], ValueError, "length 4"),
        ([{"input_ids": np.ones((2, 3), dtype=np.int64)}], ValueError, "shape"),
        ([{"input_ids": np.ones(3)}], TypeError, "dtype float64"),
        ([{"input_ids": np.arange(4), "cu_seqlens": np.array([0, 5])}], ValueError, "malformed"),
        ([{"input_ids": np.arange(4), "cu_seqlens": np.array([1, 4])}], ValueError, "malformed"),
        (
            [
                {"input_ids": np.arange(4), "cu_seqlens": np.array([0, 4])},
                {"input_ids": np.arange(4), "cu_seqlens": np.array([0, 3, 2, 4])},
            ],
            ValueError,
            r"samples\[1\]\['cu_seqlens'\]",
        ),
        ([{"input_ids": np.arange(4), "cu_seqlens": np.array([4])}], ValueError, "at least 2"),
        ([{"input_ids": np.arange(4), "cu_seqlens_rows": 1}], ValueError, "cu_seqlens_rows"),
        (
            [{"input_ids": np.arange(4), "labels": np.arange(4), "targets": np.arange(4)}],
            ValueError,
            "'targets', which collate produces",
        ),
        ([{"source": 1}], ValueError, "nothing to collate"),
        ([{"input_ids": np.arange(0)}], ValueError, "length 0"),
    ],
)
def test_rejects_bad_batches(samples, error, match):
    with pytest.raises(error, match=match):
        collate(samples)


def test_rejects_batches_beyond_int32():
    s = {"cu_seqlens": np.array([0, 2**30], dtype=np.int64)}
    with pytest.raises(ValueError, match="int32"):
        collate([s, s, s])
