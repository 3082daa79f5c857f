"""The torch split of a packed batch (mmpack._src.torch.microbatch): trimmed rows' cu_seqlens are
marked dynamic for torch.compile when asked.  The splits' common behaviour, numpy and torch
parametrized, is tested in streaming/test_microbatch.py."""

from __future__ import annotations

import torch
from _packer import packed_batch as packed

from mmpack._src.torch import microbatch as torch_micro


def test_torch_split_marks_trimmed_rows_dynamic(monkeypatch):
    marked = []
    monkeypatch.setattr(torch._dynamo, "mark_dynamic", lambda t, dim: marked.append((t, dim)))
    batch = packed("pt")
    micro = torch_micro.split_packed_batch(batch, padding_tolerance=0.0, mark_dynamic=True)
    assert [m["input_ids"].shape[0] for m in micro] == [6, 8, 0]
    assert [id(t) for t, _ in marked] == [id(micro[0]["cu_seqlens"]), id(micro[2]["cu_seqlens"])]
    assert all(isinstance(m["input_ids"], torch.Tensor) for m in micro)
    assert torch_micro.split_packed_batch(batch, mark_dynamic=False) and len(marked) == 2
