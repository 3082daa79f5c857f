"""The store kernels against their slow Python twins: XXH64 (the published algorithm, checked on
known digests too) and the build's convert-and-check pass.

Run: ``pytest tests/kernels/test_store.py`` (``make test`` reruns it with NUMBA_BOUNDSCHECK=1).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import convert_slow, xxh64_slow

from mmpack._src.kernels.store import convert_tokens
from mmpack._src.store.integrity import stripe_digest, stripe_digests

# Digests from the reference implementation (the ``xxhash`` package, XXH64, seed 0).
KNOWN = [
    (b"", 0xEF46DB3751D8E999),
    (b"a", 0xD24EC4F1A98C6E5B),
    (b"abc", 0x44BC2CF5AD770999),
    (b"0123456789abcdef0123456789abcdef", 0x642A94958E71E6C5),
    (bytes(range(100)), 0x6AC1E58032166597),
    (b"mmpack" * 11, 0xF2F2A64C3AF94610),
]


@pytest.mark.parametrize(("data", "digest"), KNOWN)
def test_xxh64_known_digests(data, digest):
    assert xxh64_slow(data) == digest
    assert stripe_digest(data) == digest
    assert stripe_digest(np.frombuffer(data, dtype=np.uint8)) == digest


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 7))
def test_xxh64_kernel_matches_its_twin(data, skip):
    """Any length (every tail case), from bytes or from an unaligned numpy view."""
    assert stripe_digest(data) == xxh64_slow(data)
    padded = np.frombuffer(bytes(skip) + data, dtype=np.uint8)[skip:]  # unaligned for skip > 0
    assert stripe_digest(padded) == xxh64_slow(data)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.data())
def test_xxh64_detects_any_flipped_bit(data, draw):
    i = draw.draw(st.integers(0, len(data) - 1))
    bit = draw.draw(st.integers(0, 7))
    flipped = bytearray(data)
    flipped[i] ^= 1 << bit
    assert stripe_digest(bytes(flipped)) != stripe_digest(data)


def test_block_digests_refuses_a_block_not_a_multiple_of_8():
    with pytest.raises(ValueError, match="block must be a positive multiple of 8"):
        stripe_digests(b"mmpack", 12)


# ----------------------------------------------------------------------------- convert_tokens
_SRC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(_SRC),
    st.sampled_from(["<u1", "<u2", "<u4", "<u8"]),
    st.integers(0, 9000),
    st.data(),
)
def test_convert_tokens_matches_its_twin(src_dtype, out_dtype, n, draw):
    """Stops at the first value outside [lo, hi] (strips of 4096 tokens: bad values in the
    first, a later or the last strip), and copies exactly the values before it."""
    info, out_info = np.iinfo(src_dtype), np.iinfo(out_dtype)
    top = min(int(info.max), int(out_info.max))
    hi = draw.draw(st.integers(0, top))
    rng = np.random.default_rng(draw.draw(st.integers(0, 2**32)))
    src = rng.integers(0, hi + 1, size=n, dtype=np.uint64).astype(src_dtype)
    for _ in range(draw.draw(st.integers(0, 3))):  # plant bad values
        if n:
            low = int(info.min) < 0
            v = -1 if low and rng.random() < 0.5 else (hi + 1 if hi < int(info.max) else None)
            if v is not None:
                src[int(rng.integers(0, n))] = v
    got_out = np.zeros(n, dtype=out_dtype)
    want_out = np.zeros(n, dtype=out_dtype)
    t = np.dtype(src_dtype).type
    got = convert_tokens(src, got_out, t(0), t(hi))
    want = convert_slow(src, want_out, 0, hi)
    assert got == want
    assert np.array_equal(got_out[:got], want_out[:want])


def test_convert_tokens_on_a_strided_view():
    src = np.arange(20, dtype=np.int64)[::2]
    out = np.zeros(10, dtype=np.uint16)
    assert convert_tokens(src, out, np.int64(0), np.int64(65535)) == 10
    assert out.tolist() == list(range(0, 20, 2))
