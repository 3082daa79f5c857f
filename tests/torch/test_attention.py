"""Specification of :mod:`mmpack._src.torch.attention`: a packed row attends like its documents alone.

Run: ``.venv/bin/python -m pytest tests/torch/test_attention.py -q``.

FlexAttention runs here eagerly on the CPU (torch's unfused reference path: it evaluates the
``mask_mod`` densely), so the BlockMask's *block structure* is checked separately against the
dense mask; the compiled kernel, which does skip blocks, is exercised by
``benchmarks/gpu_check.py`` on a GPU.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.torch.attention import batched_document_ids
from mmpack.torch import (
    batched_block_causal_mask,
    block_causal_mask,
    collate,
    document_ids,
    document_mask_mod,
    flex_document_mask,
)

# --- slow, obviously-right references -------------------------------------------------------


def _ref_ids(cu: list[int], seqlen: int) -> list[int]:
    ids = []
    for p in range(seqlen):
        for i in range(len(cu) - 1):
            if cu[i] <= p < cu[i + 1]:
                ids.append(i)
                break
    return ids


def _ref_mask(cu: list[int], seqlen: int, causal: bool) -> list[list[bool]]:
    ids = _ref_ids(cu, seqlen)
    return [
        [ids[q] == ids[k] and (not causal or q >= k) for k in range(seqlen)] for q in range(seqlen)
    ]


def _per_document_attention(q, k, v, cu: list[int], causal: bool) -> torch.Tensor:
    """Reference: attention run on each segment alone.  ``q, k, v``: (H, S, D)."""
    out = torch.empty_like(q)
    for s, e in zip(cu[:-1], cu[1:]):
        if e > s:
            out[:, s:e] = F.scaled_dot_product_attention(
                q[:, s:e], k[:, s:e], v[:, s:e], is_causal=causal
            )
    return out


def _reference_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, causal: bool) -> torch.Tensor:
    """A varlen kernel written out: ``q, k, v`` (total, H, D) and FlashAttention's cu_seqlens."""
    out = torch.empty_like(q)
    cu = cu_seqlens.tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        seg = F.scaled_dot_product_attention(
            q[s:e].transpose(0, 1),
            k[s:e].transpose(0, 1),
            v[s:e].transpose(0, 1),
            is_causal=causal,
        )
        out[s:e] = seg.transpose(0, 1)
    return out


@st.composite
def _rows(draw, max_seqlen=24, max_rows=4):
    seqlen = draw(st.integers(1, max_seqlen))
    n = draw(st.integers(1, max_rows))
    rows = []
    for _ in range(n):
        cuts = draw(st.lists(st.integers(0, seqlen), max_size=5))
        rows.append([0, *sorted(cuts), seqlen])
    return seqlen, rows


# --- document ids and dense masks ------------------------------------------------------------


def test_worked_example_from_the_docstring():
    assert document_ids([0, 2, 5], 5).tolist() == [0, 0, 1, 1, 1]
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    m = block_causal_mask([0, 2, 5], 5)
    assert m.dtype == torch.bool and m.shape == (5, 5)
    assert m.int().tolist() == expected


@given(_rows(max_rows=1), st.booleans())
def test_single_row_matches_reference(spec, causal):
    seqlen, (cu,) = spec
    for form in (cu, np.array(cu, dtype=np.int32), torch.tensor(cu, dtype=torch.int32)):
        ids = document_ids(form, seqlen)
        assert ids.dtype == torch.int64 and ids.tolist() == _ref_ids(cu, seqlen)
        mask = block_causal_mask(form, seqlen, causal=causal)
        assert mask.tolist() == _ref_mask(cu, seqlen, causal)
        assert mask.diagonal().all()  # every query sees at least itself: no empty SDPA row


@given(_rows(), st.booleans())
def test_batched_forms_match_single_rows(spec, causal):
    seqlen, rows = spec
    ids = batched_document_ids(rows, seqlen)
    assert ids.shape == (len(rows), seqlen)
    masks = batched_block_causal_mask(rows, seqlen, causal=causal)
    assert masks.shape == (len(rows), 1, seqlen, seqlen) and masks.dtype == torch.bool
    for b, cu in enumerate(rows):
        assert ids[b].tolist() == _ref_ids(cu, seqlen)
        assert torch.equal(masks[b, 0], block_causal_mask(cu, seqlen, causal=causal))


