"""The subset kernels (mmpack._src.kernels.subset): a document's part is a plain function of its
id and the seed, whatever the range it is computed in."""

from __future__ import annotations

import numpy as np

from mmpack._src.store.subset import split_keys


def test_split_parts_are_a_plain_function_of_id_and_seed():
    from mmpack._src.kernels.subset import split_parts

    ids = np.arange(1000, dtype=np.int64)
    half = np.array([2**63, 2**64 - 1], dtype=np.uint64)
    a, b, c = (np.empty(1000, dtype=np.int64) for _ in range(3))
    split_parts(ids, split_keys(0), half, a)
    split_parts(ids, split_keys(1), half, b)
    split_parts(ids[500:], split_keys(0), half, c[500:])
    assert not np.array_equal(a, b) and np.array_equal(a[500:], c[500:])
    assert 400 < int(a.sum()) < 600  # about half in each part
