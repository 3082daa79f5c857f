"""Specification of :mod:`mmpack._src.sampling.permutation` (the keys and the kernel it runs have
their own files)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import ref_permute

from mmpack import Permutation
from mmpack._src.core.permutation_keys import MAX_N

# -- the pure-Python twin of the construction ------------------------------------------------------

# -- bijection ---------------------------------------------------------------------------------------

_SIZES = sorted(
    {1, 2, 3, 5, 7, 11, 13, 97, 101, 1009, 65521}
    | {2**k + d for k in range(1, 17) for d in (-1, 0, 1)}
)


@pytest.mark.parametrize("n", _SIZES)
def test_bijection_and_inverse(n):
    for seed, epoch in [(0, 0), (7, 3)]:
        perm = Permutation(n, seed=seed, epoch=epoch)
        image = perm.map(np.arange(n))
        assert image.dtype == np.int64
        np.testing.assert_array_equal(np.sort(image), np.arange(n))
        np.testing.assert_array_equal(perm.inverse_map(image), np.arange(n))


def test_bijection_exhaustive_million():
    n = 10**6
    perm = Permutation(n, seed=12345)
    image = perm.map(np.arange(n))
    np.testing.assert_array_equal(np.sort(image), np.arange(n))
    assert not np.array_equal(image, np.arange(n))
    assert list(perm)[:1000] == image[:1000].tolist()


def test_large_domain_round_trip():
    perm = Permutation(MAX_N, seed=1, epoch=2)
    idx = np.array([0, 1, 2, MAX_N // 2, MAX_N - 2, MAX_N - 1], dtype=np.int64)
    image = perm.map(idx)
    assert np.all((image >= 0) & (image < MAX_N))
    assert len(set(image.tolist())) == idx.size
    np.testing.assert_array_equal(perm.inverse_map(image), idx)
    assert perm[-1] == int(image[-1])


# -- kernels agree with each other and with the twin --------------------------------------------------


@given(
    n=st.one_of(st.integers(1, 300), st.integers(1, MAX_N)),
    seed=st.one_of(
        st.integers(0, 2**64 - 1), st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 9))
    ),
    epoch=st.integers(0, 2**64 - 1),
    data=st.data(),
)
def test_vectorised_scalar_and_twin_agree(n, seed, epoch, data):
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12))
    perm = Permutation(n, seed=seed, epoch=epoch)
    vec = perm.map(np.asarray(idx, dtype=np.int64)).tolist()
    scalar = [perm[i] for i in idx]
    twin = [ref_permute(i, n, seed, epoch) for i in idx]
    assert vec == scalar == twin
    assert [perm.inverse(j) for j in vec] == idx
    assert [ref_permute(j, n, seed, epoch, inverse=True) for j in vec] == idx


def test_small_n_fully_matches_twin():
    for n in (2, 3, 4, 5, 17, 64):
        perm = Permutation(n, seed=99, epoch=1)
        assert list(perm) == [ref_permute(i, n, 99, 1) for i in range(n)]


# -- keys ----------------------------------------------------------------------------------------------


def test_seeds_and_epochs_give_different_orders():
    n = 1000
    orders = {
        tuple(Permutation(n, seed=s, epoch=e).map(np.arange(n)).tolist())
        for s in (0, 1, 2, 2**40)
        for e in (0, 1, 2)
    }
    assert len(orders) == 12
    tuples = {tuple(Permutation(n, seed=(5, k)).map(np.arange(n)).tolist()) for k in range(4)}
    assert len(tuples) == 4


def test_deterministic_and_pure():
    a = Permutation(10**9, seed=3, epoch=4)
    b = Permutation(10**9, seed=3, epoch=4)
    idx = np.arange(0, 10**9, 10**5, dtype=np.int64)
    np.testing.assert_array_equal(a.map(idx), b.map(idx))
    assert a == b and hash(a) == hash(b)
    assert a != Permutation(10**9, seed=3, epoch=5)


def test_seed_encoding_is_injective():
    # (1, 2) with epoch 3 must not collide with 1 with epoch 2, nor with (1, 2, 3).
    n = 10**6
    idx = np.arange(64)
    seen = {
        tuple(Permutation(n, seed=s, epoch=e).map(idx).tolist())
        for s, e in [((1, 2), 3), (1, 2), ((1, 2, 3), 0), ((1, 2, 0), 3), (2**32, 0), ((0, 1), 0)]
    }
    assert len(seen) == 6


# -- statistical quality ---------------------------------------------------------------------------------


def _chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def test_position_of_element_zero_is_uniform():
    n, trials = 16, 8000
    positions = np.array([Permutation(n, seed=s).inverse(0) for s in range(trials)])
    images = np.array([Permutation(n, seed=7, epoch=e)[0] for e in range(trials)])
    # 15 degrees of freedom: P(chi2 > 45) is about 1e-4.
    assert _chi_square(np.bincount(positions, minlength=n)) < 45
    assert _chi_square(np.bincount(images, minlength=n)) < 45


def test_large_n_images_spread_evenly():
    n = 10**11 + 7
    perm = Permutation(n, seed=2024)
    image = perm.map(np.arange(40_000, dtype=np.int64))
    buckets = np.bincount((image * 20 // n).astype(np.int64), minlength=20)
    assert _chi_square(buckets) < 60  # 19 degrees of freedom
    # consecutive inputs are not mapped to nearby outputs
    assert np.median(np.abs(np.diff(image))) > n / 10


def test_pairs_are_not_correlated_across_epochs():
    n = 1000
    a = Permutation(n, seed=0, epoch=0).map(np.arange(n))
    b = Permutation(n, seed=0, epoch=1).map(np.arange(n))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15
    assert (a == b).sum() < 10  # about 1 fixed coincidence expected


# -- API -----------------------------------------------------------------------------------------------


def test_indexing_rules():
    perm = Permutation(10, seed=1)
    assert len(perm) == 10 and perm.n == 10
    assert perm[-1] == perm[9] and perm[-10] == perm[0]
    assert perm[np.int64(3)] == perm[3]
    for bad in (10, -11, 2**70):
        with pytest.raises(IndexError, match="out of range"):
            perm[bad]
    for bad in (1.0, "1", True, None):
        with pytest.raises(TypeError, match="index"):
            perm[bad]
    with pytest.raises(IndexError):
        perm.inverse(10)
    assert perm.inverse(-1) == perm.inverse(9)


def test_map_validation_and_shapes():
    perm = Permutation(100, seed=0)
    grid = np.arange(100).reshape(10, 10)
    out = perm.map(grid)
    assert out.shape == (10, 10) and out.dtype == np.int64
    np.testing.assert_array_equal(out.reshape(-1), perm.map(np.arange(100)))
    np.testing.assert_array_equal(perm.map(np.arange(5, dtype=np.uint8)), perm.map(np.arange(5)))
    assert perm.map(np.empty(0, dtype=np.int64)).shape == (0,)
    with pytest.raises(IndexError, match=r"\[0, 100\)"):
        perm.map(np.array([0, 100]))
    with pytest.raises(IndexError):
        perm.map(np.array([-1]))
    with pytest.raises(TypeError, match="integer"):
        perm.map(np.array([0.5]))
    with pytest.raises(TypeError, match="integer"):
        perm.map(np.array([True]))


def test_degenerate_sizes():
    empty = Permutation(0, seed=0)
    assert len(empty) == 0 and list(empty) == []
    assert empty.map(np.empty(0, dtype=np.int64)).size == 0
    with pytest.raises(IndexError):
        empty[0]
    one = Permutation(1, seed=5, epoch=9)
    assert one[0] == 0 and one[-1] == 0 and one.inverse(0) == 0
    assert one.map(np.zeros(3, dtype=np.int64)).tolist() == [0, 0, 0]
    two = Permutation(2, seed=5)
    assert sorted(two) == [0, 1]


def test_constructor_validation():
    with pytest.raises(ValueError, match="n must be in"):
        Permutation(-1, seed=0)
    with pytest.raises(ValueError, match="n must be in"):
        Permutation(MAX_N + 1, seed=0)
    with pytest.raises(TypeError, match="n must be an int"):
        Permutation(10.0, seed=0)
    with pytest.raises(TypeError, match="n must be an int"):
        Permutation(True, seed=0)
    with pytest.raises(ValueError, match="seed"):
        Permutation(10, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        Permutation(10, seed=1.5)
    with pytest.raises(ValueError, match="epoch"):
        Permutation(10, seed=0, epoch=-1)


def test_pickles_small_and_equal():
    perm = Permutation(10**12, seed=(3, 4), epoch=5)
    blob = pickle.dumps(perm)
    assert len(blob) < 300
    back = pickle.loads(blob)
    assert back == perm and back[12345] == perm[12345] and repr(back) == repr(perm)


@pytest.mark.parametrize("bad", [-1, MAX_N + 1])
def test_permutation_and_sampler_word_a_bad_n_alike(bad):
    from mmpack import ResumableSampler

    with pytest.raises(ValueError) as perm:
        Permutation(bad, seed=0)
    with pytest.raises(ValueError) as sampler:
        ResumableSampler(bad)
    assert str(perm.value) == str(sampler.value) == f"n must be in [0, 2**62], got n={bad}"
    with pytest.raises(ValueError, match=r"epoch must be in \[0, 2\*\*64\), got epoch=-1"):
        Permutation(3, seed=0, epoch=-1)
    with pytest.raises(ValueError, match=r"epoch must be in \[0, 2\*\*64\), got epoch=-1"):
        ResumableSampler(3).set_epoch(-1)