def test_batched_forms_accept_collated_rows_and_2d_tensors():
    rows = [torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 5, 8], dtype=torch.int32)]
    from_list = batched_document_ids(rows, 8)
    from_2d = batched_document_ids(torch.stack(rows), 8)
    from_np = batched_document_ids(np.stack([r.numpy() for r in rows]), 8)
    assert torch.equal(from_list, from_2d) and torch.equal(from_list, from_np)
    assert from_list.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: document_ids([0, 3, 2, 5], 5), ValueError, "malformed"),
        (lambda: document_ids([1, 5], 5), ValueError, "malformed"),
        (lambda: document_ids([0, 4], 5), ValueError, "seqlen=5"),
        (lambda: document_ids([5], 5), ValueError, "at least 2"),
        (lambda: document_ids([0.0, 5.0], 5), ValueError, "integer"),
        (lambda: document_ids(torch.tensor([0.0, 5.0]), 5), ValueError, "integer"),
        (lambda: document_ids([0, 5], 0), ValueError, "seqlen=0"),
        (lambda: block_causal_mask([0, 5], True), ValueError, "seqlen=True"),
        (lambda: batched_document_ids([], 5), ValueError, "empty"),
        (lambda: batched_document_ids("05", 5), TypeError, "sequence"),
        (
            lambda: batched_document_ids(torch.zeros(2, 2, 2, dtype=torch.int64), 5),
            ValueError,
            "2-D",
        ),
        (
            lambda: batched_block_causal_mask([[0, 5], [0, 6, 5]], 5),
            ValueError,
            r"cu_seqlens_rows\[1\]",
        ),
        (lambda: document_mask_mod(torch.zeros(5)), ValueError, "2-D"),
        (lambda: flex_document_mask([[0, 5]], 5, block_size=0), ValueError, "block_size"),
    ],
)
def test_rejects_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- attention through the masks equals attention per document -------------------------------


def _packed_inputs(seed: int, cu: list[int], heads=2, dim=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    shape = (heads, cu[-1], dim)
    return tuple(torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))


ROWS = [
    [0, 5, 6, 19, 32],  # a one-token document in the middle
    [0, 1, 2, 3, 32],  # tiny documents, then a long one
    [0, 32],  # one document filling the row
    [0, 11, 27, 32],  # the last segment is padding
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cu", ROWS)
def test_sdpa_with_block_mask_equals_per_document_attention(cu, causal):
    q, k, v = _packed_inputs(0, cu)
    mask = block_causal_mask(cu, cu[-1], causal=causal)
    packed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not packed.isnan().any()
    torch.testing.assert_close(packed, _per_document_attention(q, k, v, cu, causal))


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_batched_mask_equals_per_document_attention(causal):
    q, k, v = (torch.stack(t) for t in zip(*[_packed_inputs(b, cu) for b, cu in enumerate(ROWS)]))
    masks = batched_block_causal_mask(ROWS, 32, causal=causal)
    packed = F.scaled_dot_product_attention(q, k, v, attn_mask=masks)
    for b, cu in enumerate(ROWS):
        torch.testing.assert_close(packed[b], _per_document_attention(q[b], k[b], v[b], cu, causal))


def test_padding_segment_attends_only_to_itself():
    cu = [0, 6, 10]  # positions 6..9 are padding
    q, k, v = _packed_inputs(1, cu)
    v = v.clone()
    v[:, :6] = 1e6  # a padding query that saw a real key would pick this up
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(cu, 10))
    assert not out.isnan().any()
    assert out[:, 6:].abs().max() < 100
    torch.testing.assert_close(out, _per_document_attention(q, k, v, cu, True))


def test_collated_varlen_form_reproduces_per_document_attention():
    """``collate``'s flat cu_seqlens driven through a reference varlen kernel (FlashAttention's
    contract) gives each document exactly the attention it would get alone."""
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)
    seqlen, heads, dim = 24, 2, 8
    samples, docs = [], []  # docs: (q, k, v) per document, each (len, H, D)
    for lengths in [[5, 9, 10], [24], [1, 1, 13, 3], [7, 11]]:
        pad = seqlen - sum(lengths)
        seg = lengths + ([pad] if pad else [])
        cu = np.concatenate([[0], np.cumsum(seg)]).astype(np.int32)
        pos = np.concatenate([np.arange(n) for n in seg])
        samples.append(
            {
                "input_ids": rng.integers(0, 100, seqlen),
                "position_ids": pos,
                "labels": rng.integers(0, 100, seqlen),
                "cu_seqlens": cu,
            }
        )
        for n in seg:
            docs.append(
                tuple(
                    torch.randn(n, heads, dim, generator=g, dtype=torch.float64) for _ in range(3)
                )
            )
    batch = collate(samples)
    q, k, v = (torch.cat([d[i] for d in docs]) for i in range(3))  # (B * seqlen, H, D)
    assert q.shape[0] == batch["input_ids"].numel() == int(batch["cu_seqlens"][-1])
    out = _reference_varlen_attention(q, k, v, batch["cu_seqlens"], causal=True)
    start = 0
    for dq, dk, dv in docs:
        n = dq.shape[0]
        alone = F.scaled_dot_product_attention(
            dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1), is_causal=True
        ).transpose(0, 1)
        torch.testing.assert_close(out[start : start + n], alone)
        start += n
    # The same flat tokens, viewed as (B, H, seqlen, D) rows, agree through the dense masks.
    rows = [t.view(len(samples), seqlen, heads, dim).transpose(1, 2) for t in (q, k, v)]
    masks = batched_block_causal_mask(batch["cu_seqlens_rows"], seqlen)
    dense = F.scaled_dot_product_attention(*rows, attn_mask=masks)
    torch.testing.assert_close(dense.transpose(1, 2).reshape_as(out), out)


