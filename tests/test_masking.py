"""MLM corruption: the numba selection kernel against the obvious whole-array numpy version,
and the random replacements' distribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmpack.masking import excluded_ids, mlm_mask, random_allowed_tokens


def reference_mlm(ids, rng, mask_prob, mask_id, vocab_size, excluded, maskable, ignore=-100):
    """The specification, one numpy expression per rule (same random draws, same order)."""
    ids = np.asarray(ids, dtype=np.int64)
    u = rng.random(ids.shape)
    allowed = ~np.isin(ids, excluded)
    if maskable is not None:
        allowed &= maskable
    selected = allowed & (u < mask_prob)
    to_mask = selected & (u < 0.8 * mask_prob)
    to_random = selected & (u >= 0.8 * mask_prob) & (u < 0.9 * mask_prob)
    labels = np.where(selected, ids, ignore)
    masked = np.where(to_mask, mask_id, ids)
    n = int(to_random.sum())
    if n:
        allowed_ids = np.setdiff1d(np.arange(vocab_size), excluded)
        masked[to_random] = allowed_ids[rng.integers(0, allowed_ids.size, size=n)]
    return masked, labels


@given(
    ids=st.lists(st.integers(0, 40), min_size=0, max_size=300),
    mask_prob=st.floats(0, 1),
    specials=st.lists(st.integers(0, 45), max_size=5),
    seed=st.integers(0, 2**32),
    use_maskable=st.booleans(),
    two_d=st.booleans(),
)
def test_kernel_matches_reference(ids, mask_prob, specials, seed, use_maskable, two_d):
    vocab = 50
    ex = excluded_ids(vocab, specials, pad_id=0)
    arr = np.array(ids, dtype=np.int64)
    if two_d and arr.size % 2 == 0:
        arr = arr.reshape(2, -1)
    maskable = (np.arange(arr.size).reshape(arr.shape) % 3 != 0) if use_maskable else None
    got = mlm_mask(arr, rng=np.random.default_rng(seed), mask_prob=mask_prob, mask_id=99,
                   vocab_size=vocab, excluded=ex, maskable=maskable)
    want = reference_mlm(arr, np.random.default_rng(seed), mask_prob, 99, vocab, ex, maskable)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].shape == arr.shape


def test_fractions_over_a_million_tokens():
    ids = np.random.default_rng(0).integers(1, 1000, size=1 << 20)
    ex = excluded_ids(1000, [1, 2], pad_id=0)
    masked, labels = mlm_mask(ids, rng=np.random.default_rng(1), mask_prob=0.3, mask_id=1000,
                              vocab_size=1000, excluded=ex)
    sel = labels != -100
    maskable = ~np.isin(ids, ex)
    assert abs(sel.sum() / maskable.sum() - 0.3) < 0.003
    assert not sel[~maskable].any()
    frac_mask = (masked[sel] == 1000).mean()
    frac_keep = (masked[sel] == ids[sel]).mean()
    assert abs(frac_mask - 0.8) < 0.004 and abs(frac_keep - 0.1 - 0.1 / 999) < 0.004
    assert not np.isin(masked[sel & (masked != 1000)], ex).any()


def test_random_replacements_are_uniform_over_allowed_ids():
    ex = np.array([0, 3, 5, 9])
    draws = random_allowed_tokens(np.random.default_rng(0), 60000, 10, ex)
    values, counts = np.unique(draws, return_counts=True)
    assert values.tolist() == [1, 2, 4, 6, 7, 8]
    assert counts.min() > 9500 and counts.max() < 10500


def test_no_allowed_id_is_an_error():
    with pytest.raises(ValueError, match="vocab_size=2"):
        random_allowed_tokens(np.random.default_rng(0), 1, 2, np.array([0, 1]))
