"""The Feistel round keys of an epoch against their twin."""

from __future__ import annotations

import numpy as np
from reference import ref_keys

from mmpack._src.core.permutation_keys import ROUNDS, epoch_keys


def test_epoch_keys_match_permutations():
    epochs = np.array([0, 1, 5, 2**63 + 7], dtype=np.uint64)
    keys = epoch_keys((3, 1), epochs)
    assert keys.shape == (4, ROUNDS) and keys.dtype == np.uint64
    for g, e in enumerate(epochs.tolist()):
        assert keys[g].tolist() == ref_keys((3, 1), e)
