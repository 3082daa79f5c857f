"""Per-row micro-batches and the seed's batch counters, on numpy (mmpack._src.streaming.microbatch)
and torch (mmpack._src.torch.microbatch, on the tensors of mmpack._src.torch.streaming.as_tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _packer import packed_batch as packed

from mmpack import StreamingPacker
from mmpack._src.streaming import microbatch as np_micro
from mmpack._src.streaming.microbatch import num_label_tokens, num_sequences
from mmpack._src.torch import microbatch as torch_micro
from mmpack._src.torch.streaming import as_tensors


def split_packed_batch(batch, *args, **kw):
    """The split of the batch's kind: numpy arrays or torch tensors."""
    is_torch = isinstance(batch["input_ids"], torch.Tensor)
    return (torch_micro if is_torch else np_micro).split_packed_batch(batch, *args, **kw)


@pytest.mark.parametrize("rt", ["np", "pt"])
def test_split_without_trimming(rt):
    batch = packed(rt)
    micro = split_packed_batch(batch)
    assert len(micro) == 3
    for r, m in enumerate(micro):
        assert m["input_ids"].shape == (8,)
        assert (m["input_ids"] == batch["input_ids"][r]).all()
        assert m["cu_seqlens"] is batch["cu_seqlens"][r]
        assert int(m["cu_seqlens"][-1]) == m["input_ids"].shape[-1]


@pytest.mark.parametrize("rt", ["np", "pt"])
def test_split_trims_rows_over_the_tolerance(rt):
    batch = packed(rt)
    # best fit: row 0 = [10,11,12] [20,21] [40] + 2 pad (25%), row 1 = [30..37], row 2 empty
    assert batch["cu_seqlens"][0].tolist() == [0, 3, 5, 6, 8]
    micro = split_packed_batch(batch, padding_tolerance=0.5)
    assert [m["input_ids"].shape[0] for m in micro] == [8, 8, 0]
    assert micro[2]["cu_seqlens"].tolist() == [0] and micro[2]["max_seqlen"] == 0
    assert micro[0]["cu_seqlens"].tolist() == [0, 3, 5, 6, 8] and micro[0]["max_seqlen"] == 3
    micro = split_packed_batch(batch, padding_tolerance=0.0)
    assert [m["input_ids"].shape[0] for m in micro] == [6, 8, 0]
    assert micro[0]["cu_seqlens"].tolist() == [0, 3, 5, 6] and micro[0]["max_seqlen"] == 3
    assert micro[0]["targets"].tolist() == [11, 12, -100, 21, -100, -100]
    for m in micro:
        assert int(m["cu_seqlens"][-1]) == m["input_ids"].shape[0] == m["attention_mask"].sum()


def test_split_empty_row_and_no_labels():
    docs = [[1, 2, 3]]
    batch = next(
        iter(StreamingPacker(docs, batch_size=2, seqlen=4, buffer_size=2, drop_last=False))
    )
    micro = split_packed_batch(batch, padding_tolerance=0.1)
    assert micro[1]["input_ids"].shape == (0,) and micro[1]["cu_seqlens"].tolist() == [0]
    assert micro[1]["max_seqlen"] == 0 and micro[0]["targets"] is None
    with pytest.raises(ValueError, match="padding_tolerance"):
        split_packed_batch(batch, padding_tolerance=2)


def test_mask_prob_is_copied():
    batch = packed(
        "pt",
        mode="mlm",
        mask_id=3,
        vocab_size=100,
        masking_ratio_cooldown_tokens=10,
        final_masking_ratio=0.1,
    )
    micro = split_packed_batch(batch)
    assert all(float(m["mask_prob"]) == float(batch["mask_prob"]) for m in micro)
    assert micro[0]["mask_prob"] is not batch["mask_prob"]


@pytest.mark.parametrize("rt", ["np", "pt"])
def test_counts(rt):
    batch = packed(rt)
    # causal labels: every token but each sequence's last one
    assert num_label_tokens(batch) == (3 + 2 + 8 + 1) - 4
    micro = split_packed_batch(batch)
    assert num_label_tokens({"targets": [m["targets"] for m in micro]}) == 10
    assert num_sequences(batch) == 4
    assert num_sequences(batch, count_padding=True) == 6  # the seed counts padding segments
    assert sum(num_sequences(m) for m in micro) == 4
    with pytest.raises(TypeError, match="targets"):
        num_label_tokens(packed(rt, mode=None))
    with pytest.raises(KeyError, match="attention_mask"):
        num_sequences({"cu_seqlens": batch["cu_seqlens"]})


def test_counts_mixed_types():
    labels = torch.tensor([[1, -100], [-100, -100]])
    assert num_label_tokens({"targets": labels}) == 1
    assert num_label_tokens({"targets": np.array([5, -1, -1])}, ignore_index=-1) == 1


def test_as_tensors_is_zero_copy():
    batch = packed("np", mode="mlm", mask_id=3, vocab_size=100, masking_ratio_cooldown_tokens=10,
                   final_masking_ratio=0.1)  # fmt: skip
    tensors = as_tensors(batch)
    for key in ("input_ids", "targets", "attention_mask"):
        assert isinstance(tensors[key], torch.Tensor) and tensors[key].dtype == torch.int64
        assert tensors[key].data_ptr() == batch[key].ctypes.data
    assert all(c.dtype == torch.int32 for c in tensors["cu_seqlens"])
    assert tensors["mask_prob"].dtype == torch.float32 and tensors["mask_prob"].ndim == 0
    assert tensors["max_seqlen"] == batch["max_seqlen"]
    assert as_tensors(packed("np", mode=None))["targets"] is None
