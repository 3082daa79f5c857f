"""Specification of :mod:`mmpack._src.views.cp_layout`: the padded layout of a batch's segments
and each rank's zigzag share, against TransformerEngine's partition (a reference written from its
``thd_get_partitioned_indices`` kernel) and the padded batch built token by token, through
:class:`mmpack.torch.Collator`.

Run: ``pytest tests/views/test_cp_layout.py``.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from _cp_batches import FIELDS, IGNORE, PAD, batches
from hypothesis import given, settings
from hypothesis import strategies as st

from mmpack._src.views.cp_layout import CPLayout, cp_layout, zigzag_indices
from mmpack.torch import Collator


def te_partitioned_indices(cu_seqlens_padded, total_tokens, world_size, rank):
    """TransformerEngine's ``thd_get_partitioned_indices`` (``thd_partition_indices_kernel`` of
    ``transformer_engine/common/fused_attn/thd_utils``), one token at a time: token ``t`` of the
    rank's share lies in sequence ``s`` (binary search over ``cu_seqlens_padded / world_size``),
    at ``i`` in it; the first half of the share takes chunk ``rank``, the second chunk
    ``2 * world_size - 1 - rank``."""
    cu = [int(c) // world_size for c in cu_seqlens_padded]
    out = []
    for t in range(total_tokens // world_size):
        s = bisect.bisect_right(cu, t) - 1
        length = cu[s + 1] - cu[s]
        i = t - cu[s]
        offset = rank if i < length // 2 else 2 * world_size - 2 - rank
        out.append(i + cu[s] * world_size + length // 2 * offset)
    return out


def padded_slow(samples, cp_size):
    """The padded batch built token by token: each segment's tokens, then its padding."""
    out = {k: [] for k in FIELDS}
    real, padded = [0], [0]
    for s in samples:
        cu = [int(c) for c in s["cu_seqlens"]]
        for a, b in zip(cu[:-1], cu[1:]):
            p = -(-(b - a) // (2 * cp_size)) * 2 * cp_size
            for j in range(p):
                if a + j < b:
                    t = a + j
                    out["input_ids"].append(int(s["input_ids"][t]))
                    out["position_ids"].append(int(s["position_ids"][t]))
                    out["targets"].append(int(s["labels"][t]))
                    out["attention_mask"].append(int(s["attention_mask"][t]))
                else:
                    out["input_ids"].append(PAD)
                    out["position_ids"].append(int(s["position_ids"][a]) + j)
                    out["targets"].append(IGNORE)
                    out["attention_mask"].append(0)
                out["loss_mask"].append(float(out["targets"][-1] != IGNORE))
            real.append(real[-1] + b - a)
            padded.append(padded[-1] + p)
    return out, real, padded


@settings(max_examples=60, deadline=None)
@given(samples=batches(), cp_size=st.integers(1, 4))
def test_shares_are_te_partition_of_the_padded_batch_built_token_by_token(samples, cp_size):
    full = Collator(cp_size=cp_size, pad_id=PAD)(samples)
    want, real, padded = padded_slow(samples, cp_size)
    for key in FIELDS:
        assert full[key].shape == (1, padded[-1])
        assert full[key][0].tolist() == want[key], key
    assert full["cu_seqlens"].tolist() == real and full["cu_seqlens"].dtype == torch.int32
    assert full["cu_seqlens_padded"].tolist() == padded
    assert full["cu_seqlens_padded"].dtype == torch.int32
    assert full["max_seqlen"] == max(np.diff(padded)) and isinstance(full["max_seqlen"], int)
    assert full["cp_padding"] == padded[-1] - real[-1]
    assert full["cp_indices"].shape == (cp_size, padded[-1] // cp_size)
    rebuilt = {key: torch.full_like(full[key], -1) for key in FIELDS}
    for r in range(cp_size):
        te = te_partitioned_indices(padded, padded[-1], cp_size, r)
        assert full["cp_indices"][r].tolist() == te
        share = Collator(cp_size=cp_size, cp_rank=r, pad_id=PAD)(samples)
        for key in FIELDS:
            assert share[key][0].tolist() == [want[key][t] for t in te], key
            rebuilt[key][0, te] = share[key][0]
        assert share["cu_seqlens_padded"].tolist() == padded and "cp_indices" not in share
    for key in FIELDS:  # every rank's share together is the padded batch
        assert torch.equal(rebuilt[key], full[key])


def test_worked_example_of_the_layout():
    layout = cp_layout(np.array([0, 3, 8]), 2)
    assert isinstance(layout, CPLayout) and layout.max_seqlen == 8
    assert layout.cu_seqlens_padded.tolist() == [0, 4, 12] and layout.padding == 4
    assert zigzag_indices(layout.cu_seqlens_padded, 2, 0).tolist() == [0, 3, 4, 5, 10, 11]
    assert zigzag_indices(layout.cu_seqlens_padded, 2, 1).tolist() == [1, 2, 6, 7, 8, 9]
