"""The EOS scan kernel (``find_eos``) against its twin."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from reference import find_eos_slow

from mmpack._src.kernels.eos import find_eos


@given(
    st.lists(st.integers(0, 4), max_size=200),
    st.integers(0, 4),
    st.integers(0, 10**12),
    st.sampled_from(["<u1", "<u2", "<u4", "<u8"]),
)
def test_find_eos_matches_its_twin(values, eos, base, dtype):
    tokens = np.array(values, dtype=dtype)
    out = np.full(tokens.size, -1, dtype=np.int64)
    n = find_eos(tokens, eos, base, out)
    assert out[:n].tolist() == find_eos_slow(tokens, eos, base)
    assert (out[n:] == -1).all()