# --- FlexAttention ----------------------------------------------------------------------------


def _flex_eager(q, k, v, block_mask):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        return flex.flex_attention(q, k, v, block_mask=block_mask)


FLEX_ROWS = [[0, 100, 101, 230, 300], [0, 300], [0, 7, 128, 129, 256, 260, 300]]


@pytest.mark.parametrize("causal", [True, False])
def test_flex_attention_with_document_mask_equals_per_document_attention(causal):
    seqlen = 300  # not a multiple of the 128 block size
    q, k, v = (
        torch.stack(t)
        for t in zip(
            *[_packed_inputs(b, cu, dim=16, dtype=torch.float32) for b, cu in enumerate(FLEX_ROWS)]
        )
    )
    bm = flex_document_mask(FLEX_ROWS, seqlen, causal=causal)
    assert bm.shape == (3, 1, seqlen, seqlen)
    out = _flex_eager(q, k, v, bm)
    assert not out.isnan().any()
    for b, cu in enumerate(FLEX_ROWS):
        torch.testing.assert_close(
            out[b], _per_document_attention(q[b], k[b], v[b], cu, causal), atol=2e-5, rtol=1e-4
        )


@given(_rows(max_seqlen=40), st.booleans(), st.sampled_from([4, 8, 16]))
def test_flex_mask_mod_and_block_structure_match_dense_mask(spec, causal, block):
    seqlen, rows = spec
    dense = batched_block_causal_mask(rows, seqlen, causal=causal)
    bm = flex_document_mask(rows, seqlen, causal=causal, block_size=block)
    # The mask_mod, evaluated at every (b, q, kv), is the dense mask.
    assert torch.equal(flex.create_mask(bm.mask_mod, len(rows), 1, seqlen, seqlen), dense)
    # Kernels evaluate it on whole blocks past seqlen: that must stay in bounds (no IndexError)
    # and never let a real position see a padded one.
    over = -(-seqlen // 128) * 128
    wide = flex.create_mask(bm.mask_mod, len(rows), 1, over, over)
    assert torch.equal(wide[..., :seqlen, :seqlen], dense)
    assert not wide[..., :seqlen, seqlen:].any() and not wide[..., seqlen:, :seqlen].any()
    # A block is listed iff some position in it may attend; a "full" block is all True.
    nb = -(-seqlen // block)
    padded = torch.zeros(len(rows), 1, nb * block, nb * block, dtype=torch.bool)
    padded[..., :seqlen, :seqlen] = dense
    tiles = padded.view(len(rows), 1, nb, block, nb, block)
    assert torch.equal(bm.to_dense().bool(), tiles.any(dim=(3, 5)))
    full = torch.zeros(len(rows), 1, nb, nb, dtype=torch.bool)
    for b in range(len(rows)):
        for i in range(nb):
            n = int(bm.full_kv_num_blocks[b, 0, i])
            full[b, 0, i, bm.full_kv_indices[b, 0, i, :n]] = True
    inside = torch.ones_like(padded)
    inside[..., seqlen:, :] = False
    inside[..., :, seqlen:] = False
    all_true = (padded | ~inside).view(len(rows), 1, nb, block, nb, block).all(dim=(3, 5))
    assert not (full & ~all_true).any()


def test_flex_single_row_broadcasts_over_the_batch():
    cu = torch.tensor([0, 40, 64], dtype=torch.int32)
    bm = flex_document_mask(cu, 64)
    assert bm.shape == (1, 1, 64, 64)
    q, k, v = (torch.randn(3, 2, 64, 16) for _ in range(3))
    out = _flex_eager(q, k, v, bm)
    for b in range(3):
        torch.testing.assert_close(
            out[b],
            _per_document_attention(q[b], k[b], v[b], cu.tolist(), True),
            atol=2e-5,
            rtol=1e-4,
        )


def test_flex_document_mask_explains_a_missing_flex_attention(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)
    with pytest.raises(ImportError, match="flex_attention.*batched_block_causal_mask"):
        flex_document_mask([[0, 8]], 8)
