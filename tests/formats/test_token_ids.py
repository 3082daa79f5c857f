"""Foreign token ids (mmpack._src.formats.token_ids): signed files' negative ids are refused at
open and by verify(), naming the count and the first."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import mmpack
from mmpack.errors import FormatError

pytestmark = pytest.mark.usefixtures("foreign_cache")


def test_negative_ids_are_refused_at_open_and_by_verify(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.array([5, -1, 0, 7, 0], dtype=np.int32))
    with pytest.raises(FormatError, match=r"1 negative token ids \(the first at token 1: -1"):
        mmpack.open(path, eos=0)
    meta = tmp_path / "t.csv.gz"
    with gzip.open(meta, "wt") as f:
        f.write("0,3\n3,5\n")
    with pytest.raises(FormatError, match="negative token ids"):
        mmpack.open(path, format="eos-separated", metadata=meta)
    # a file that was fine at open and then got a negative id: verify() refuses it
    np.save(path, np.array([5, 1, 0, 7, 0], dtype=np.int32))
    store = mmpack.open(path, eos=0)
    assert store[0].tolist() == [5, 1, 0] and store.dtype == np.dtype("<u4")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 8)
        f.write(np.int32(-3).tobytes())
    with pytest.raises(FormatError, match=r"1 negative token ids \(the first at token 3: -3"):
        store.verify()
