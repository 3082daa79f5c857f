"""Incoming batches (numpy arrays and Python lists) turned into flat sequences by the token rule, one pass."""

from __future__ import annotations

import numpy as np
import pytest

from mmpack import StreamingPacker
from mmpack._src.store.tokens import as_token_array
from mmpack._src.streaming.incoming import flat_sequences


@pytest.mark.parametrize(
    "items",
    [
        [[5, 6, 7], [], [8], (9, 10)],
        [[0, 1, 1, 0] * 50, [1] * 30, [2, 3]],  # many 0s and 1s: every element's type is read
        [[2**62, 3], [4]],
        [np.arange(4, dtype=np.int32), np.arange(3, dtype=np.uint8)],
    ],
)
def test_flat_sequences_keep_the_tokens(items):
    flat, lens = flat_sequences(items, 0)
    assert _tokens(flat, lens) == ([list(x) for x in items], [len(x) for x in items])
    assert flat.dtype.kind in "iu"


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        ([3, True], ValueError, "document 11 has a non-integer token True"),
        ([False, 3], ValueError, "non-integer token False"),
        ([3, 1.5], ValueError, "non-integer token 1.5"),
        ([3, "4"], ValueError, "document 11 holds <U21 values"),
        ([3, [4]], ValueError, "document 11"),
        ([3, np.True_], ValueError, "non-integer token"),
    ],
)
def test_lists_follow_the_token_rule(bad, exc, match):
    """A bad element anywhere in an incoming batch of lists is refused as build refuses it,
    naming its document, even when the other lists are plain (the one-pass path falls back)."""
    items = [[1, 2]] * 10 + [bad] + [[0, 1]] * 5
    with pytest.raises(exc, match=match):
        flat_sequences(items, 1)
    with pytest.raises(exc):
        as_token_array(bad, 11)


def test_integral_floats_and_numpy_scalars_in_lists_are_converted():
    items = [[1.0, 2.0], [np.int64(3), 4], [5, 6]]
    flat, lens = flat_sequences(items, 0)
    assert _tokens(flat, lens) == ([[1, 2], [3, 4], [5, 6]], [2, 2, 2])


def test_bad_arrays_take_the_exact_path():
    with pytest.raises(TypeError, match="document 1 has shape"):
        flat_sequences([np.arange(3), np.ones((2, 2), dtype=np.int64)], 0)
    with pytest.raises(TypeError, match="document 0"):
        flat_sequences([np.int64(3), np.arange(2)], 0)
    with pytest.raises(ValueError, match="non-integer token 0.5"):
        flat_sequences([np.arange(3), np.full(2, 0.5)], 0)


def test_uint64_tokens_beyond_int64_are_refused():
    docs = [np.array([2**63 + 1, 3], dtype=np.uint64)]
    with pytest.raises(ValueError, match=r"< 2\*\*63"):
        list(StreamingPacker(docs, batch_size=1, seqlen=4, buffer_size=1))


def test_flat_sequences_joins_and_checks_like_flat_sequences():
    items = [
        np.arange(4, dtype=np.int32),
        np.arange(3, dtype=np.uint8),
        np.arange(0, dtype=np.int8),
    ]
    flat, lens = flat_sequences(items, 0)
    assert flat.tolist() == [0, 1, 2, 3, 0, 1, 2] and lens.tolist() == [4, 3, 0]
    assert flat.dtype == np.int32
    flat, lens = flat_sequences([[5, 6], (7,), []], 0)
    assert flat.tolist() == [5, 6, 7] and flat.dtype == np.int64 and lens.tolist() == [2, 1, 0]
    # int64 with uint64 (numpy would give float64): int64, an id >= 2**63 refused naming it
    flat, _ = flat_sequences([np.arange(2), np.arange(2, dtype=np.uint64)], 0)
    assert flat.dtype == np.int64 and flat.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match=str(2**63 + 1)):
        flat_sequences([np.arange(2), np.array([2**63 + 1], dtype=np.uint64)], 0)
    with pytest.raises(ValueError, match="document 11 has a non-integer token True"):
        flat_sequences([[1, 2]] * 10 + [[3, True]], 1)
    with pytest.raises(TypeError, match="document 1 has shape"):
        flat_sequences([np.arange(3), np.ones((2, 2), dtype=np.int64)], 0)
    spare = np.full(10, -1, dtype=np.int32)
    flat, _ = flat_sequences(items, 0, lambda dt, n: spare[:n] if dt == np.int32 else None)
    assert flat.base is spare and spare[:7].tolist() == [0, 1, 2, 3, 0, 1, 2]


def test_two_d_arrays_in_a_batch_are_refused_by_name():
    flat, _ = flat_sequences([np.arange(3), np.arange(2)], 0)
    assert flat.tolist() == [0, 1, 2, 0, 1]
    for items in (
        [np.ones((2, 1), dtype=np.int64), np.ones((3, 1), dtype=np.int64)],
        [np.ones((2, 2), dtype=np.int32)] * 2,
    ):
        with pytest.raises(TypeError, match="document 0 has shape"):
            flat_sequences(items, 0)


# =========================================================================== one pass per batch
def _tokens(flat, lens):
    ends = np.cumsum(lens).tolist()
    return [flat[e - n : e].tolist() for e, n in zip(ends, lens.tolist())], lens.tolist()
