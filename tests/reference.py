"""The slow, obviously right Python twins of mmpack's numba kernels, and the table pairing them.

Every kernel of :mod:`mmpack._src.kernels` is either an entry of :data:`PAIRS` (the kernel, or the
public function that wraps it, against its twin on the same random input) or listed in
:data:`COVERED_BY` (a helper kernel and the entry whose comparison runs it).
``tests/test_reference.py`` compares every entry by hypothesis and fails on any kernel in neither;
``python -m benchmarks.bench_kernels`` times both sides of every entry on a moderate input.

A twin is written for the reader: Python integers and lists, one element at a time, the
specification spelled out (exact fractions, the stream built token by token, linear scans where
the kernel searches).

Twins of what a view or feature serves (not of one kernel), used by one test file only, live
beside their tests instead:
``naive_windows`` (the window view, ``tests/views/test_window.py``), ``ref_sample`` (a packed row,
``tests/views/test_packed.py``), ``twin_window_labels`` / ``twin_packed_labels`` (loss-masked
labels, ``tests/test_lossmask_views.py``), ``padded_slow`` (context-parallel padding,
``tests/torch/test_cp_batch.py``), ``reference_share`` (a rank's share,
``tests/torch/test_sampler.py``), ``ref_order`` (the shuffled document order,
``tests/store/test_doc_order.py``), ``ref_region_blocks`` (the blocks of plan regions,
``tests/packing/test_region_cuts.py``) and ``eos_documents_slow`` (an EOS-separated file's
documents, ``tests/formats/test_eos_separated.py``); ``ref_regions`` / ``ref_slack`` (the region
cuts, used by ``tests/packing/test_region_cuts.py`` and ``tests/packing/test_plan_regions.py``)
live in ``tests/_plans.py``.

Run: ``pytest tests/test_reference.py`` (``make test`` reruns it with ``NUMBA_BOUNDSCHECK=1`` and
with ``NUMBA_DISABLE_JIT=1``).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
REPLACE = 0xD1B54A32D192ED03
IGNORE = -100


# =========================================================================== the table
@dataclass(frozen=True)
class Pair:
    """One kernel against its twin.

    ``inputs(rng, size)`` draws a random input of about ``size`` elements (a tuple of
    arguments, never written to); ``run_kernel(*args)`` runs the kernel (or ``via``, the public
    function wrapping it) on fresh outputs and returns what it computed as plain values;
    ``run_reference(*args)`` returns the same from the twin.  Where turning the kernel's
    outputs into those values is work of its own, ``run_kernel`` returns the raw outputs and
    ``finish`` converts them (the benchmark times ``run_kernel`` alone).  ``bench_size`` is the
    ``size`` of the benchmark's moderate input; ``slow`` marks the entries whose comparison
    takes longest (pytest's ``slow`` marker)."""

    kernel: str
    via: str
    reference: str
    inputs: Callable[[np.random.Generator, int], tuple[Any, ...]]
    run_kernel: Callable[..., Any]
    run_reference: Callable[..., Any]
    bench_size: int = 2_000
    slow: bool = False
    finish: Callable[[Any], Any] | None = None

    def kernel_values(self, args: tuple[Any, ...]) -> Any:
        """What the kernel side computed on ``args``, as the twin's values."""
        raw = self.run_kernel(*args)
        return raw if self.finish is None else self.finish(raw)


def assert_same(got: Any, want: Any, path: str = "result") -> None:
    """Equal values, recursively through tuples, lists, dicts and arrays (dtype-blind)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)) and not isinstance(got, np.ndarray):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=path)


def _ints(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).ravel().tolist()]


# =========================================================================== store
_P1, _P2, _P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
_P4, _P5 = 9650029242287828579, 2870177450012600261


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def _xxround(acc: int, word: int) -> int:
    return (_rotl((acc + word * _P2) & M64, 31) * _P1) & M64


def xxh64_slow(data: bytes, seed: int = 0) -> int:
    """XXH64 in plain Python, from the specification (xxhash's doc/xxhash_spec.md)."""
    n, p = len(data), 0

    def word(i: int) -> int:
        return int.from_bytes(data[i : i + 8], "little")

    if n >= 32:
        v = [(seed + _P1 + _P2) & M64, (seed + _P2) & M64, seed, (seed - _P1) & M64]
        while p + 32 <= n:
            v = [_xxround(v[k], word(p + 8 * k)) for k in range(4)]
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for lane in v:
            h = ((h ^ _xxround(0, lane)) * _P1 + _P4) & M64
    else:
        h = (seed + _P5) & M64
    h = (h + n) & M64
    while p + 8 <= n:
        h = (_rotl(h ^ _xxround(0, word(p)), 27) * _P1 + _P4) & M64
        p += 8
    if p + 4 <= n:
        h = (
            _rotl(h ^ (int.from_bytes(data[p : p + 4], "little") * _P1 & M64), 23) * _P2 + _P3
        ) & M64
        p += 4
    while p < n:
        h = (_rotl(h ^ (data[p] * _P5 & M64), 11) * _P1) & M64
        p += 1
    h ^= h >> 33
    h = (h * _P2) & M64
    h ^= h >> 29
    h = (h * _P3) & M64
    return h ^ (h >> 32)


def convert_slow(src: np.ndarray, out: np.ndarray, lo: int, hi: int) -> int:
    """Copy values into ``out`` up to the first outside ``[lo, hi]``; return its index."""
    for i, v in enumerate(src.tolist()):
        if v < lo or v > hi:
            return i
        out[i] = v
    return src.size


def first_decrease_slow(offsets: list[int]) -> int:
    return next((j for j in range(len(offsets) - 1) if offsets[j + 1] < offsets[j]), -1)


def _xxh64_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n = int(rng.integers(0, 8 * size + 40))
    return bytes(rng.integers(0, 256, n, dtype=np.uint8)), int(
        rng.integers(0, 2**64, dtype=np.uint64)
    )


def _xxh64_kernel(data: bytes, seed: int) -> int:
    from mmpack._src.kernels.store import xxh64

    raw = np.frombuffer(data, dtype=np.uint8)
    return int(xxh64(raw, raw[: raw.size // 8 * 8].view("<u8"), np.uint64(seed)))


def _xxh64_stripes_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    block = 8 * int(rng.integers(1, 9))
    n = int(rng.integers(0, block * (size + 3)))
    return bytes(rng.integers(0, 256, n, dtype=np.uint8)), block


def _xxh64_stripes_kernel(data: bytes, block: int) -> list[int]:
    from mmpack._src.kernels.store import xxh64_stripes

    raw = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(-(-raw.size // block), np.uint64)
    xxh64_stripes(raw, raw[: raw.size // 8 * 8].view("<u8"), block, out)
    return out.tolist()


def xxh64_stripes_slow(data: bytes, block: int) -> list[int]:
    """Each ``block`` bytes hashed on its own by :func:`xxh64_slow`."""
    return [xxh64_slow(data[k : k + block]) for k in range(0, len(data), block)]


_SRC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _convert_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    src_dtype = str(rng.choice(_SRC))
    out_dtype = str(rng.choice(["<u1", "<u2", "<u4", "<u8"]))
    info = np.iinfo(src_dtype)
    top = min(int(info.max), int(np.iinfo(out_dtype).max))
    hi = int(rng.integers(0, top, endpoint=True, dtype=np.uint64))
    n = int(rng.integers(0, 3 * size + 1))
    src = rng.integers(0, hi + 1, size=n, dtype=np.uint64).astype(src_dtype)
    for _ in range(int(rng.integers(0, 3))):  # plant bad values
        if n and (int(info.min) < 0 or hi < int(info.max)):
            src[int(rng.integers(0, n))] = -1 if hi == int(info.max) else hi + 1
    return src, out_dtype, hi


def _convert_kernel(src: np.ndarray, out_dtype: str, hi: int) -> tuple[int, list[int]]:
    from mmpack._src.kernels.store import convert_tokens

    out = np.zeros(src.size, dtype=out_dtype)
    t = src.dtype.type
    k = int(convert_tokens(src, out, t(0), t(hi)))
    return k, _ints(out[:k])


def _convert_ref(src: np.ndarray, out_dtype: str, hi: int) -> tuple[int, list[int]]:
    out = np.zeros(src.size, dtype=out_dtype)
    k = convert_slow(src, out, 0, hi)
    return k, _ints(out[:k])


def _offsets_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    steps = rng.integers(0, 50, int(rng.integers(0, size + 2)))
    if steps.size and rng.random() < 0.5:
        steps[int(rng.integers(0, steps.size))] = -int(rng.integers(1, 5))
    return (np.cumsum(steps, dtype=np.int64),)


def _first_decrease_kernel(offsets: np.ndarray) -> int:
    from mmpack._src.kernels.store import first_decrease

    return int(first_decrease(offsets))


# =========================================================================== pagestate, eos
def all_pages_present_slow(state, starts, lengths, itemsize: int, shift: int) -> bool:
    for a, n in zip(starts.tolist(), lengths.tolist()):
        if n <= 0:
            continue
        lo, hi = a * itemsize, (a + n) * itemsize
        if lo < 0:
            return False
        for b in range(lo // (1 << shift), (hi - 1) // (1 << shift) + 1):
            if b >= state.shape[0] or state[b] != 1:
                return False
    return True


def check_ranges_slow(data: bytes, state, digests, checked, starts, lengths, itemsize, shift):
    """Each touched page hashed on its own by :func:`xxh64_slow`; returns (bad ids, checked)."""
    checked = checked.copy()
    bad = []
    for a, n in zip(starts.tolist(), lengths.tolist()):
        lo = a * itemsize
        if n <= 0 or lo < 0:
            continue
        for b in range(lo >> shift, min((lo + n * itemsize - 1) >> shift, state.size - 1) + 1):
            if checked[b] != 0 or state[b] != 1:
                continue
            ok = xxh64_slow(data[b << shift : (b + 1) << shift]) == int(digests[b])
            checked[b] = 1 if ok else 2
            if not ok:
                bad.append(b)
    return bad, checked


def find_eos_slow(tokens: np.ndarray, eos: int, base: int) -> list[int]:
    """The specification of :func:`mmpack._src.kernels.eos.find_eos`."""
    return [base + i for i, t in enumerate(tokens.tolist()) if t == eos]


def _ranges(rng: np.random.Generator, k: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(-3, top + 3, k).astype(np.int64)
    lengths = rng.integers(-2, max(top // 3, 2), k).astype(np.int64)
    return starts, lengths


def _present_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    state = rng.choice(np.array([0, 1, 1, 1, 1, 1, 2], np.uint8), int(rng.integers(0, size + 2)))
    itemsize, shift = int(rng.choice([1, 2, 4])), int(rng.integers(0, 7))
    starts, lengths = _ranges(rng, int(rng.integers(0, 12)), (state.size << shift) // itemsize)
    return state, starts, lengths, itemsize, shift


def _present_kernel(state, starts, lengths, itemsize, shift) -> bool:
    from mmpack._src.kernels.pagestate import all_pages_present

    return bool(all_pages_present(state, starts, lengths, itemsize, shift))


def _check_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    data = bytes(rng.integers(0, 256, int(rng.integers(0, 20 * size + 2)), dtype=np.uint8))
    shift, itemsize = int(rng.integers(3, 8)), int(rng.choice([1, 2, 4]))
    npages = -(-len(data) // (1 << shift))
    good = [xxh64_slow(data[b << shift : (b + 1) << shift]) for b in range(npages)]
    flip = rng.integers(0, 2, npages)
    digests = np.array([g ^ int(f) for g, f in zip(good, flip)], np.uint64)
    state = rng.choice(np.array([0, 1, 1], np.uint8), npages)
    checked = rng.choice(np.array([0, 0, 1], np.uint8), npages)
    starts, lengths = _ranges(rng, int(rng.integers(0, 8)), len(data) // itemsize)
    return data, state, digests, checked, starts, lengths, itemsize, shift


def _check_kernel(data, state, digests, checked, starts, lengths, itemsize, shift):
    from mmpack._src.kernels.store import check_ranges

    raw = np.frombuffer(data, np.uint8)
    words = raw[: raw.size // 8 * 8].view("<u8")
    bad = np.empty(state.size, np.int64)
    out = checked.copy()
    n = check_ranges(raw, words, state, digests, out, starts, lengths, itemsize, shift, bad)
    return _ints(bad[:n]), out


def _eos_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    dtype = rng.choice(["uint8", "uint16", "int32", "int64"])
    tokens = rng.integers(0, 4, int(rng.integers(0, 10 * size + 1))).astype(dtype)
    return tokens, int(rng.integers(0, 4)), int(rng.integers(0, 1000))


def _eos_kernel(tokens: np.ndarray, eos: int, base: int) -> list[int]:
    from mmpack._src.kernels.eos import find_eos

    out = np.full(tokens.size, -1, dtype=np.int64)
    n = find_eos(tokens, eos, base, out)
    assert (out[n:] == -1).all()
    return _ints(out[:n])


# =========================================================================== masking
def mix64_slow(z: int) -> int:
    """SplitMix64's finalizer (the mixer of both masking and the permutation)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def sample_key_slow(seed: int, epoch: int, index: int) -> int:
    k = mix64_slow((seed + GOLDEN) & M64)
    k = mix64_slow(k ^ ((epoch + GOLDEN) & M64))
    return mix64_slow(k ^ ((index + GOLDEN) & M64))


def mlm_slow(ids, maskable, keys, p, mask_id, vocab, excluded, ignore=IGNORE):
    """MLM corruption, one token at a time with Python integers: (ids, labels)."""
    ex = set(excluded.tolist())
    allowed = [t for t in range(vocab) if t not in ex]
    out, labels = [], []
    for row, can, k in zip(ids.tolist(), maskable.tolist(), keys):
        orow, lrow = [], []
        for t, tok in enumerate(row):
            h = mix64_slow((k + (t + 1) * GOLDEN) & M64)
            u = (h >> 11) * 2.0**-53
            if u >= p or not can[t] or tok in ex:
                orow.append(tok)
                lrow.append(ignore)
                continue
            lrow.append(tok)
            if u < 0.8 * p:
                orow.append(mask_id)
            elif u < 0.9 * p:
                draw = (mix64_slow(h ^ REPLACE) >> 11) * 2.0**-53
                orow.append(allowed[min(int(draw * len(allowed)), len(allowed) - 1)])
            else:
                orow.append(tok)
        out.append(orow)
        labels.append(lrow)
    return np.array(out, dtype=np.int64), np.array(labels, dtype=np.int64)


def _keys_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    seed, epoch = (int(v) for v in rng.integers(0, 2**64, 2, dtype=np.uint64))
    return seed, epoch, rng.integers(0, 2**62, int(rng.integers(0, size + 1)))


def _keys_kernel(seed: int, epoch: int, indices: np.ndarray) -> list[int]:
    from mmpack._src.kernels.masking import sample_keys

    out = np.empty(indices.size, np.uint64)
    sample_keys(np.uint64(seed), np.uint64(epoch), indices, out)
    return _ints(out)


def _keys_ref(seed: int, epoch: int, indices: np.ndarray) -> list[int]:
    return [sample_key_slow(seed, epoch, i) for i in indices.tolist()]


def _mlm_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack._src.packing.masking import excluded_ids

    vocab = int(rng.integers(30, 300))
    rows, length = int(rng.integers(1, 4)), int(rng.integers(0, size + 1))
    ids = rng.integers(0, vocab, size=(rows, length))
    maskable = rng.integers(0, 2, size=(rows, length))
    specials = rng.integers(0, vocab, int(rng.choice([0, 3, 30])))  # both exclusion paths
    ex = excluded_ids(vocab, specials.tolist(), pad_id=0)
    seed, epoch = (int(v) for v in rng.integers(0, 2**64, 2, dtype=np.uint64))
    index = rng.integers(0, 2**40, rows)
    return ids, maskable, seed, epoch, index, float(rng.random()), vocab, ex


def _mlm_hashed_kernel(ids, maskable, seed, epoch, index, p, vocab, ex):
    from mmpack._src.packing.masking import corrupt_rows, row_keys

    got = ids.copy()
    labels = corrupt_rows(
        got, maskable, row_keys(seed, epoch, index), mask_prob=p, mask_id=vocab, vocab_size=vocab,
        excluded=ex,
    )  # fmt: skip
    return got, labels


def _mlm_indexed_kernel(ids, maskable, seed, epoch, index, p, vocab, ex):
    from mmpack._src.kernels.masking import mlm_indexed_rows

    got, labels = ids.copy(), np.empty_like(ids)
    mlm_indexed_rows(
        got, maskable, np.uint64(seed), np.uint64(epoch), index, ex, vocab - ex.size, p, vocab,
        IGNORE, labels,
    )  # fmt: skip
    return got, labels


def _mlm_ref(ids, maskable, seed, epoch, index, p, vocab, ex):
    keys = [sample_key_slow(seed, epoch, i) for i in index.tolist()]
    return mlm_slow(ids, maskable, keys, p, vocab, vocab, ex)


# =========================================================================== permutation
@lru_cache(maxsize=4096)
def _keys_cached(seed: Any, epoch: int) -> tuple[int, ...]:
    from mmpack._src.core.permutation_keys import ROUNDS

    parts = seed if isinstance(seed, tuple) else (seed,)
    words = [len(parts)]
    for s in parts:
        words += [s % 2**32, s // 2**32]
    base = [int(k) for k in np.random.SeedSequence(words).generate_state(ROUNDS, np.uint64)]
    return tuple(
        mix64_slow(b ^ mix64_slow((epoch + (r + 1) * GOLDEN) % 2**64)) for r, b in enumerate(base)
    )


def clear_caches() -> None:
    """Forget the round keys computed so far (a benchmark times the twins from cold)."""
    _keys_cached.cache_clear()


def ref_keys(seed: Any, epoch: int) -> list[int]:
    """The round keys of ``Permutation(n, seed=seed, epoch=epoch)``."""
    return list(_keys_cached(seed, epoch))


def ref_permute(i: int, n: int, seed: Any, epoch: int = 0, inverse: bool = False) -> int:
    """Balanced Feistel over the smallest even bit width holding n - 1, with cycle-walking."""
    if n == 1:
        return 0
    bits = len(bin(n - 1)) - 2
    half = max(1, (bits + 1) // 2)
    mask = 2**half - 1
    keys = ref_keys(seed, epoch)
    x = i
    while True:
        left, right = x >> half, x & mask
        if not inverse:
            for key in keys:
                left, right = right, left ^ (mix64_slow(right ^ key) & mask)
        else:
            for key in reversed(keys):
                left, right = right ^ (mix64_slow(left ^ key) & mask), left
        x = (left << half) | right
        if x < n:
            return x


def _seed(rng: np.random.Generator) -> Any:
    if rng.random() < 0.3:
        return tuple(int(v) for v in rng.integers(0, 2**40, int(rng.integers(1, 3))))
    return int(rng.integers(0, 2**63))


def _perm_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n = int(rng.choice([1, 2, 3, 5, 64, 1000, 2**20 + 3, 10**12]))
    epoch = int(rng.integers(0, 2**40))
    return n, _seed(rng), epoch, rng.integers(0, n, int(rng.integers(0, size + 1)))


def _permute_kernel(n, seed, epoch, idx):
    from mmpack import Permutation

    return _ints(Permutation(n, seed=seed, epoch=epoch).map(idx))


def _permute_ref(n, seed, epoch, idx):
    return [ref_permute(i, n, seed, epoch) for i in idx.tolist()]


def _invert_kernel(n, seed, epoch, idx):
    from mmpack import Permutation

    return _ints(Permutation(n, seed=seed, epoch=epoch).inverse_map(idx))


def _invert_ref(n, seed, epoch, idx):
    return [ref_permute(j, n, seed, epoch, inverse=True) for j in idx.tolist()]


def _keyed_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n, seed, _, idx = _perm_inputs(rng, size)
    epochs = rng.integers(0, 2**62, int(rng.integers(1, 4)))
    return n, seed, epochs, idx, rng.integers(0, epochs.size, idx.size)


def _keyed_kernel(n, seed, epochs, idx, group):
    from mmpack import Permutation
    from mmpack._src.core.permutation_keys import epoch_keys
    from mmpack._src.kernels.permutation import permute_many_keyed

    perm, out = Permutation(n, seed=seed), np.empty_like(idx)
    permute_many_keyed(idx, group, out, n, perm._half_bits, perm._mask, epoch_keys(seed, epochs))
    return _ints(out)


def _keyed_ref(n, seed, epochs, idx, group):
    return [ref_permute(i, n, seed, int(epochs[g])) for i, g in zip(idx.tolist(), group.tolist())]


def _derive_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    return _seed(rng), rng.integers(0, 2**64, int(rng.integers(1, size + 2)), dtype=np.uint64)


def _derive_kernel(seed, epochs):
    from mmpack._src.core.permutation_keys import epoch_keys

    return [_ints(row) for row in epoch_keys(seed, epochs)]


def _derive_ref(seed, epochs):
    return [ref_keys(seed, e) for e in epochs.tolist()]


# =========================================================================== mixture
def reference_assignment(quotas: list[int], period: int, n: int) -> list[tuple[int, int]]:
    """Tijdeman's chairman rule walked sequentially with exact fractions: ``(source, occurrence)``."""
    q = [Fraction(c, period) for c in quotas]
    k_pos = sum(c > 0 for c in quotas)
    s = Fraction(1, 2 * k_pos - 2) if k_pos > 1 else Fraction(0)
    counts = [0] * len(q)
    out = []
    for t in range(1, n + 1):
        eligible = [k for k in range(len(q)) if q[k] > 0 and t * q[k] - counts[k] >= s]
        k = min(eligible, key=lambda k: ((counts[k] + 1 - s) / q[k], k))
        out.append((k, counts[k]))
        counts[k] += 1
    return out


def reference_item(mixture: Any, k: int, occ: int) -> int:
    """The item of source ``k`` drawn at its occurrence ``occ`` (one permutation per pass)."""
    length = len(mixture.sources[k])
    return ref_permute(occ % length, length, (mixture.seed, k), occ // length)


class _Source:
    """``n`` samples of one token (all a mixture needs to check its sources agree)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        return {"x": np.array([j], dtype=np.int64)}


def _mixture_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack import Mixture

    k = int(rng.integers(2, 6))
    # Weights of a period that divides the quantization's resolution: short periods and ones
    # of several checkpoint blocks, each built in a fraction of a second without the JIT too.
    period = int(rng.choice([10, 40, 125, 1000, 5000, 20000]))
    weights = rng.multinomial(period, rng.dirichlet(np.ones(k))) / period
    lengths = rng.integers(1, 40, k)
    n = int(rng.integers(0, 4 * size + 1))
    seed = int(rng.integers(0, 2**63))
    mixture = Mixture(
        [_Source(int(m)) for m in lengths], weights.tolist(), num_samples=max(n, 1), seed=seed
    )
    return mixture, n


def _locate_kernel(mixture, n):
    src, items = mixture.source_of_many(np.arange(n))
    return _ints(src), _ints(items)


def _locate_ref(mixture, n):
    ref = reference_assignment(mixture.quotas.tolist(), mixture.period, n)
    return [k for k, _ in ref], [reference_item(mixture, k, o) for k, o in ref]


def _counts_kernel(mixture, n):
    return [_ints(mixture.counts(m)) for m in range(n + 1)]


def _counts_ref(mixture, n):
    ref = reference_assignment(mixture.quotas.tolist(), mixture.period, n)
    counts, out = [0] * len(mixture.quotas), []
    for k, _ in [(None, None), *ref]:
        if k is not None:
            counts[k] += 1
        out.append(list(counts))
    return out


def _occurrence_kernel(mixture, n):
    ref = reference_assignment(mixture.quotas.tolist(), mixture.period, n)
    return [mixture._occurrence_position(k, o) for k, o in ref]


def _occurrence_ref(mixture, n):
    return list(range(n))


def _prefix_error_kernel(mixture, n):
    from mmpack._src.kernels.mixture import max_prefix_error

    limit = min(n, mixture.period)
    return int(max_prefix_error(mixture.quotas, mixture.period, mixture._seq, limit))


def _prefix_error_ref(mixture, n):
    quotas, period = mixture.quotas.tolist(), mixture.period
    counts, worst = [0] * len(quotas), 0
    for m, (k, _) in enumerate(reference_assignment(quotas, period, min(n, period)), start=1):
        counts[k] += 1
        worst = max(worst, *(abs(m * c - period * counts[j]) for j, c in enumerate(quotas)))
    return worst


# =========================================================================== mixture schedules
def reference_row_count(row: list[float], m: int) -> int:
    """The left child's count at node count ``m`` on one row (the closed form of
    :mod:`mmpack._src.kernels.schedule`, spelled out): ``u`` where the node's integral from the row's
    start reaches ``m``, the computed child's integral there, rounded half up."""
    side, length, g_int, g0, gam, a_int, a0, alpha, a1_int, a1 = row
    z = max(float(m) - g_int, 0.0)
    if z == 0.0 or (g0 == 0.0 and gam == 0.0):
        u = 0.0
    elif gam == 0.0:
        u = z / g0
    elif gam > 0.0:
        q = g0 / z
        u = 2.0 / (q + (q * q + 2.0 * gam / z) ** 0.5)
    else:
        u = 2.0 * z / (g0 + max(g0 * g0 + 2.0 * gam * z, 0.0) ** 0.5)
    if alpha >= 0.0:
        phi = a_int + u * (a0 + 0.5 * alpha * u)
    else:
        v = max(length - u, 0.0)
        phi = a1_int - v * (a1 - 0.5 * alpha * v)
    c = int(math.floor(phi + 0.5))
    return c if side == 0.0 else m - c


def reference_split_counts(heads, nodes, levels, rows, n: int) -> list[int]:
    """Counts of each source among positions ``[0, n)``: the root of ``n``'s epoch counts ``n``,
    each node passes its count down (rows found by a linear scan)."""
    heads, nodes = heads.tolist(), nodes.tolist()
    e = max(i for i, (start, _) in enumerate(heads) if start <= n)
    root = heads[e][1]
    stop = heads[e + 1][1] if e + 1 < len(heads) else len(nodes)
    count = {root: n}
    out: dict[int, int] = {}
    for g in range(root, stop):
        left, right, first, n_rows = nodes[g]
        m = count[g]
        r = max(r for r in range(first, first + n_rows) if levels[r] <= m or r == first)
        a = reference_row_count(rows[r].tolist(), m)
        for child, c in ((left, a), (right, m - a)):
            if child < 0:
                out[-child - 1] = c
            else:
                count[child] = c
    return [out[k] for k in range(len(out))]


def reference_split_walk(plan: Any, n: int) -> list[tuple[int, int]]:
    """``(source, occurrence)`` of positions ``[0, n)`` of a scheduled mixture's plan: position
    ``p`` is the one source whose count grows from ``p`` to ``p + 1`` (by exactly one)."""
    tables = (plan.heads, plan.nodes, plan.levels, plan.rows)
    out = []
    before = None
    for p in range(n):
        if p < plan.split_start:  # a constant mixture's positions before its first change
            k = reference_assignment(plan.prefix.quotas.tolist(), plan.prefix.period, p + 1)[p][0]
            out.append((k, sum(1 for s, _ in out if s == k)))
            continue
        before = before if before is not None else reference_split_counts(*tables, p)
        after = reference_split_counts(*tables, p + 1)
        grown = [k for k in range(len(after)) if after[k] != before[k]]
        assert len(grown) == 1 and after[grown[0]] == before[grown[0]] + 1, (p, before, after)
        out.append((grown[0], before[grown[0]]))
        before = after
    return out


def reference_schedule_integral(
    starts: list[int], raw: list[list[float]], interpolate: str, n: int
) -> list[list[Fraction]]:
    """The continuous integral of a ``unit="samples"`` schedule, exactly: ``out[p][k]`` is the
    integral of source ``k``'s normalized weight over ``[0, p]`` for ``p = 0 .. n``, summed one
    unit interval at a time (a linear weight's integral over ``[i, i + 1]`` is its value at
    ``i + 1/2``), every weight an exact fraction of the float given."""
    w = [[Fraction(v) for v in row] for row in raw]
    w = [[v / sum(row) for v in row] for row in w]

    def at(x: Fraction) -> list[Fraction]:
        j = max(i for i, s in enumerate(starts) if s <= x)
        if interpolate == "constant" or j + 1 == len(starts):
            return w[j]
        t = (x - starts[j]) / (starts[j + 1] - starts[j])
        return [a + (b - a) * t for a, b in zip(w[j], w[j + 1])]

    out = [[Fraction(0)] * len(w[0])]
    for i in range(n):
        out.append([c + d for c, d in zip(out[-1], at(Fraction(2 * i + 1, 2)))])
    return out


def _schedule_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack import Mixture, Schedule

    k = int(rng.integers(2, 5))
    n_points = int(rng.integers(2, 6))
    points, start = [], 0
    for _ in range(n_points):
        w = rng.integers(0, 5, k).astype(float)
        w[int(rng.integers(k))] += 1
        points.append((start, (w / 100 if rng.random() < 0.3 else w).tolist()))
        start += int(rng.integers(1, 3 * size + 2))
    schedule = Schedule(points, interpolate=str(rng.choice(["constant", "linear"])))
    n = int(rng.integers(0, start + 2 * size + 2))
    lengths = rng.integers(1, 30, k)
    weights = schedule if rng.random() < 0.8 else points[0][1]
    mixture = Mixture([_Source(int(m)) for m in lengths], weights, num_samples=max(n, 1),
                      seed=int(rng.integers(0, 2**63)))  # fmt: skip
    if rng.random() < 0.4 or mixture._plan is None:  # a schedule change
        w = rng.integers(0, 5, k).astype(float)
        w[int(rng.integers(k))] += 1
        later = Schedule([(0, w.tolist()), (start + size, (w[::-1] + 1).tolist())],
                         interpolate="linear")  # fmt: skip
        mixture = mixture.with_schedule(later, from_position=int(rng.integers(0, max(n, 1))))
    return mixture, schedule, n


def _schedule_locate_kernel(mixture, schedule, n):
    src, items = mixture.source_of_many(np.arange(n))
    return _ints(src), _ints(items)


def _schedule_locate_ref(mixture, schedule, n):
    walk = reference_split_walk(mixture._plan, n)
    return [k for k, _ in walk], [reference_item(mixture, k, o) for k, o in walk]


def _schedule_counts_kernel(mixture, schedule, n):
    return [_ints(mixture.counts(m)) for m in range(n + 1)]


def _schedule_counts_ref(mixture, schedule, n):
    plan = mixture._plan
    counts = [0] * len(mixture.sources)
    out = [list(counts)]
    for k, _ in reference_split_walk(plan, n):
        counts[k] += 1
        out.append(list(counts))
    return out


def _schedule_positions_kernel(mixture, schedule, n):
    src, _ = mixture._plan.locate(np.arange(n, dtype=np.int64))
    return [_ints(mixture._plan.positions_of(k, np.arange(int((src == k).sum()))))
            for k in range(len(mixture.sources))]  # fmt: skip


def _schedule_positions_ref(mixture, schedule, n):
    walk = reference_split_walk(mixture._plan, n)
    return [[p for p, (s, _) in enumerate(walk) if s == k] for k in range(len(mixture.sources))]


# =========================================================================== megatron order
def ref_sample_index(sizes, document_index, seqlen: int, extra: int, n: int) -> np.ndarray:
    """The sample index from the stream spelled out token by token: every token's (entry,
    offset); a boundary names the token at ``p`` (``extra`` 1) or the one before it, plus one."""
    owner = [(k, o) for k, s in enumerate(document_index) for o in range(int(sizes[s]))]
    last = len(document_index) - 1
    out = [(0, 0)]
    for i in range(1, n + 1):
        p = i * seqlen
        if p + extra > len(owner):
            out.append((last, int(sizes[document_index[last]]) - extra))
        elif extra:
            out.append(owner[p])
        else:
            k, o = owner[p - 1]
            out.append((k, o + 1))
    return np.array(out, dtype=np.int32).reshape(-1, 2)


def _megatron_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack._src.formats.megatron_order import _num_samples

    sizes = rng.integers(0, 10, int(rng.integers(1, size + 2))).astype(np.int32)
    sizes[int(rng.integers(0, sizes.size))] += 1  # some tokens
    epochs = int(rng.integers(1, 4))
    di = np.tile(np.arange(sizes.size, dtype=np.int32), epochs)
    rng.shuffle(di)
    seqlen, extra = int(rng.integers(1, 13)), int(rng.integers(0, 2))
    total = epochs * int(sizes.sum())
    n = _num_samples(total, seqlen, extra, bool(rng.integers(0, 2)))
    return sizes, di, seqlen, extra, total, n


def _sample_index_kernel(sizes, di, seqlen, extra, total, n):
    from mmpack._src.kernels.megatron_order import fill_sample_index

    out = np.empty((n + 1, 2), dtype=np.int32)
    fill_sample_index(sizes, di, seqlen, extra, total, out)
    return out


def _sample_index_ref(sizes, di, seqlen, extra, total, n):
    return ref_sample_index(sizes, di, seqlen, extra, n)


def _megatron_samples_kernel(sizes, di, seqlen, extra, total, n):
    from mmpack._src.kernels.megatron_order import copy_pieces, sample_pieces

    index = _sample_index_kernel(sizes, di, seqlen, extra, total, n)
    pointers = np.zeros(sizes.size, np.int64)
    np.cumsum(sizes[:-1], out=pointers[1:])
    src = np.arange(int(sizes.sum()), dtype=np.int64) * 3 + 1  # token t of the flat array
    picks = np.arange(n, dtype=np.int64)[::-1].copy()
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(index[picks + 1, 0] - index[picks, 0] + 1, out=ptr[1:])
    start, length = np.empty(ptr[-1], np.int64), np.empty(ptr[-1], np.int64)
    width = seqlen + extra
    sample_pieces(pointers, 1, sizes, di, index, picks, extra, width, ptr, start, length)
    rows = np.empty((n, width), np.int64)
    copy_pieces(src, start, ptr, length, -1, rows)
    return rows


def ref_megatron_samples(sizes, di, seqlen, extra, total, n):
    """Samples ``n - 1 .. 0`` of megatron-core's order: sample ``j`` is ``S[j * seqlen : j *
    seqlen + seqlen + extra]`` padded with -1, ``S`` the sequences of the document index
    concatenated (token ``t`` of the flat array stored as ``3 t + 1``)."""
    first = [sum(int(v) for v in sizes[:s]) for s in range(sizes.size)]
    stream = [3 * (first[s] + o) + 1 for s in di.tolist() for o in range(int(sizes[s]))]
    width = seqlen + extra
    rows = []
    for j in reversed(range(n)):
        row = stream[j * seqlen : j * seqlen + width]
        rows.append(row + [-1] * (width - len(row)))
    return np.array(rows, dtype=np.int64).reshape(n, width)


# =========================================================================== packed rows
def encoded(plan: tuple[np.ndarray, ...], regions: int = 1) -> tuple[np.ndarray, ...]:
    """``(bin_ptr, piece_ref, piece_len, regions, split)``, the row kernels' layout
    (:mod:`mmpack._src.packing.plan_pieces`), of the plan ``(bin_ptr, piece_doc, piece_start,
    piece_len)`` of any values: its bins cut into up to ``regions`` regions when ``bin_ptr``
    cuts the pieces in order (else one), each region's documents counted from its smallest; a
    piece that starts inside its document, or names a document no reference can (negative, too
    far), goes to the split table as it is."""
    from mmpack._src.kernels.packed_rows import SPLIT_FLAG

    bin_ptr, docs, starts, lens = (np.asarray(a) for a in plan)
    n_bins = max(len(bin_ptr) - 1, 0)
    ordered = len(bin_ptr) >= 1 and bin_ptr[0] == 0 and bin_ptr[-1] == len(docs)
    ordered = ordered and bool((np.diff(bin_ptr) >= 0).all())
    cuts = np.linspace(0, n_bins, (regions if ordered else 1) + 1).astype(np.int64)
    ref = np.zeros(len(docs), dtype=np.uint32)
    split: list[int] = []
    table = [[0], [], [0]]
    for r in range(len(cuts) - 1):
        lo, hi = (int(bin_ptr[cuts[r]]), int(bin_ptr[cuts[r + 1]])) if ordered else (0, len(docs))
        mine = [int(d) for d in docs[lo:hi] if d >= 0]
        doc0 = min(mine, default=0)
        first = len(split) // 2
        for p in range(lo, hi):
            d, s = int(docs[p]) - doc0, int(starts[p])
            if s == 0 and 0 <= d < SPLIT_FLAG:
                ref[p] = d
            else:
                ref[p] = SPLIT_FLAG + len(split) // 2 - first
                split += [d, s]
        table[0].append(int(cuts[r + 1]))
        table[1].append(doc0)
        table[2].append(len(split) // 2)
    table[1].append(table[1][-1] if table[1] else 0)
    return (
        np.asarray(bin_ptr, dtype=np.int64),
        ref,
        np.asarray(lens, dtype=np.int32),
        np.array(table, dtype=np.int64),
        np.array(split, dtype=np.int64),
    )


def twin_bin(bin_ptr, piece_doc, piece_start, piece_len, offsets, src, b, params, cu_room):
    """``(code, sample)``: ``code`` is what ``one_bin`` returns ((-1, 0) corrupt, (-2, 0) no
    room for ``cu_seqlens``), ``sample`` (ids, positions, labels, mask, cu) when it succeeds."""
    from mmpack._src.kernels.packed_rows import LABELS_HF, LABELS_NEXT

    seqlen, eot, eot_id, pad_id, mode = (int(v) for v in params[:5])
    if not 0 <= b < len(bin_ptr) - 1:
        return (-1, 0), None
    lo, hi = int(bin_ptr[b]), int(bin_ptr[b + 1])
    if lo < 0 or hi < lo or hi > len(piece_doc):
        return (-1, 0), None
    if hi - lo + 2 > cu_room:
        return (-2, 0), None
    segments = []
    for p in range(lo, hi):
        d, s, n = int(piece_doc[p]), int(piece_start[p]), int(piece_len[p])
        if not 0 <= d < len(offsets) - 1 or s < 0 or n < 0:
            return (-1, 0), None
        a, z = int(offsets[d]), int(offsets[d + 1])
        if s + n > z - a:
            return (-1, 0), None
        segments.append([int(t) for t in src[a + s : a + s + n]] + [eot_id] * (eot and n < seqlen))
    if sum(map(len, segments)) > seqlen:
        return (-1, 0), None
    ids, pos, lab, att, cu = [], [], [], [], [0]
    for seg in segments:
        ids += seg
        pos += range(len(seg))
        att += [1] * len(seg)
        if seg and mode == LABELS_NEXT:
            lab += seg[1:] + [IGNORE]
        elif seg and mode == LABELS_HF:
            lab += [IGNORE] + seg[1:]
        else:
            lab += [IGNORE] * len(seg)
        cu.append(len(ids))
    pad = seqlen - len(ids)
    if pad:
        ids += [pad_id] * pad
        pos += range(pad)
        lab += [IGNORE] * pad
        att += [0] * pad
        cu.append(seqlen)
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    return (len(cu) - 1, longest), (ids, pos, lab, att, cu)


def _packed_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack._src.kernels.packed_rows import LABELS_HF, LABELS_NEXT, LABELS_NONE

    docs = [
        rng.integers(0, 60000, int(rng.integers(0, 10))).tolist()
        for _ in range(int(rng.integers(1, 9)))
    ]
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    src = np.array([t for d in docs for t in d], dtype=np.uint16)
    seqlen = int(rng.integers(1, 17))
    corrupt = rng.random() < 0.25
    pieces = []
    for _ in range(int(rng.integers(0, size // 4 + 2))):
        if corrupt:
            pieces.append(tuple(int(v) for v in rng.integers(-3, 30, 3)))
            continue
        d = int(rng.integers(0, len(docs)))
        dl = len(docs[d])
        s = int(rng.choice([0, 0, dl // 2, dl]))
        pieces.append((d, s, int(rng.choice([dl - s, dl - s, max(dl - s - 1, 0), 0]))))
    cuts = sorted(rng.integers(0, len(pieces) + 1, int(rng.integers(0, 6))).tolist())
    bin_ptr = [0, *cuts, len(pieces)]
    if corrupt and rng.random() < 0.5:
        bin_ptr = rng.integers(-2, len(pieces) + 3, int(rng.integers(1, 7))).tolist()
    arr = np.array(pieces, dtype=np.int64).reshape(-1, 3)
    plan = (
        np.array(bin_ptr, dtype=np.int64),
        np.ascontiguousarray(arr[:, 0]),
        np.ascontiguousarray(arr[:, 1]),
        np.ascontiguousarray(arr[:, 2]).astype(np.int32),
    )
    mode = int(rng.choice([LABELS_NONE, LABELS_NEXT, LABELS_HF]))
    params = [
        seqlen,
        int(rng.integers(0, 2)),
        int(rng.integers(0, 70000)),
        int(rng.integers(0, 70000)),
        mode,
    ]
    room = int(rng.choice([12, int(rng.integers(0, 13))]))
    return plan, offsets, src, params, room


def _one_bin_kernel(plan, offsets, src, params, room):
    from mmpack._src.kernels.packed_rows import one_bin

    seqlen, out = params[0], []
    p = np.array([*params, 0, IGNORE], dtype=np.int64)
    layout = encoded(plan, regions=1 + len(plan[0]) % 3)
    for b in range(-1, len(plan[0]) + 1):
        rows = np.full(4 * seqlen, 77, dtype=np.int64)
        cu = np.full(room, 77, dtype=np.int32)
        out.append((one_bin(*layout, offsets, src, b, p, rows, cu), rows.reshape(4, seqlen), cu))
    return out


def _finish_bins(raw):
    out = []
    for code, rows, cu in raw:
        code = tuple(int(v) for v in code)
        if code[0] < 0:
            assert (rows == 77).all()
            out.append((code, None))
        else:
            out.append((code, (*(_ints(x) for x in rows), _ints(cu[: code[0] + 1]))))
    return out


def _one_bin_ref(plan, offsets, src, params, room):
    return [twin_bin(*plan, offsets, src, b, params, room) for b in range(-1, len(plan[0]) + 1)]


def _fill_rows_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    """``_packed_inputs`` plus the bins a batch asks for (any order, repeats allowed), the
    output dtype (int64, or int32 as ``PackedDataset(dtype="int32")`` fills) and the array
    the kernels read with each document's start there: ``src`` and ``offsets`` (a store's
    own tokens), or the documents placed in a larger array in another order with junk
    between them (a subset's parent and its ``parent_doc_starts``)."""
    plan, offsets, src, params, _ = _packed_inputs(rng, size)
    n_bins = len(plan[0]) - 1
    idx = rng.integers(0, max(n_bins, 1), int(rng.integers(0, 6))).astype(np.int64)
    holder, doc_starts = src, offsets
    if rng.random() < 0.7:
        n_docs = len(offsets) - 1
        gaps = rng.integers(0, 4, n_docs + 1)
        holder = rng.integers(0, 60000, len(src) + int(gaps.sum())).astype(np.uint16)
        doc_starts = np.empty(n_docs, dtype=np.int64)
        at = int(gaps[0])
        for k, d in enumerate(rng.permutation(n_docs).tolist()):
            n = int(offsets[d + 1] - offsets[d])
            holder[at : at + n] = src[offsets[d] : offsets[d + 1]]
            doc_starts[d] = at
            at += n + int(gaps[k + 1])
    return plan, offsets, src, params, idx, rng.choice([np.int64, np.int32]), holder, doc_starts


def _refused_before_the_kernels(bin_ptr: np.ndarray, n_pieces: int) -> bool:
    """What mmpack._src.views.packed_gather.piece_ranges refuses before calling the kernels."""
    return bool(
        len(bin_ptr) < 2 or (np.diff(bin_ptr) < 0).any() or bin_ptr.min() < 0
        or bin_ptr.max() > n_pieces
    )  # fmt: skip


def _fill_rows_kernel(plan, offsets, _src, params, idx, dtype, src, doc_starts):
    from mmpack._src.kernels.packed_rows import fill_rows, select_pieces

    bin_ptr = plan[0]
    if _refused_before_the_kernels(bin_ptr, len(plan[1])):
        return None
    seqlen, eot, eot_id, pad_id, mode = params
    counts = bin_ptr[idx + 1] - bin_ptr[idx]
    row_ptr = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    starts, lengths, has_eot = (np.empty(int(row_ptr[-1]), dtype=np.int64) for _ in range(3))
    layout = encoded(plan, regions=1 + len(idx) % 3)
    bad = select_pieces(
        *layout, offsets, doc_starts, seqlen, eot, idx, row_ptr, starts, lengths, has_eot
    )
    if bad >= 0:
        return int(bad)
    k = len(idx)
    ids, pos, lab, att = (np.empty((k, seqlen), dtype=dtype) for _ in range(4))
    cu = np.empty((k, int(counts.max(initial=0)) + 2), dtype=np.int32)
    n_seg, longest = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    if k:
        fill_rows(
            src,
            starts,
            lengths,
            has_eot,
            row_ptr,
            eot_id,
            pad_id,
            mode,
            IGNORE,
            ids,
            pos,
            lab,
            att,
            cu,
            n_seg,
            longest,
            np.empty(0, np.uint8),
            np.empty(0, np.int64),
        )  # fmt: skip  (no loss mask: tests/test_lossmask_views.py compares the masked rows)
    return ids, pos, lab, att, cu, n_seg, longest


def _finish_rows(raw):
    if raw is None or isinstance(raw, int):
        return raw
    ids, pos, lab, att, cu, n_seg, longest = raw
    return [
        (
            (int(n_seg[r]), int(longest[r])),
            (*(_ints(x[r]) for x in (ids, pos, lab, att)), _ints(cu[r, : n_seg[r] + 1])),
        )
        for r in range(len(n_seg))
    ]


def _fill_rows_ref(plan, offsets, src, params, idx, dtype, _holder, _doc_starts):
    if _refused_before_the_kernels(plan[0], len(plan[1])):
        return None
    twins = [twin_bin(*plan, offsets, src, int(b), params, 10**6) for b in idx]
    bad = next((r for r, (code, _) in enumerate(twins) if code[0] < 0), -1)
    return bad if bad >= 0 else twins


# =========================================================================== plans
def _plan_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack._src.packing.plan import LONG_DOCS

    lens = rng.integers(0, 61, int(rng.integers(0, size + 1))).tolist()
    return (
        lens,
        int(rng.integers(1, 25)),
        bool(rng.integers(0, 2)),
        str(rng.choice(LONG_DOCS)),
        int(rng.integers(1, 7)),
    )


def _plan_bins(plan) -> list[list[tuple[int, int, int, int]]]:
    e = plan.piece_has_eot()
    return [
        [
            (
                int(plan.piece_doc[p]),
                int(plan.piece_start[p]),
                int(plan.piece_len[p]),
                int(plan.piece_len[p]) + int(e[p]),
            )
            for p in range(plan.bin_ptr[b], plan.bin_ptr[b + 1])
        ]
        for b in range(plan.n_bins)
    ]


def _bfd_canonical(bins, seqlen):
    """What any tie rule of best-fit decreasing leaves unchanged: the bin count, the multiset of
    fills, the leading whole bins, the multiset of pieces."""
    full = [b for b in bins if b[0][3] == seqlen]
    return (
        len(bins),
        sorted(sum(p[3] for p in b) for b in bins),
        full,
        sorted(Counter(p for b in bins for p in b).items()),
    )


def _bfd_kernel(lens, seqlen, eot, long_docs, window):
    from mmpack.packing import build_plan

    plan = build_plan(np.array(lens, dtype=np.int64), seqlen, add_eot=eot, long_docs=long_docs)
    return plan, seqlen


def _finish_bfd(raw):
    plan, seqlen = raw
    return _bfd_canonical(_plan_bins(plan), seqlen)


def _bfd_ref(lens, seqlen, eot, long_docs, window):

    return _bfd_canonical(ref_bfd(lens, seqlen, eot, long_docs), seqlen)


def _online_kernel(lens, seqlen, eot, long_docs, window):
    from mmpack.packing import build_plan

    plan = build_plan(
        np.array(lens, dtype=np.int64), seqlen, add_eot=eot, long_docs=long_docs,
        algorithm="online", lookahead=window,
    )  # fmt: skip
    return plan


def _online_ref(lens, seqlen, eot, long_docs, window):

    return ref_stream(lens, seqlen, eot, long_docs, window)


# =========================================================================== streaming packer
def ref_place(lens, budget, remaining, row_len):
    """Linear-scan best fit (the seed's find_best_fit: first smallest fitting row)."""
    remaining = list(remaining)
    counts = [0] * len(remaining)
    rows, offs, deferred = [], [], 0
    for length in lens:
        if deferred >= budget:
            break
        fits = [r for r in range(len(remaining)) if remaining[r] >= length]
        if not fits:
            rows.append(-1)
            offs.append(-1)
            deferred += 1
            continue
        best = min(fits, key=lambda r: (remaining[r], r))
        rows.append(best)
        offs.append(row_len - remaining[best])
        remaining[best] -= length
        counts[best] += 1
    return rows, offs, deferred, remaining, counts


def ref_pack(docs, n_rows, row_len, buffer_size, long_docs="split", drop_last=True):
    """The seed's GreedyBestFitSequencePacker in plain Python: a deque refilled whenever it runs
    dry (up to buffer_size held), linear-scan best fit, deferred sequences put back IN ORDER
    (the seed's extendleft reverses them), plus the long/empty-sequence policies."""

    def pieces():
        for d in docs:
            d = list(d)
            if len(d) > row_len:
                if long_docs == "split":
                    yield from (d[k : k + row_len] for k in range(0, len(d), row_len))
                elif long_docs == "truncate":
                    yield d[:row_len]
            elif d:
                yield d

    source, buffer, out, exhausted = pieces(), deque(), [], False
    while True:
        remaining = [row_len] * n_rows
        rows: list[list[list[int]]] = [[] for _ in range(n_rows)]
        deferred = []
        while True:
            if not buffer:
                room = buffer_size - len(deferred)
                while room > 0 and not exhausted:
                    try:
                        buffer.append(next(source))
                        room -= 1
                    except StopIteration:
                        exhausted = True
                if not buffer:
                    break
            seq = buffer.popleft()
            fits = [r for r in range(n_rows) if remaining[r] >= len(seq)]
            if fits:
                best = min(fits, key=lambda r: (remaining[r], r))
                rows[best].append(seq)
                remaining[best] -= len(seq)
            else:
                deferred.append(seq)
        buffer.extend(deferred)
        if all(rows):
            out.append(rows)
            continue
        if not drop_last and any(rows):
            out.append(rows)
        return out


def rows_of(batch) -> list[list[list[int]]]:
    """The sequences of each row of an emitted batch, read back through cu_seqlens."""
    out = []
    for r, cu in enumerate(batch["cu_seqlens"]):
        used = int(batch["attention_mask"][r].sum())
        cu = [int(c) for c in cu]
        out.append([batch["input_ids"][r, a:b].tolist() for a, b in zip(cu, cu[1:]) if a < used])
    return out


def ref_layout(rows, offs, lens, remaining, n_rows, row_len):
    """The batch layout in plain Python: placed pieces row by row (by offset), each row's
    cu_seqlens, longest segment (padding included) and real tokens."""
    placed, cu, longest, used = [], [], [], []
    for r in range(n_rows):
        mine = sorted((offs[i], i) for i in range(len(rows)) if rows[i] == r)
        u = row_len - remaining[r]
        bounds = [0] + [o + lens[i] for o, i in mine]
        segs = [lens[i] for _, i in mine]
        if u < row_len:
            bounds.append(row_len)
            segs.append(row_len - u)
        placed += [i for _, i in mine]
        cu.append(bounds)
        longest.append(max(segs, default=0))
        used.append(u)
    return placed, cu, longest, used


def ref_gather_pieces(chunk, base, positions, lengths, starts, buf):
    """gather_pieces in plain Python: the pieces wholly inside the chunk (and whose range is
    inside ``buf``) are copied to their start in ``buf``; returns the bitwise or of the copied
    tokens as int64."""
    bits = 0
    for g, n, o in zip(positions.tolist(), lengths.tolist(), starts.tolist()):
        s = g - base
        if s < 0 or n < 0 or s + n > len(chunk) or o < 0 or o + n > len(buf):
            continue
        for t in range(n):
            v = int(chunk[s + t])
            v = v - 2**64 if v >= 2**63 else v  # the int64 buffer wraps a uint64 id >= 2**63
            bits |= v
            buf[o + t] = v
    return bits


def _place_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n_rows, row_len = int(rng.integers(1, 7)), int(rng.integers(1, 41))
    stride = n_rows + int(rng.integers(0, 3))
    init = rng.integers(0, row_len + 1, n_rows).tolist()
    lens = rng.integers(1, row_len + 1, int(rng.integers(0, 2 * size + 1))).astype(np.int64)
    return n_rows, row_len, stride, init, lens, int(rng.integers(0, size + 2))


def _place_kernel(n_rows, row_len, stride, init, lens, budget):
    from mmpack._src.kernels.plan_bestfit import _tree_clear, _tree_set, place_batch, row_index

    bits, off = row_index(stride, row_len)
    remaining = np.full(stride, -1, dtype=np.int64)
    counts = np.zeros(stride, dtype=np.int64)
    held = np.zeros((1, len(lens) + 1), dtype=np.int64)  # piece 0 stands for the batch's start
    held[0, 1:] = lens
    out = np.empty((2, len(lens) + 1), dtype=np.int64)
    place_batch(held, 0, 0, 0, bits, off, remaining, counts, row_len, n_rows, out)  # empty rows
    for r, s in enumerate(init):  # arbitrary starting spaces
        _tree_clear(bits, off, row_len * stride + r)
        _tree_set(bits, off, s * stride + r)
        remaining[r] = s
    processed, deferred = place_batch(
        held, 1, len(lens) + 1, budget, bits, off, remaining, counts, row_len, n_rows, out
    )
    return (
        _ints(out[0, 1:processed]), _ints(out[1, 1:processed]), int(deferred),
        _ints(remaining[:n_rows]), _ints(counts[:n_rows]),
    )  # fmt: skip


def _place_ref(n_rows, row_len, stride, init, lens, budget):
    return ref_place(lens.tolist(), budget, init, row_len)


def _packer_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n_rows, row_len = int(rng.integers(1, 5)), int(rng.integers(1, 41))
    lengths = rng.integers(0, 2 * row_len, int(rng.integers(0, size + 1)))
    docs = [list(range(1 + 1000 * i, 1 + 1000 * i + int(n))) for i, n in enumerate(lengths)]
    long_docs = str(rng.choice(["split", "truncate", "drop"]))
    return (
        docs,
        n_rows,
        row_len,
        n_rows + int(rng.integers(0, 6)),
        long_docs,
        bool(rng.integers(0, 2)),
    )


def _packer_kernel(docs, n_rows, row_len, buffer_size, long_docs, drop_last):
    from mmpack import StreamingPacker

    packer = StreamingPacker(
        docs, batch_size=n_rows, seqlen=row_len, buffer_size=buffer_size, long_docs=long_docs,
        drop_last=drop_last, pad_id=-3,
    )  # fmt: skip
    return list(packer)


def _finish_packer(batches):
    for b in batches:
        assert (b["input_ids"][b["attention_mask"] == 0] == -3).all()
    return [rows_of(b) for b in batches]


def _gather_pieces_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    dtype = rng.choice([np.int8, np.int32, np.uint16, np.int64, np.uint64])
    info = np.iinfo(dtype)
    chunk = rng.integers(
        int(info.min), int(info.max), int(rng.integers(0, 3 * size + 1)), dtype=dtype, endpoint=True
    )
    n, n_buf = int(rng.integers(0, size + 1)), 8 + size
    positions = rng.integers(0, chunk.size + 40, n).astype(np.int64)
    lengths = rng.integers(-1, 9, n).astype(np.int64)
    starts = rng.integers(-1, n_buf + 1, n).astype(np.int64)
    return chunk, int(rng.integers(0, 50)), positions, lengths, starts, n_buf


def _gather_pieces_kernel(chunk, base, positions, lengths, starts, n_buf):
    from mmpack._src.kernels.streaming_batch import gather_pieces

    buf = np.full(n_buf, -7, dtype=np.int64)
    return int(gather_pieces(chunk, base, positions, lengths, starts, buf)), buf


def _gather_pieces_ref(chunk, base, positions, lengths, starts, n_buf):
    buf = np.full(n_buf, -7, dtype=np.int64)
    return ref_gather_pieces(chunk, base, positions, lengths, starts, buf), buf


# =========================================================================== windows
def ref_window(stream: list[int], ends: list[int], v: int, seqlen: int, width: int, pad: int):
    """Row, positions and cu_seqlens of the window at ``v`` of the virtual stream ``stream``
    (``ends``: positions right after each document, its eot included), padded past the end."""
    window = stream[v : v + width]
    row = window + [pad] * (width - len(window))
    real = min(len(window), seqlen)
    cuts = sorted(
        {e - v for e in ends if 0 < e - v < seqlen} | ({real} if real < seqlen else set())
    )
    cu = [0, *cuts, seqlen]
    pos = [p for a, b in zip(cu[:-1], cu[1:]) for p in range(b - a)]
    return row, pos, cu


def ref_find_doc(offsets: list[int], use_eot: int, v: int) -> int:
    """The last document starting at or before virtual position ``v``."""
    return max(j for j in range(len(offsets) - 1) if offsets[j] + j * use_eot <= v)


def ref_flat_positions(offsets: list[int], use_eot: int) -> list[int]:
    """For every virtual position ``v`` in ``[0, len(S)]``: the flat index of the first real
    token at or after ``v`` (``offsets[-1]`` when none)."""
    flat = []  # flat index of each stream position, None for an eot
    for j in range(len(offsets) - 1):
        flat += list(range(offsets[j], offsets[j + 1])) + [None] * use_eot
    out = [offsets[-1]] * (len(flat) + 1)
    for v in reversed(range(len(flat))):
        out[v] = flat[v] if flat[v] is not None else out[v + 1]
    return out


def _window_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    from mmpack._src.kernels.window import INDEX_STEP

    big = rng.random() < 0.2  # enough documents for a sampled index of several entries
    n_docs = int(rng.integers(INDEX_STEP + 1, 3 * INDEX_STEP) if big else rng.integers(1, size + 2))
    lens = rng.integers(0, 12, n_docs) * (rng.random(n_docs) < 0.9)
    docs = [rng.integers(10, 60000, int(n)).tolist() for n in lens]
    use_eot = int(rng.integers(0, 2))
    seqlen, labels = int(rng.integers(1, 13)), int(rng.integers(0, 2))
    total = sum(len(d) for d in docs) + len(docs) * use_eot  # the virtual stream's length
    vs = rng.integers(0, max(total, 1), int(rng.integers(0, size + 1)) if total else 0)
    sampled = bool(rng.integers(0, 2))
    return docs, use_eot, seqlen, labels, sampled, vs, _window_arrays(docs, use_eot, sampled)


def _window_arrays(docs, use_eot, sampled):
    from mmpack._src.kernels.window import INDEX_STEP, fill_sampled_index

    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    src = np.array([t for d in docs for t in d], dtype=np.uint16)
    top = np.zeros((len(docs) - 1) // INDEX_STEP + 1 if sampled else 0, np.int64)
    fill_sampled_index(offsets, use_eot, top)
    return src, offsets, top, int(offsets[-1]) + len(docs) * use_eot


def _one_window_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import one_window

    src, offsets, top, total = arrays
    width = seqlen + labels
    meta = np.array([use_eot, 9, seqlen, width, total, 0, 0, *top.tolist()], dtype=np.int64)
    out = []
    for v in vs.tolist():
        row, cu = np.full(width + seqlen, -1, np.int64), np.full(seqlen + 1, -1, np.int32)
        out.append((row, cu, width, one_window(src, offsets, meta, v, row, cu)))
    return out


def _finish_windows(raw):
    return [(_ints(row[:w]), _ints(row[w:]), _ints(cu[:n])) for row, cu, w, n in raw]


def _window_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):

    stream, ends = naive_stream(docs, 9 if use_eot else None)
    return [ref_window(stream, ends, v, seqlen, seqlen + labels, 0) for v in vs.tolist()]


def _gather_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import gather_windows

    src, offsets, top, total = arrays
    width, k = seqlen + labels, vs.size
    rows, pos = np.empty((k, width), np.int64), np.empty((k, seqlen), np.int64)
    cu, ncu = np.empty((k, seqlen + 1), np.int32), np.empty(k, np.int64)
    cursors, first = np.full(1, -1, np.int64), np.full(k, -1, np.int64)
    gather_windows(
        src, cursors, offsets, top, use_eot, 9, vs, seqlen, width, total, 0, rows, pos, cu, ncu,
        first,
    )  # fmt: skip
    return rows, pos, cu, ncu, first


def _finish_gather(raw):
    rows, pos, cu, ncu, first = raw
    return [
        (_ints(rows[r]), _ints(pos[r]), _ints(cu[r, : ncu[r]]), int(first[r]))
        for r in range(len(ncu))
    ]


def _gather_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    """Each window as :func:`ref_window` copies it, and the document it starts in."""
    stream, ends = naive_stream(docs, 9 if use_eot else None)
    offsets = np.cumsum([0] + [len(d) for d in docs]).tolist()
    return [
        (
            *ref_window(stream, ends, v, seqlen, seqlen + labels, 0),
            ref_find_doc(offsets, use_eot, v),
        )
        for v in vs.tolist()
    ]


def _find_doc_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import find_doc

    _, offsets, top, _ = arrays
    return [int(find_doc(offsets, top, use_eot, v)) for v in vs.tolist()]


def _find_doc_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    offsets = np.cumsum([0] + [len(d) for d in docs]).tolist()
    return [ref_find_doc(offsets, use_eot, v) for v in vs.tolist()]


def _ranges_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import window_ranges

    _, offsets, top, total = arrays
    start, length = np.empty(vs.size, np.int64), np.empty(vs.size, np.int64)
    window_ranges(offsets, top, use_eot, vs, seqlen + labels, total, start, length)
    return _ints(start), _ints(length)


def _ranges_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    offsets = np.cumsum([0] + [len(d) for d in docs]).tolist()
    flat = ref_flat_positions(offsets, use_eot)
    total = len(flat) - 1
    ends = [flat[min(v + seqlen + labels, total)] for v in vs.tolist()]
    return [flat[v] for v in vs.tolist()], [b - flat[v] for v, b in zip(vs.tolist(), ends)]


def _flat_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import flat_position

    _, offsets, top, total = arrays
    return [int(flat_position(offsets, top, use_eot, v)) for v in range(total + 1)]


def _flat_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    return ref_flat_positions(np.cumsum([0] + [len(d) for d in docs]).tolist(), use_eot)


def _sampled_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import INDEX_STEP, fill_sampled_index

    offsets = arrays[1]
    top = np.zeros((offsets.size - 2) // INDEX_STEP + 1, np.int64)
    fill_sampled_index(offsets, use_eot, top)
    return _ints(top)


def ref_sampled_index(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    """The virtual start of every ``INDEX_STEP``-th document."""
    from mmpack._src.kernels.window import INDEX_STEP

    offsets = np.cumsum([0] + [len(d) for d in docs]).tolist()
    return [offsets[j] + j * use_eot for j in range(0, len(docs), INDEX_STEP)]


# =========================================================================== the sampler's deal
def naive_deal(order, start, world_size, drop_last):
    """Lists: rank r takes remaining positions start+r, start+r+W, ...; pad by wrapping or drop."""
    n = len(order)
    rest = order[start:] if start < n else []
    if drop_last:
        rest = rest[: len(rest) // world_size * world_size]
    else:
        want = -(-len(rest) // world_size) * world_size
        wrapped = order * (want // max(n, 1) + 1) if n else []
        rest = rest + wrapped[: want - len(rest)]
    return [rest[r::world_size] for r in range(world_size)]


# =========================================================================== subsets
def twin_parent_starts(offsets, shift, starts, lengths) -> tuple[int, list[int]]:
    """Each range's parent start by a linear scan for the document holding its first token
    (the last document for a start at the end); stops at the first range that crosses into
    the next document: ``(its index or -1, the starts found before it)``."""
    offsets = [int(v) for v in offsets]
    found = []
    for k, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        d = max(j for j in range(len(offsets) - 1) if offsets[j] <= s)
        if s + n > offsets[d + 1]:
            return k, found
        found.append(s + int(shift[d]))
    return -1, found


def twin_split_parts(ids, keys, thresholds) -> list[int]:
    """Each id's part: its hash in Python integers (``id ^ k0``, then twice ``z -> mix(z +
    golden) ^ k``), then the first part whose threshold is not below it."""
    out = []
    for d in ids.tolist():
        z = d ^ int(keys[0])
        for r in (1, 2):
            z = mix64_slow((z + GOLDEN) & M64) ^ int(keys[r])
        out.append(
            next(p for p, t in enumerate(thresholds.tolist()) if z <= t or p == len(thresholds) - 1)
        )
    return out


def _split_parts_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n = int(rng.integers(0, size + 1))
    ids = rng.integers(0, 2**62, size=n).astype(np.int64)
    keys = rng.integers(0, 2**64, size=8, dtype=np.uint64)
    parts = int(rng.integers(1, 5))
    thresholds = np.sort(rng.integers(0, 2**64, size=parts, dtype=np.uint64))
    thresholds[-1] = np.uint64(2**64 - 1)
    return ids, keys, thresholds


def _split_parts_kernel(ids, keys, thresholds):
    from mmpack._src.kernels.subset import split_parts

    out = np.zeros(ids.shape[0], dtype=np.int64)
    split_parts(ids, keys, thresholds, out)
    return out.tolist()


def _parent_starts_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    docs = int(rng.integers(1, 12))
    lens = rng.choice([0, 1, 3, 8], size=docs)
    offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    shift = rng.integers(0, 1000, size=docs).astype(np.int64)
    k = int(rng.integers(0, max(2, size // 50)))
    total = int(offsets[-1])
    starts = rng.integers(0, total + 1, size=k).astype(np.int64)
    lengths = np.minimum(rng.integers(0, 4, size=k), total - starts).astype(np.int64)
    return offsets, shift, starts, lengths


def _parent_starts_kernel(offsets, shift, starts, lengths):
    from mmpack._src.kernels.subset import parent_starts

    out = np.zeros(starts.shape[0], dtype=np.int64)
    bad = parent_starts(offsets, shift, starts, lengths, out)
    return int(bad), out[: bad if bad >= 0 else starts.shape[0]].tolist()


# =========================================================================== balanced dealing
def deal_groups_slow(costs, group_ptr, world_size):
    """Each group dealt by the rule of :mod:`mmpack._src.kernels.balance`, spelled out: samples by
    decreasing cost (then slot) to the least loaded rank with room (then lowest rank), then, while
    one exists, the swap of a sample of the most loaded rank (lowest of equals) with a cheaper
    sample of another rank whose larger new load is smallest and below the peak (first found in
    slot order), at most ``4 k`` swaps."""
    owner = []
    for lo, hi in zip(group_ptr[:-1], group_ptr[1:]):
        c = [int(x) for x in costs[lo:hi]]
        k = len(c)
        m = k // world_size
        mine = [0] * k
        load = [0] * world_size
        held = [0] * world_size
        for s in sorted(range(k), key=lambda s: (-c[s], s)):
            room = [r for r in range(world_size) if held[r] < m]
            r = min(room, key=lambda r: (load[r], r))
            mine[s] = r
            load[r] += c[s]
            held[r] += 1
        for _ in range(4 * k):
            top = max(range(world_size), key=lambda r: (load[r], -r))
            best = None
            for a in range(k):
                for b in range(k):
                    if mine[a] != top or mine[b] == top or c[b] >= c[a]:
                        continue
                    d = c[a] - c[b]
                    new = max(load[top] - d, load[mine[b]] + d)
                    if new < load[top] and (best is None or new < best[0]):
                        best = (new, a, b)
            if best is None:
                break
            _, a, b = best
            d = c[a] - c[b]
            load[top] -= d
            load[mine[b]] += d
            mine[a], mine[b] = mine[b], top
        owner.extend(mine)
    return owner


def _deal_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    world = int(rng.integers(1, 6))
    sizes = [world * int(rng.integers(0, 5)) for _ in range(int(rng.integers(0, 4)))]
    ptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=ptr[1:])
    scale = int(rng.choice([3, 50, 10**6]))
    costs = rng.integers(0, scale, int(ptr[-1])).astype(np.int64)
    return costs, ptr, world


def _deal_kernel(costs, ptr, world):
    from mmpack._src.kernels.balance import deal_groups

    return deal_groups(costs, ptr, world).tolist()


# =========================================================================== context-parallel layout
def lay_out_fields_slow(srcs, cu, cp_size, cp_rank, fills, positions, masked, from_first):
    """The padded batch (``cp_rank = -1``) or rank ``cp_rank``'s share of every field, built
    token by token: each segment's tokens then its padding (the field's fill, or for field
    ``positions`` its first position plus the offset) up to a multiple of ``2 C``, cut into
    ``2 C`` equal chunks, the rank keeping chunks ``r`` and ``2 C - 1 - r`` of each; the mask
    ``1.0`` where field ``masked``'s token is not its fill.  A field ``f`` with
    ``from_first[f]`` has its segment's tokens not read but taken from its first (plus the
    offset for field ``positions``).  Also the padded boundaries and the longest padded
    segment, and every rank's positions in the padded batch."""
    unit = 2 * cp_size
    rows = []
    for f, src in enumerate(srcs):
        out = []
        for a, b in zip(cu[:-1], cu[1:]):
            padded = -(-(b - a) // unit) * unit
            seg = []
            for j in range(padded):
                if a + j < b and from_first[f]:
                    seg.append(int(src[a]) + j if f == positions else int(src[a]))
                elif a + j < b:
                    seg.append(int(src[a + j]))
                else:
                    seg.append(int(src[a]) + j if f == positions else fills[f])
            if cp_rank < 0:
                out.extend(seg)
            else:
                c = padded // unit
                out.extend(seg[cp_rank * c : (cp_rank + 1) * c])
                out.extend(seg[(unit - 1 - cp_rank) * c : (unit - cp_rank) * c])
        rows.append(out)
    mask = [] if masked < 0 else [1.0 if v != fills[masked] else 0.0 for v in rows[masked]]
    padded_cu = [0]
    for a, b in zip(cu[:-1], cu[1:]):
        padded_cu.append(padded_cu[-1] + -(-(b - a) // unit) * unit)
    longest = max([y - x for x, y in zip(padded_cu[:-1], padded_cu[1:])], default=0)
    ranks = []
    for r in range(cp_size):
        where = []
        for x, y in zip(padded_cu[:-1], padded_cu[1:]):
            c = (y - x) // unit
            where += [x + r * c + j for j in range(c)]
            where += [x + (unit - 1 - r) * c + j for j in range(c)]
        ranks.append(where)
    return rows, mask, padded_cu, longest, ranks


def _cp_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n = int(rng.integers(1, size + 2))
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 8))))  # repeats: empty segments
    cu = np.concatenate([[0], cuts, [n]]).astype(np.int64)
    dtype = rng.choice([np.int64, np.int32])
    k = int(rng.integers(1, 5))
    srcs = tuple(
        rng.integers(-100, 50, n + int(rng.integers(0, 3))).astype(dtype) for _ in range(k)
    )
    cp_size = int(rng.integers(1, 5))
    fills = [int(rng.choice([-100, 0, 7])) for _ in range(k)]
    out_dtype = rng.choice([np.int64, np.int32])  # the block's: the copy casts
    from_first = [bool(rng.integers(0, 2)) for _ in range(k)]
    return (srcs, cu, cp_size, int(rng.integers(-1, cp_size)), fills, int(rng.integers(-1, k)),
            int(rng.integers(-1, k)), from_first, out_dtype)  # fmt: skip


def _cp_kernel(srcs, cu, cp_size, cp_rank, fills, positions, masked, from_first, out_dtype):
    from mmpack._src.kernels.cp_layout import lay_out_fields, zigzag_into

    # Rows allocated longer than the layout needs (as collate's bound allocates them): the
    # kernel writes the boundaries, and a row's first T (or T / C) entries.
    room = int(cu[-1]) + (len(cu) - 1) * (2 * cp_size - 1) + 3
    block = np.full((len(srcs) + 1, room), 99, dtype=out_dtype)
    mask = np.full(room if masked >= 0 else 0, 9.0, dtype=np.float32)
    params = np.array([cp_size, cp_rank, positions, masked, *fills, *from_first], dtype=np.int64)
    padded_cu = np.empty_like(cu)
    longest = lay_out_fields(srcs, cu, params, block, mask, padded_cu)
    total = int(padded_cu[-1])
    size = total if cp_rank < 0 else total // cp_size
    assert (block[:, size:] == 99).all() and (block[-1] == 99).all(), "wrote past its rows"
    assert (mask[size:] == 9.0).all(), "wrote past the mask"
    ranks = np.empty((cp_size, total // cp_size), dtype=np.int64)
    zigzag_into(padded_cu, cp_size, 0, ranks)
    return (block[: len(srcs), :size].tolist(), mask[:size].tolist(), padded_cu.tolist(),
            longest, ranks.tolist())  # fmt: skip


# =========================================================================== PAIRS, COVERED_BY
def _pair(
    kernel: str, reference: str, inputs: Any, run_kernel: Any, run_reference: Any, **kw: Any
) -> Pair:
    kw.setdefault("via", f"mmpack._src.kernels.{kernel}")
    return Pair(f"mmpack._src.kernels.{kernel}", reference=reference, inputs=inputs,
                run_kernel=run_kernel, run_reference=run_reference, **kw)  # fmt: skip


def _occurrence_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    mixture, n = _mixture_inputs(rng, size)
    walk = reference_assignment(mixture.quotas.tolist(), mixture.period, n)
    return mixture, [walk[t] for t in rng.permutation(n).tolist()]


def _occurrence_kernel(mixture, draws):
    return [mixture._occurrence_position(k, o) for k, o in draws]


def _occurrence_ref(mixture, draws):
    walk = reference_assignment(mixture.quotas.tolist(), mixture.period, len(draws))
    position = {draw: t for t, draw in enumerate(walk)}
    return [position[draw] for draw in draws]


_VIEW = "mmpack._src.views"


# ------------------------------------------------------------------ packing plans, windows
def ref_items(doc_lens, seqlen, eot, long_docs):
    """Items in document order: (doc, start, n_tokens, slots); eot rides on slots < seqlen."""
    e = int(eot)
    items = []
    for d, n in enumerate(doc_lens):
        n = int(n)
        t = n + e
        if t == 0:
            continue
        if t <= seqlen:
            items.append((d, 0, n, t))
        elif long_docs == "split":
            start = 0
            while n + e - start > seqlen:
                items.append((d, start, seqlen, seqlen))
                start += seqlen
            items.append((d, start, n - start, n - start + e))
        elif long_docs == "truncate":
            items.append((d, 0, seqlen - e, seqlen))
    return items


def ref_bfd(doc_lens, seqlen, eot, long_docs):
    """Per-item best-fit decreasing, O(items * bins): lists of items per bin."""
    items = ref_items(doc_lens, seqlen, eot, long_docs)
    items.sort(key=lambda it: -it[3])  # stable: document order among equal sizes
    bins, free = [], []
    for it in items:
        fits = [b for b in range(len(bins)) if free[b] >= it[3]]
        if fits:
            b = min(fits, key=lambda b: free[b])
        else:
            bins.append([])
            free.append(seqlen)
            b = len(bins) - 1
        bins[b].append(it)
        free[b] -= it[3]
    return bins


def ref_stream(doc_lens, seqlen, eot, long_docs, window):
    """Per-item streaming best fit with the kernel's tie rules (stamps: when a bin last changed)."""
    emitted, open_bins, clock = [], [], 0
    for it in ref_items(doc_lens, seqlen, eot, long_docs):
        size = it[3]
        if size == seqlen:
            emitted.append([it])
            continue
        fits = [b for b in open_bins if b["free"] >= size]
        if fits:
            b = min(fits, key=lambda b: (b["free"], -b["stamp"]))
        else:
            if len(open_bins) == window:
                c = min(open_bins, key=lambda b: (b["free"], b["stamp"]))
                open_bins.remove(c)
                emitted.append(c["items"])
            b = {"free": seqlen, "items": [], "stamp": 0, "id": clock}
            open_bins.append(b)
        b["items"].append(it)
        b["free"] -= size
        clock += 1
        b["stamp"] = clock
        if b["free"] == 0:
            open_bins.remove(b)
            emitted.append(b["items"])
    emitted += [b["items"] for b in sorted(open_bins, key=lambda b: b["id"])]
    return emitted


def naive_stream(docs, eot):
    stream = []
    ends = []  # stream positions right after a document's last token (incl. its eot)
    for d in docs:
        stream.extend(int(t) for t in d)
        if eot is not None:
            stream.append(eot)
        if eot is not None or len(d):
            ends.append(len(stream))
    return stream, ends


# ------------------------------------------------------------------------------ loss masks
def twin_masked_window_labels(mask, base, offsets, use_eot, vstarts, seqlen, total, rows, ignore):
    """Per virtual position: its target flag (a document token's mask, 1 for an eot)."""
    flags, owner = [], []  # owner: the flat position of a document token, -1 for an eot
    for j in range(len(offsets) - 1):
        for f in range(offsets[j], offsets[j + 1]):
            owner.append(f)
        if use_eot:
            owner.append(-1)
    assert len(owner) == total
    out = np.empty((len(vstarts), seqlen), dtype=rows.dtype)
    for k, v in enumerate(vstarts):
        for t in range(seqlen):
            q = v + t + 1
            if q >= total:
                out[k, t] = ignore
                continue
            f = owner[q]
            flags = 1 if f < 0 else mask[base[k] + f]
            out[k, t] = rows[k, t + 1] if flags else ignore
    return out


def twin_mask_pieces(mask, mask_starts, lengths, has_eot, row_ptr, shift, fill, out):
    """Lay each row's pieces out position by position, then fill where a token's mask is 0."""
    out = out.copy()
    for r in range(len(row_ptr) - 1):
        laid = []  # (position, mask value) of every piece token in the row
        at = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            laid += [(at + i, mask[mask_starts[q] + i]) for i in range(lengths[q])]
            at += lengths[q] + has_eot[q]
        for p, m in laid:
            if m == 0 and p - shift >= 0:
                out[r, p - shift] = fill
    return out


def _masked_window_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    lens = rng.integers(0, 10, size=max(1, size // 5)).astype(np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    use_eot = int(rng.integers(0, 2))
    total = int(offsets[-1]) + use_eot * len(lens)
    if total == 0:
        lens[0], use_eot = 1, 1
        offsets[1:] += 1
        total = int(offsets[-1]) + len(lens)
    shift = int(rng.integers(0, 4))
    mask = rng.integers(0, 2, size=int(offsets[-1]) + shift).astype(np.uint8)
    k = int(rng.integers(1, 7))
    seqlen = int(rng.integers(1, 21))
    vstarts = rng.integers(0, total, size=k).astype(np.int64)
    base = np.full(k, shift, dtype=np.int64)
    rows = rng.integers(0, 1000, size=(k, seqlen + 1)).astype(np.int64)
    return mask, base, offsets, use_eot, vstarts, seqlen, total, rows


def _masked_window_kernel(mask, base, offsets, use_eot, vstarts, seqlen, total, rows):
    from mmpack._src.kernels.window import gather_masked_windows

    src = np.arange(int(offsets[-1]), dtype=np.int64) * 7 + 3  # token of flat position f
    k = len(vstarts)
    rows = np.empty((k, seqlen + 1), np.int64)
    pos, out = np.empty((k, seqlen), np.int64), np.empty((k, seqlen), np.int64)
    cu, ncu = np.empty((k, seqlen + 1), np.int32), np.empty(k, np.int64)
    top = np.empty(0, dtype=np.int64)  # no sampled index: the kernel searches the offsets
    gather_masked_windows(
        src, np.full(1, -1, np.int64), mask, base, offsets, top, use_eot, 9, vstarts, seqlen,
        total, 0, IGNORE, rows, pos, cu, ncu, out, np.empty(k, np.int64),
    )  # fmt: skip
    return rows, out


def _masked_window_ref(mask, base, offsets, use_eot, vstarts, seqlen, total, rows):
    docs = [np.arange(offsets[j], offsets[j + 1]) * 7 + 3 for j in range(len(offsets) - 1)]
    stream, ends = naive_stream(docs, 9 if use_eot else None)
    windows = [ref_window(stream, ends, v, seqlen, seqlen + 1, 0)[0] for v in vstarts.tolist()]
    rows = np.array(windows, dtype=np.int64).reshape(len(vstarts), seqlen + 1)
    labels = twin_masked_window_labels(
        mask, base, offsets, use_eot, vstarts, seqlen, total, rows, IGNORE
    )
    return rows, labels


def _mask_pieces_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    n_rows = int(rng.integers(1, 7))
    per = rng.integers(0, 6, size=n_rows)
    lengths = rng.integers(0, 9, size=int(per.sum())).astype(np.int64)
    has_eot = rng.integers(0, 2, size=lengths.shape[0]).astype(np.int64)
    row_ptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(per, out=row_ptr[1:])
    widths = [int((lengths + has_eot)[row_ptr[r] : row_ptr[r + 1]].sum()) for r in range(n_rows)]
    seqlen = max(widths + [1])
    mask = rng.integers(0, 2, size=int(lengths.sum()) + 50).astype(np.uint8)
    mask_starts = rng.integers(0, 51, size=lengths.shape[0]).astype(np.int64)
    shift = int(rng.integers(0, 2))
    out = rng.integers(0, 1000, size=(n_rows, seqlen)).astype(np.int64)
    return mask, mask_starts, lengths, has_eot, row_ptr, shift, out


def _mask_pieces_kernel(mask, mask_starts, lengths, has_eot, row_ptr, shift, out):
    from mmpack._src.kernels.packed_rows import mask_pieces

    got = out.copy()
    mask_pieces(mask, mask_starts, lengths, has_eot, row_ptr, shift, IGNORE, got)
    return got


def _mask_pieces_ref(mask, mask_starts, lengths, has_eot, row_ptr, shift, out):
    return twin_mask_pieces(mask, mask_starts, lengths, has_eot, row_ptr, shift, IGNORE, out)


# ------------------------------------------------------------------------------ provenance
def twin_window_pieces(docs, use_eot, width, v):
    """The pieces of the window ``S[v : v + width]``, from the stream built token by token: each
    position's owner (document, token offset or ``None`` for its eot), grouped in runs."""
    owners = []
    for j, d in enumerate(docs):
        owners.extend((j, t) for t in range(len(d)))
        if use_eot:
            owners.append((j, None))
    pieces = []
    for p in range(v, min(v + width, len(owners))):
        j, t = owners[p]
        if not pieces or pieces[-1]["doc"] != j:
            first = len(docs[j]) if t is None else t
            pieces.append({"doc": j, "start": first, "stop": first, "eot": 0, "at": p - v})
        if t is None:
            pieces[-1]["eot"] = 1
        else:
            pieces[-1]["stop"] = t + 1
    return [(q["doc"], q["start"], q["stop"], q["eot"], q["at"]) for q in pieces]


def _window_pieces_kernel(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    from mmpack._src.kernels.window import find_doc, window_pieces

    _, offsets, top, total = arrays
    vs = np.ascontiguousarray(vs, dtype=np.int64)
    first = np.array([find_doc(offsets, top, use_eot, v) for v in vs.tolist()], np.int64)
    out, row_ptr = window_pieces(offsets, use_eot, first, vs, seqlen + labels, total)
    assert out.shape == (6, row_ptr[-1]) and row_ptr[0] == 0
    return _pieces_by_row(row_ptr, out)


def _pieces_by_row(row_ptr, out):
    """Per row ``k``: its pieces as tuples of rows 1.. of ``out``; row 0 (the row) checked."""
    rows = []
    for k in range(row_ptr.shape[0] - 1):
        cols = out[:, row_ptr[k] : row_ptr[k + 1]]
        assert (cols[0] == k).all()
        rows.append([tuple(_ints(c)) for c in cols[1:].T])
    return rows


def _window_pieces_ref(docs, use_eot, seqlen, labels, sampled, vs, arrays):
    return [twin_window_pieces(docs, use_eot, seqlen + labels, v) for v in vs.tolist()]


def _bin_pieces_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    """A valid plan of random pieces (the kernel's callers check plans first) and bins of it."""
    doc_lens = rng.integers(0, 20, int(rng.integers(1, 9))).tolist()
    pieces = []
    for _ in range(int(rng.integers(0, size + 2))):
        d = int(rng.integers(0, len(doc_lens)))
        s = int(rng.integers(0, doc_lens[d] + 1))
        pieces.append((d, s, int(rng.integers(0, doc_lens[d] - s + 1))))
    cuts = sorted(rng.integers(0, len(pieces) + 1, int(rng.integers(0, 6))).tolist())
    bin_ptr = np.array([0, *cuts, len(pieces)], np.int64)
    bins = rng.integers(0, bin_ptr.shape[0] - 1, int(rng.integers(0, size + 1))).astype(np.int64)
    has_eot = rng.integers(0, 2, len(pieces)).tolist()
    return bin_ptr, pieces, has_eot, bins


def _bin_pieces_kernel(bin_ptr, pieces, has_eot, bins):
    from mmpack._src.kernels.packed_rows import bin_pieces

    arr = np.array(pieces, dtype=np.int64).reshape(-1, 3)
    counts = bin_ptr[bins + 1] - bin_ptr[bins]
    row_ptr = np.zeros(bins.shape[0] + 1, np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    which = np.concatenate([np.arange(bin_ptr[b], bin_ptr[b + 1]) for b in bins] + [[]])
    which = which.astype(np.int64)
    lengths = np.ascontiguousarray(arr[which, 2])
    eot = np.array(has_eot, dtype=np.int64)[which]
    out = np.full((6, int(row_ptr[-1])), -1, np.int64)
    layout = encoded((bin_ptr, arr[:, 0], arr[:, 1], arr[:, 2]), regions=1 + len(bins) % 3)
    bin_ptr, piece_ref, _, regions, split = layout
    bin_pieces(bin_ptr, piece_ref, regions, split, bins, row_ptr, lengths, eot, out)
    return _pieces_by_row(row_ptr, out)


def twin_bin_pieces(bin_ptr, pieces, has_eot, bins):
    """Per bin: (doc, start, stop, eot, at) of each piece, ``at`` the slots of the pieces before
    it."""
    out = []
    for b in bins.tolist():
        at, row = 0, []
        for p in range(int(bin_ptr[b]), int(bin_ptr[b + 1])):
            d, s, n = pieces[p]
            row.append((d, s, s + n, has_eot[p], at))
            at += n + has_eot[p]
        out.append(row)
    return out


def _place_pieces_inputs(rng: np.random.Generator, size: int) -> tuple[Any, ...]:
    """A batch of random rows dealt to random sources, each source's rows with random pieces."""
    n = int(rng.integers(1, size // 4 + 3))
    src = rng.integers(0, int(rng.integers(1, 4)), n)
    sources = []
    for k in np.unique(src).tolist():
        where = np.flatnonzero(src == k).astype(np.int64)
        counts = rng.integers(0, 5, where.shape[0])
        row_ptr = np.zeros(where.shape[0] + 1, np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        block = rng.integers(0, 1000, (6, int(row_ptr[-1]))).astype(np.int64)
        block[0] = np.repeat(np.arange(where.shape[0]), counts)  # each piece's own row
        sources.append((k, where, block, row_ptr))
    return n, sources


def _place_pieces_kernel(n, sources):
    from mmpack._src.kernels.provenance import place_pieces

    cu_docs = np.zeros(n + 1, np.int64)
    for k, where, block, row_ptr in sources:
        place_pieces(block, row_ptr, where, cu_docs, k, np.empty((7, 0), np.int64))
    np.cumsum(cu_docs, out=cu_docs)
    out = np.full((7, int(cu_docs[-1])), -1, np.int64)
    for k, where, block, row_ptr in sources:
        place_pieces(block, row_ptr, where, cu_docs, k, out)
    return _ints(cu_docs), [tuple(_ints(c)) for c in out.T]


def twin_place_pieces(n, sources):
    """The batch's row offsets and its pieces (row, doc, start, stop, eot, at, source), batch
    row by batch row, each row's pieces as its source listed them."""
    rows: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
    for k, where, block, row_ptr in sources:
        for r, b in enumerate(where.tolist()):
            for q in range(int(row_ptr[r]), int(row_ptr[r + 1])):
                rows[b].append((b, *_ints(block[1:, q]), k))
    cu_docs = [0]
    for row in rows:
        cu_docs.append(cu_docs[-1] + len(row))
    return cu_docs, [piece for row in rows for piece in row]


PAIRS: list[Pair] = [
    _pair(
        "cp_layout.lay_out_fields",
        "lay_out_fields_slow",
        _cp_inputs,
        _cp_kernel,
        lambda srcs, cu, *rest: lay_out_fields_slow(
            [x.tolist() for x in srcs],
            cu.tolist(),
            *rest[:-1],  # values fit either dtype
        ),
    ),
    _pair(
        "balance.deal_groups",
        "deal_groups_slow",
        _deal_inputs,
        _deal_kernel,
        lambda costs, ptr, world: deal_groups_slow(costs.tolist(), ptr.tolist(), world),
    ),
    # store, pagestate, eos
    _pair("store.xxh64", "xxh64_slow", _xxh64_inputs, _xxh64_kernel, xxh64_slow),
    _pair(
        "store.xxh64_stripes",
        "xxh64_stripes_slow",
        _xxh64_stripes_inputs,
        _xxh64_stripes_kernel,
        xxh64_stripes_slow,
    ),
    _pair("store.convert_tokens", "convert_slow", _convert_inputs, _convert_kernel, _convert_ref),
    _pair(
        "store.first_decrease",
        "first_decrease_slow",
        _offsets_inputs,
        _first_decrease_kernel,
        lambda offsets: first_decrease_slow(offsets.tolist()),
    ),
    _pair(
        "pagestate.all_pages_present",
        "all_pages_present_slow",
        _present_inputs,
        _present_kernel,
        all_pages_present_slow,
    ),
    _pair(
        "store.check_ranges",
        "check_ranges_slow",
        _check_inputs,
        _check_kernel,
        check_ranges_slow,
        slow=True,
    ),
    _pair("eos.find_eos", "find_eos_slow", _eos_inputs, _eos_kernel, find_eos_slow),
    # masking
    _pair("masking.sample_keys", "sample_key_slow", _keys_inputs, _keys_kernel, _keys_ref),
    _pair(
        "masking.mlm_hashed_rows",
        "mlm_slow",
        _mlm_inputs,
        _mlm_hashed_kernel,
        _mlm_ref,
        via=f"{_VIEW}.masking.corrupt_rows",
        bench_size=500,
    ),
    _pair(
        "masking.mlm_indexed_rows",
        "mlm_slow",
        _mlm_inputs,
        _mlm_indexed_kernel,
        _mlm_ref,
        bench_size=500,
    ),
    # permutation
    _pair(
        "permutation.derive_keys",
        "ref_keys",
        _derive_inputs,
        _derive_kernel,
        _derive_ref,
        via="mmpack._src.sampling.permutation.epoch_keys",
        bench_size=200,
    ),
    _pair(
        "permutation.permute_many",
        "ref_permute",
        _perm_inputs,
        _permute_kernel,
        _permute_ref,
        via="mmpack.Permutation.map",
    ),
    _pair(
        "permutation.invert_many",
        "ref_permute",
        _perm_inputs,
        _invert_kernel,
        _invert_ref,
        via="mmpack.Permutation.inverse_map",
    ),
    _pair(
        "permutation.permute_many_keyed", "ref_permute", _keyed_inputs, _keyed_kernel, _keyed_ref
    ),
    # mixture
    _pair(
        "mixture.locate_many",
        "reference_assignment, reference_item",
        _mixture_inputs,
        _locate_kernel,
        _locate_ref,
        via="mmpack.Mixture.source_of_many",
        bench_size=100,
        slow=True,
    ),
    _pair(
        "mixture.prefix_counts",
        "reference_assignment",
        _mixture_inputs,
        _counts_kernel,
        _counts_ref,
        via="mmpack.Mixture.counts",
        bench_size=100,
    ),
    _pair(
        "mixture.occurrence_position",
        "reference_assignment",
        _occurrence_inputs,
        _occurrence_kernel,
        _occurrence_ref,
        via="mmpack.Mixture._occurrence_position",
        bench_size=100,
    ),
    _pair(
        "mixture.max_prefix_error",
        "reference_assignment",
        _mixture_inputs,
        _prefix_error_kernel,
        _prefix_error_ref,
        bench_size=100,
    ),
    # mixture schedules
    _pair(
        "schedule.split_locate",
        "reference_split_walk, reference_item",
        _schedule_inputs,
        _schedule_locate_kernel,
        _schedule_locate_ref,
        via="mmpack.Mixture.source_of_many",
        bench_size=30,
    ),
    _pair(
        "schedule.split_counts",
        "reference_split_walk",
        _schedule_inputs,
        _schedule_counts_kernel,
        _schedule_counts_ref,
        via="mmpack.Mixture.counts",
        bench_size=30,
    ),
    _pair(
        "schedule.split_positions",
        "reference_split_walk",
        _schedule_inputs,
        _schedule_positions_kernel,
        _schedule_positions_ref,
        via="mmpack._src.sampling.schedule_plan.SchedulePlan.positions_of",
        bench_size=30,
    ),
    # megatron-core's order
    _pair(
        "megatron_order.fill_sample_index",
        "ref_sample_index",
        _megatron_inputs,
        _sample_index_kernel,
        _sample_index_ref,
        bench_size=200,
    ),
    _pair(
        "megatron_order.copy_pieces",
        "ref_megatron_samples",
        _megatron_inputs,
        _megatron_samples_kernel,
        ref_megatron_samples,
        bench_size=200,
    ),
    # packed rows and plans
    _pair(
        "packed_rows.one_bin",
        "twin_bin",
        _packed_inputs,
        _one_bin_kernel,
        _one_bin_ref,
        finish=_finish_bins,
    ),
    _pair(
        "packed_rows.fill_rows",
        "twin_bin",
        _fill_rows_inputs,
        _fill_rows_kernel,
        _fill_rows_ref,
        finish=_finish_rows,
    ),
    _pair(
        "plan_bestfit.bfd_groups",
        "ref_bfd",
        _plan_inputs,
        _bfd_kernel,
        _bfd_ref,
        via=f"{_VIEW}.plan.build_plan(algorithm='bfd')",
        bench_size=300,
        slow=True,
        finish=_finish_bfd,
    ),
    _pair(
        "plan_bestfit.online_place",
        "ref_stream",
        _plan_inputs,
        _online_kernel,
        _online_ref,
        via=f"{_VIEW}.plan.build_plan(algorithm='online')",
        bench_size=300,
        finish=_plan_bins,
    ),
    # streaming packer
    _pair("plan_bestfit.place_batch", "ref_place", _place_inputs, _place_kernel, _place_ref),
    _pair(
        "streaming_batch.layout_batch",
        "ref_pack",
        _packer_inputs,
        _packer_kernel,
        lambda *a: ref_pack(*a),
        via="mmpack.StreamingPacker",
        bench_size=300,
        slow=True,
        finish=_finish_packer,
    ),
    _pair(
        "streaming_batch.gather_pieces",
        "ref_gather_pieces",
        _gather_pieces_inputs,
        _gather_pieces_kernel,
        _gather_pieces_ref,
    ),
    # subsets
    _pair(
        "subset.parent_starts",
        "twin_parent_starts",
        _parent_starts_inputs,
        _parent_starts_kernel,
        twin_parent_starts,
        bench_size=500,
    ),
    _pair(
        "subset.split_parts",
        "twin_split_parts",
        _split_parts_inputs,
        _split_parts_kernel,
        twin_split_parts,
        bench_size=500,
    ),
    # loss masks
    _pair(
        "window.gather_masked_windows",
        "twin_masked_window_labels",
        _masked_window_inputs,
        _masked_window_kernel,
        _masked_window_ref,
        bench_size=500,
    ),
    _pair(
        "packed_rows.mask_pieces",
        "twin_mask_pieces",
        _mask_pieces_inputs,
        _mask_pieces_kernel,
        _mask_pieces_ref,
        bench_size=500,
    ),
    # windows
    _pair(
        "window.one_window",
        "ref_window",
        _window_inputs,
        _one_window_kernel,
        _window_ref,
        bench_size=300,
        finish=_finish_windows,
    ),
    _pair(
        "window.gather_windows",
        "ref_window",
        _window_inputs,
        _gather_kernel,
        _gather_ref,
        bench_size=300,
        finish=_finish_gather,
    ),
    _pair(
        "window.find_doc",
        "ref_find_doc",
        _window_inputs,
        _find_doc_kernel,
        _find_doc_ref,
        bench_size=300,
    ),
    _pair(
        "window.window_ranges",
        "ref_flat_positions",
        _window_inputs,
        _ranges_kernel,
        _ranges_ref,
        bench_size=300,
    ),
    _pair(
        "window.flat_position",
        "ref_flat_positions",
        _window_inputs,
        _flat_kernel,
        _flat_ref,
        bench_size=300,
    ),
    # provenance
    _pair(
        "window.window_pieces",
        "twin_window_pieces",
        _window_inputs,
        _window_pieces_kernel,
        _window_pieces_ref,
        via=f"{_VIEW}.provenance.window_provenance",
        bench_size=300,
    ),
    _pair(
        "packed_rows.bin_pieces",
        "twin_bin_pieces",
        _bin_pieces_inputs,
        _bin_pieces_kernel,
        twin_bin_pieces,
        via=f"{_VIEW}.provenance.packed_provenance",
        bench_size=300,
    ),
    _pair(
        "provenance.place_pieces",
        "twin_place_pieces",
        _place_pieces_inputs,
        _place_pieces_kernel,
        twin_place_pieces,
        via=f"{_VIEW}.provenance.merged_provenance",
        bench_size=300,
    ),
    _pair(
        "window.fill_sampled_index",
        "ref_sampled_index",
        _window_inputs,
        _sampled_kernel,
        ref_sampled_index,
        bench_size=300,
    ),
]
"""Every kernel compared with its twin (``kernel`` -> ``reference``), in module order."""

_HELPERS: dict[str, tuple[str, ...]] = {
    "store.xxh64": ("store._rotl", "store._round", "store._merge"),
    "masking.mlm_hashed_rows": (
        "masking._contains", "masking.mix64", "masking._allowed_id", "masking._excluded_bits",
        "masking._threshold", "masking._flag_unselectable",
    ),
    "masking.sample_keys": ("masking.sample_key",),
    "permutation.derive_keys": ("permutation.mix64",),
    "permutation.permute_many": ("permutation._encrypt", "permutation.permute"),
    "permutation.invert_many": ("permutation._decrypt", "permutation.invert"),
    "mixture.locate_many": ("mixture.build_period", "mixture._rank_in_period"),
    "schedule.split_locate": (
        "schedule._row_of", "schedule.row_count", "schedule._left_count", "schedule._epoch_of",
    ),
    "megatron_order.copy_pieces": ("megatron_order.sample_pieces",),
    "packed_rows.one_bin": (
        "packed_rows._segment_positions", "packed_rows._segment_ids", "packed_rows._padding",
        "packed_rows._segment_labels", "packed_rows._bin_region", "packed_rows._piece",
    ),
    "packed_rows.fill_rows": ("packed_rows.select_pieces",),
    "plan_bestfit.bfd_groups": (
        "plan_items.n_full_pieces", "plan_items.item_sizes", "plan_items.bfd_items",
        "plan_bestfit._ctz", "plan_bestfit._tree_new", "plan_bestfit._tree_set",
        "plan_bestfit._tree_clear", "plan_bestfit._tree_succ", "plan_bestfit._filled",
        "plan_bestfit._grow", "plan_bestfit._bfd_step", "plan_bestfit.emit_groups",
    ),
    "plan_bestfit.online_place": ("plan_items.online_items", "plan_bestfit.emit_by_rank"),
    "plan_bestfit.place_batch": ("plan_bestfit._widest", "plan_bestfit.row_index"),
    "streaming_batch.layout_batch": ("packed_rows.stream_rows",),
    "window.gather_masked_windows": ("window._mask_labels",),
    "window.window_pieces": ("window._walk_pieces",),
    "balance.deal_groups": ("balance._deal_group",),
    "cp_layout.lay_out_fields": (
        "cp_layout.pad_boundaries", "cp_layout.zigzag_into", "cp_layout._copy_field",
        "cp_layout._copy_masked_field", "cp_layout._first_field",
    ),
    "window.one_window": (
        "window.copy_window", "window._copy_cast", "window._flat_tokens", "window._touch",
        "window._touch_pages", "window._arange", "window._bracket", "window._search",
    ),
}  # fmt: skip
COVERED_BY: dict[str, str] = {
    f"mmpack._src.kernels.{helper}": f"mmpack._src.kernels.{entry}"
    for entry, helpers in _HELPERS.items()
    for helper in helpers
}
"""A kernel without an entry of its own -> the entry whose comparison runs it."""
