"""``mmpack demo`` and the packing comparison it prints."""

from __future__ import annotations

import time

import numpy as np
import pytest
from _cli import mmpack_cmd

import mmpack
import mmpack.errors
from mmpack.cli import compare_packing


def test_compare_packing_baselines_by_hand():
    rows = {r["method"]: r for r in compare_packing([3, 0, 9, 4], 5, add_eot=True)}
    # slots 4, 1, 10, 5 -> 20 tokens; padding: 1 + 1 + 2 + 1 rows
    assert (rows["pad"]["rows"], rows["pad"]["tokens"], rows["pad"]["docs_cut"]) == (5, 20, 1)
    # chunk: [0,4) [4,5) [5,15) [15,20) over rows of 5 -> only the 10-slot document is cut
    assert (rows["chunk"]["rows"], rows["chunk"]["docs_cut"]) == (4, 1)
    assert rows["chunk"]["efficiency"] == 1.0 and rows["pad"]["efficiency"] == 20 / 25
    assert rows["bfd"]["tokens"] == 20 and rows["bfd"]["rows"] >= 4
    drop = {r["method"]: r for r in compare_packing([3, 0, 9, 4], 5, long_docs="drop")}
    assert drop["pad"]["tokens"] == 10 == drop["bfd"]["tokens"]


@pytest.mark.slow
def test_demo(tmp_path):
    t0 = time.perf_counter()
    res = mmpack_cmd("demo", "--out", tmp_path, script=True, timeout=300)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "== 1. Build" in out and "uint8" in out
    assert "seqlen 8, stride 4: 28 samples" in out
    for method in ("bfd", "online", "pad", "chunk"):
        assert method in out
    assert "seqlen 2048:" in out and "seqlen 8192:" in out and "cu_seqlens [0," in out
    assert "p50" in out and "M tokens/s" in out
    store = mmpack.open(tmp_path / "stdlib")
    assert store.dtype == np.uint8 and len(store) > 1000
    assert elapsed < 60
