"""Stacking a batch's fields (mmpack._src.torch.stacking), through collate: per-token fields
stacked as contiguous int64 whatever their input dtype, the inputs untouched; other fields
stacked when they can be, kept as lists otherwise."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from _rows import packed_row as _row

from mmpack._src.torch.collate import BATCH_TOKEN_FIELDS, TARGETS, TOKEN_FIELDS
from mmpack.torch import collate


def test_stacks_token_fields_as_int64():
    rng = np.random.default_rng(0)
    samples = [_row(rng, [3, 5]), _row(rng, [2, 4], pad=2)]
    batch = collate(samples)
    for key, out in zip(TOKEN_FIELDS, BATCH_TOKEN_FIELDS):
        assert batch[out].dtype == torch.int64
        assert batch[out].shape == (2, 8)
        assert batch[out].is_contiguous()
        np.testing.assert_array_equal(batch[out].numpy(), np.stack([s[key] for s in samples]))
    assert "labels" not in batch and TARGETS == "targets"  # labels ride as "targets"


def test_narrow_and_readonly_integer_inputs():
    rng = np.random.default_rng(2)
    samples = [_row(rng, [5, 3]) for _ in range(2)]
    for s in samples:
        s["input_ids"] = s["input_ids"].astype(np.uint16)
        s["attention_mask"] = s["attention_mask"].astype(bool)
        for v in s.values():
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = collate(samples)
    assert batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].dtype == torch.int64
    assert batch["attention_mask"].sum().item() == 16
    before = int(samples[0]["input_ids"][0])
    batch["input_ids"][0, 0] = -1  # the batch owns its memory: inputs are untouched
    assert int(samples[0]["input_ids"][0]) == before


def test_extra_keys_stacked_or_kept_as_lists():
    rng = np.random.default_rng(4)
    samples = [_row(rng, [4]) for _ in range(3)]
    for b, s in enumerate(samples):
        s["weight"] = np.float32(0.5 * b)
        s["doc_index"] = np.array([b, b + 1], dtype=np.uint32)
        s["ragged"] = np.arange(b + 1)
        s["name"] = f"row{b}"
        s["flag"] = b == 1
        s["meta"] = {"b": b}
        s["vec"] = torch.full((2,), float(b))
    batch = collate(samples)
    assert batch["weight"].dtype == torch.float32 and batch["weight"].tolist() == [0, 0.5, 1]
    assert batch["doc_index"].dtype == torch.int64 and batch["doc_index"].shape == (3, 2)
    assert isinstance(batch["ragged"], list) and len(batch["ragged"]) == 3
    assert batch["name"] == ["row0", "row1", "row2"]
    assert batch["flag"].dtype == torch.bool and batch["flag"].tolist() == [False, True, False]
    assert batch["meta"] == [{"b": 0}, {"b": 1}, {"b": 2}]
    assert batch["vec"].shape == (3, 2) and batch["vec"].dtype == torch.float32
