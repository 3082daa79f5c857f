"""The keyed permutation kernel against ``Permutation`` of each group's epoch."""

from __future__ import annotations

import numpy as np

from mmpack import Permutation
from mmpack._src.core.permutation_keys import epoch_keys
from mmpack._src.kernels.permutation import permute_many_keyed


def test_keyed_kernel_matches_permutations():
    n = 1000
    epochs = np.array([0, 3, 9], dtype=np.int64)
    keys = epoch_keys(7, epochs)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n, 500)
    group = rng.integers(0, 3, 500)
    out = np.empty_like(idx)
    perm = Permutation(n, seed=7)
    permute_many_keyed(idx, group, out, n, perm._half_bits, perm._mask, keys)
    expected = [Permutation(n, seed=7, epoch=int(epochs[g]))[i] for i, g in zip(idx, group)]
    assert out.tolist() == expected
