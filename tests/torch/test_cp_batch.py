"""Context-parallel batches: ``collate(..., cp_size=C, cp_rank=r)`` against megatron-core's
``get_batch_on_this_cp_rank``; fixed-length ``cu_seqlens``; a view's batch on the fast path;
the options' checks.  The layout itself, against TransformerEngine's partition, is in
``tests/views/test_cp_layout.py``.

Run: ``pytest tests/torch/test_cp_batch.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _cp_batches import FIELDS, IGNORE, PAD, batches, sample
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack._src.torch.cp_batch import BatchLayout, batch_layout
from mmpack.torch import Collator, DataCollator, collate


@pytest.fixture(scope="module")
def megatron_split():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import utils
    return utils


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), b=st.integers(1, 3), cp_size=st.integers(1, 4),
       chunks=st.integers(1, 5))  # fmt: skip
def test_rows_without_packing_match_megatron_get_batch_on_this_cp_rank(
    megatron_split, seed, b, cp_size, chunks
):
    """Rows of one segment each (seqlen a multiple of 2 * cp_size): rank r's share is
    megatron-core's split of the rows, row after row (its group size and rank given as a
    process group would give them)."""
    rng = np.random.default_rng(seed)
    seqlen = 2 * cp_size * chunks
    samples = [sample(rng, seqlen, []) for _ in range(b)]
    full = collate(samples)
    for r in range(cp_size):
        share = collate(samples, cp_size=cp_size, cp_rank=r)
        assert share["cp_padding"] == 0
        batch = {"tokens": full["input_ids"].clone(), "labels": full["targets"].clone(),
                 "position_ids": full["position_ids"].clone(),
                 "loss_mask": (full["targets"] != IGNORE).float()}  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(megatron_split, "get_pg_size", lambda group: cp_size)
            patch.setattr(megatron_split, "get_pg_rank", lambda group: r)
            split = megatron_split.get_batch_on_this_cp_rank(batch, cp_group=object())
        pairs = [("tokens", "input_ids"), ("labels", "targets"), ("position_ids", "position_ids"),
                 ("loss_mask", "loss_mask")]  # fmt: skip
        for theirs, ours in pairs:
            assert torch.equal(share[ours].view(b, -1), split[theirs]), ours


@settings(max_examples=30, deadline=None)
@given(samples=batches(), cp_size=st.sampled_from([None, 1, 2, 3]))
def test_pad_cu_seqlens_gives_one_length_per_batch_size_and_seqlen(samples, cp_size):
    b, seqlen = len(samples), len(samples[0]["input_ids"])
    plain = collate(samples, cp_size=cp_size)
    fixed = collate(samples, cp_size=cp_size, pad_cu_seqlens=True)
    keys = ["cu_seqlens"] + (["cu_seqlens_padded"] if cp_size else [])
    for key in keys:
        cu, n = fixed[key], plain[key].shape[0]
        assert cu.shape == (b * seqlen + 1,) and cu.dtype == torch.int32
        assert torch.equal(cu[:n], plain[key]) and bool((cu[n:] == plain[key][-1]).all())
    assert isinstance(fixed["max_seqlen"], int)


def _views(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 500, int(n)) for n in rng.integers(1, 40, 60)]
    store = mmpack.build(tmp_path / "s.mmpack", docs)
    packed = mmpack.PackedDataset(store, seqlen=64, eot=999)
    window = mmpack.WindowDataset(store, 50, 30, eot=999, labels=True)
    return {"packed": packed, "window": window, "mixture": mmpack.Mixture(
        [window, mmpack.WindowDataset(store, 50, 20, labels=True)], [1, 1], num_samples=20)}  # fmt: skip


@pytest.mark.parametrize("name", ["packed", "window", "mixture"])
def test_a_view_batch_takes_the_fast_path_to_the_same_layout(tmp_path, name):
    batch = _views(tmp_path)[name].__getitems__([3, 0, 5])
    for r, dtype in ((None, torch.int64), (0, torch.int64), (2, torch.int64), (None, torch.int32),
                     (1, torch.int32)):  # fmt: skip
        fast = collate(batch, cp_size=3, cp_rank=r, pad_cu_seqlens=True, dtype=dtype)
        slow = collate([dict(s) for s in batch], cp_size=3, cp_rank=r, pad_cu_seqlens=True,
                       dtype=dtype)  # fmt: skip
        assert fast.keys() == slow.keys() and fast["input_ids"].dtype == dtype
        for key in fast:
            if isinstance(fast[key], torch.Tensor):
                assert fast[key].dtype == slow[key].dtype, key
                assert torch.equal(fast[key], slow[key]), key
            elif key != "cu_seqlens_rows":
                assert fast[key] == slow[key], key


@pytest.mark.parametrize(
    ("name", "promised"),
    [("packed", ("position_ids", "attention_mask")), ("window", ("position_ids",)),
     ("mixture", ("position_ids",))],
)  # fmt: skip
def test_a_view_batch_promises_the_fields_that_follow_each_segments_first_token(
    tmp_path, name, promised
):
    view = _views(tmp_path)[name]
    batch = view.__getitems__(list(range(len(view))))
    assert batch.from_first == promised
    for r in range(len(batch)):
        cu = batch.cu_seqlens[r, : batch.num_cuts[r]]
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            pos = batch.columns["position_ids"][r, a:b].tolist()
            assert pos == list(range(pos[0], pos[0] + b - a)) and b > a
            if "attention_mask" in promised:
                assert len(set(batch.columns["attention_mask"][r, a:b].tolist())) == 1


@pytest.mark.parametrize("cp_rank", [None, 0, 1])
def test_fields_a_batch_promises_are_written_from_each_segments_first_token(cp_rank):
    from mmpack.store import SampleBatch

    rng = np.random.default_rng(3)
    rows = [sample(rng, 12, [5]), sample(rng, 12, [2, 9])]
    columns = {key: np.stack([s[key] for s in rows]).astype(np.int64) for key in rows[0]
               if key != "cu_seqlens"}  # fmt: skip
    columns["attention_mask"][0, :5] = 4
    cu = np.zeros((2, 4), dtype=np.int32)
    cu[0, :3], cu[1] = rows[0]["cu_seqlens"], rows[1]["cu_seqlens"]
    promised = SampleBatch(dict(columns), cu, np.array([3, 4]),
                           from_first=("position_ids", "attention_mask"))  # fmt: skip
    want = collate(promised, cp_size=2, cp_rank=cp_rank, pad_id=PAD)
    for r, s in enumerate(rows):  # other values beyond each segment's first token
        for a, b in zip(s["cu_seqlens"][:-1], s["cu_seqlens"][1:]):
            columns["position_ids"][r, a + 1 : b] *= 100
            columns["attention_mask"][r, a + 1 : b] += 7
    got = collate(SampleBatch(columns, cu, np.array([3, 4]),
                              from_first=("position_ids", "attention_mask")), cp_size=2,
                  cp_rank=cp_rank, pad_id=PAD)  # fmt: skip
    for key in FIELDS:
        assert torch.equal(got[key], want[key]), key
    read = collate(SampleBatch(columns, cu, np.array([3, 4])), cp_size=2, cp_rank=cp_rank,
                   pad_id=PAD)  # fmt: skip
    assert not torch.equal(read["position_ids"], want["position_ids"])  # () promises nothing


def test_bad_options_are_named():
    samples = [sample(np.random.default_rng(0), 8, [3])]
    with pytest.raises(ValueError, match="cp_rank=1 needs cp_size"):
        collate(samples, cp_rank=1)
    with pytest.raises(ValueError, match="0 <= cp_rank < cp_size=2, got cp_rank=2"):
        Collator(cp_size=2, cp_rank=2)
    with pytest.raises(ValueError, match="cp_size"):
        collate(samples, cp_size=0)
    with pytest.raises(ValueError, match="need varlen=True"):
        collate(samples, varlen=False, pad_cu_seqlens=True)
    with pytest.raises(ValueError, match="flash attn_implementation, not 'sdpa'"):
        DataCollator("sdpa", cp_size=2)


def test_layout_options_checked_once_are_still_checked_every_time():
    """collate checks its layout options once per set of them: a bad option that equals a good
    one (True for 1, 2.0 for 2) or cannot be a cache key is refused all the same."""
    samples = [sample(np.random.default_rng(0), 8, [3])]
    good = collate(samples, cp_size=2, cp_rank=1)
    assert batch_layout(True, 2, 1, False) is batch_layout(True, 2, 1, False)
    collate(samples, cp_size=1)  # the good options the bad ones equal, checked and kept
    collate(samples, cp_size=2)
    for _ in range(2):
        for bad in (True, 2.0, [2]):
            with pytest.raises((TypeError, ValueError)) as caught:
                collate(samples, cp_size=bad)
            with pytest.raises(type(caught.value)):
                BatchLayout(True, bad, None, False)
    again = collate(samples, cp_size=2, cp_rank=1)
    assert good.keys() == again.keys()
    assert all(torch.equal(good[k], again[k]) for k in good if isinstance(good[k], torch.Tensor))


def test_data_collator_gives_the_flash_form_at_the_padded_boundaries():
    samples = [sample(np.random.default_rng(2), 12, [5, 7]) for _ in range(2)]
    batch = collate(samples, cp_size=2)
    out = DataCollator("flash_attention_2", cp_size=2)(samples)
    assert torch.equal(out["cu_seq_lens_q"], batch["cu_seqlens_padded"])
    assert out["max_length_q"] == batch["max_seqlen"]
    assert torch.equal(out["input_ids"], batch["input_ids"])
    assert torch.equal(out["cp_indices"], batch["cp_indices"])
    assert torch.equal(out["loss_mask"], batch["loss_mask"])
    share = DataCollator("flash_attention_2", cp_size=2, cp_rank=1)(samples)
    assert torch.equal(share["input_ids"], batch["input_ids"][:, batch["cp_indices"][1]])
