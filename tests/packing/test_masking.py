"""MLM corruption: the counter-based kernel against a pure-Python twin of the same rule, and the
statistics the rule promises."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import mlm_slow, sample_key_slow

from mmpack._src.packing.masking import corrupt_rows, excluded_ids, row_keys


@given(
    rows=st.integers(1, 3),
    length=st.integers(0, 60),
    mask_prob=st.floats(0, 1),
    specials=st.lists(st.integers(0, 45), max_size=5),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**40),
)
def test_kernel_matches_reference(rows, length, mask_prob, specials, seed, epoch):
    vocab = 50
    rng = np.random.default_rng(seed % 2**32)
    ids = rng.integers(0, 45, size=(rows, length))
    maskable = rng.integers(0, 2, size=(rows, length))
    ex = excluded_ids(vocab, specials, pad_id=0)
    keys = row_keys(seed, epoch, np.arange(rows) + 7)
    assert keys.tolist() == [sample_key_slow(seed, epoch, i + 7) for i in range(rows)]
    want = mlm_slow(ids, maskable, keys.tolist(), mask_prob, 99, vocab, ex)
    got_ids = ids.copy()
    labels = corrupt_rows(
        got_ids, maskable, keys, mask_prob=mask_prob, mask_id=99, vocab_size=vocab, excluded=ex
    )
    np.testing.assert_array_equal(got_ids, want[0])
    np.testing.assert_array_equal(labels, want[1])


def test_fractions_over_a_million_tokens():
    ids = np.random.default_rng(0).integers(1, 1000, size=(256, 4096))
    orig = ids.copy()
    ex = excluded_ids(1000, [1, 2], pad_id=0)
    labels = corrupt_rows(
        ids,
        np.ones_like(ids),
        row_keys(3, 0, np.arange(256)),
        mask_prob=0.3,
        mask_id=1000,
        vocab_size=1000,
        excluded=ex,
    )
    sel = labels != -100
    maskable = ~np.isin(orig, ex)
    assert abs(sel.sum() / maskable.sum() - 0.3) < 0.003
    assert not sel[~maskable].any()
    assert (labels[sel] == orig[sel]).all()
    frac_mask = (ids[sel] == 1000).mean()
    frac_keep = (ids[sel] == orig[sel]).mean()
    assert abs(frac_mask - 0.8) < 0.004 and abs(frac_keep - 0.1 - 0.1 / 997) < 0.004
    replaced = ids[sel & (ids != 1000) & (ids != orig)]
    assert not np.isin(replaced, ex).any()
    # Random replacements are uniform over the allowed ids (ten buckets of ~3,100 draws).
    counts = np.bincount(replaced // 100, minlength=10)
    expected = replaced.size * np.array([97] + [100] * 9) / 997  # ids 0, 1, 2 are excluded
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected).max()


def test_rows_depend_only_on_their_key():
    ids = np.tile(np.random.default_rng(1).integers(5, 90, size=64), (4, 1))
    ex = excluded_ids(100, [1], pad_id=0)

    def run(keys):
        x = ids.copy()
        corrupt_rows(
            x, np.ones_like(x), keys, mask_prob=0.5, mask_id=99, vocab_size=100, excluded=ex
        )
        return x

    a = run(row_keys(0, 0, np.array([0, 1, 2, 3])))
    b = run(row_keys(0, 0, np.array([3, 1, 0, 2])))
    np.testing.assert_array_equal(a[[3, 1, 0, 2]], b)
    assert not np.array_equal(a, run(row_keys(0, 1, np.arange(4))))


def test_no_allowed_id_is_an_error():
    x = np.zeros((1, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="vocab_size=2"):
        corrupt_rows(
            x,
            np.ones_like(x),
            row_keys(0, 0, np.arange(1)),
            mask_prob=0.5,
            mask_id=1,
            vocab_size=2,
            excluded=np.array([0, 1]),
        )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 3),
    length=st.integers(0, 70),
    mask_prob=st.one_of(st.floats(0, 1), st.sampled_from([0.0, 0.15, 0.3, 0.5, 1.0])),
    n_specials=st.integers(0, 40),
    wide=st.booleans(),
    dtype=st.sampled_from([np.int64, np.int32]),
    seed=st.integers(0, 2**64 - 1),
)
def test_every_exclusion_path_matches_reference(
    rows, length, mask_prob, n_specials, wide, dtype, seed
):
    """The kernel checks exclusion three ways (one compare per id up to 16 ids, a bit table
    over their span, a binary search when the span exceeds 2**20 ids): each against the twin,
    with int32 and int64 rows, bool masks, and tokens outside ``[0, vocab_size)``."""
    vocab = (1 << 20) + 300 if wide else 300
    rng = np.random.default_rng(seed % 2**32)
    specials = rng.integers(0, 200, size=n_specials).tolist()
    if wide:
        specials.append(vocab - 7)  # a span over 2**20 ids: the search path beyond 16 ids
    ex = excluded_ids(vocab, specials, pad_id=0)
    pool = np.concatenate([ex, rng.integers(-3, 210, size=8), [vocab - 7, vocab + 2]])
    ids = rng.choice(pool, size=(rows, length)).astype(dtype)
    maskable = rng.integers(0, 2, size=(rows, length)).astype(bool)
    keys = row_keys(seed, 3, np.arange(rows))
    want = mlm_slow(ids.astype(np.int64), maskable, keys.tolist(), mask_prob, 299, vocab, ex)
    got = ids.copy()
    labels = corrupt_rows(
        got, maskable, keys, mask_prob=mask_prob, mask_id=299, vocab_size=vocab, excluded=ex
    )
    assert got.dtype == labels.dtype == dtype
    np.testing.assert_array_equal(got, want[0])
    np.testing.assert_array_equal(labels, want[1])
