"""Cold-data reads: the token mapping's advice, prefetching, and that neither changes any data.

The advice is observable: ``/proc/self/smaps`` lists a mapping's ``VmFlags``, where ``rr`` is
``MADV_RANDOM`` and ``sr`` is ``MADV_SEQUENTIAL``.  Residency is observable too (``mincore``), and
pages are evicted here the way the benchmark does it (``MADV_DONTNEED`` on the mapping, then
``posix_fadvise(POSIX_FADV_DONTNEED)``), which needs ``tmp_path`` on a disk-backed file system.

Run ``pytest tests/views/test_readahead.py``.
"""

from __future__ import annotations

import gc
import itertools
import mmap
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mmpack
from mmpack import PackedDataset, WindowDataset, build
from mmpack._src.store.backends._memmap import PAGE, mapping_of, page_ranges
from mmpack._src.views.readahead import PROBE_EVERY, ColdReads, flat_start
from mmpack.errors import FormatError

EOT = 60000


# ------------------------------------------------------------------------------------ helpers
def vm_flags(arr: np.ndarray) -> set[str]:
    """The VmFlags of the mapping holding ``arr``'s first byte, from /proc/self/smaps."""
    addr = arr.ctypes.data
    text = Path("/proc/self/smaps").read_text()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if lo <= addr < hi:
            line = next(ln for ln in block.splitlines() if ln.startswith("VmFlags:"))
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds address {addr:#x}")


def evict(store) -> None:
    """Drop the store's token pages.  Pages mapped by any live mapping stay cached, so stores
    of earlier tests that only a reference cycle keeps alive are collected first."""
    gc.collect()
    mapping_of(store.tokens).madvise(mmap.MADV_DONTNEED)
    fd = os.open(store.path / "tokens.bin", os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make_docs(n: int, seed: int = 0, max_len: int = 3000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 50000, size=int(k), dtype=np.uint16)
        for k in rng.integers(1, max_len, size=n)
    ]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cold") / "store"
    build(path, make_docs(1500), dtype=np.uint16)  # ~4.5 MB of tokens: > 1000 pages
    return path


@pytest.fixture
def store(store_path):
    return mmpack.open(store_path)


class Spy:
    """Counts a store's prefetch requests (and the ranges asked for), passing them through:
    ``prefetch`` (many ranges) and ``prefetch_range`` (one)."""

    def __init__(self, store) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []
        self.issued = 0
        real = store.prefetch

        def prefetch(starts, lengths):
            self.calls.append((np.asarray(starts).copy(), np.asarray(lengths).copy()))
            n = real(starts, lengths)
            self.issued += n
            return n

        store.prefetch = prefetch
        real_range = store.prefetch_range

        def prefetch_range(start, stop):
            self.calls.append((np.array([start]), np.array([stop - start])))
            n = real_range(start, stop)
            self.issued += n
            return n

        store.prefetch_range = prefetch_range


# ------------------------------------------------------------------------------------ advice
def test_token_mapping_is_advised_random_at_open(store):
    flags = vm_flags(store.tokens)
    assert "rr" in flags and "sr" not in flags


def test_offsets_mapping_keeps_default_advice(store):
    flags = vm_flags(store.offsets)
    assert "rr" not in flags and "sr" not in flags


def test_advise_switches_and_returns_previous(store):
    assert store.advise("sequential") == "random"
    assert "sr" in vm_flags(store.tokens) and "rr" not in vm_flags(store.tokens)
    assert store.advise("normal") == "sequential"
    assert not {"rr", "sr"} & vm_flags(store.tokens)
    assert store.advise("random") == "normal"
    assert "rr" in vm_flags(store.tokens)


@pytest.mark.parametrize("bad", ["RANDOM", "willneed", "", None, 1])
def test_advise_rejects_unknown_patterns(store, bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        store.advise(bad)
    assert "rr" in vm_flags(store.tokens)


def test_verify_scans_with_sequential_advice_then_restores_random(store, monkeypatch):
    seen = []
    backend = store._backend
    real = type(backend).raw_bytes

    def spying_raw_bytes(self, name, start, stop):
        if name == "tokens":
            seen.append(vm_flags(self.tokens))
        return real(self, name, start, stop)

    monkeypatch.setattr(type(backend), "raw_bytes", spying_raw_bytes)
    evict(store)
    summary = store.verify()
    assert summary["bytes"] == store.num_tokens * 2 + (len(store) + 1) * 8
    assert seen and all("sr" in f and "rr" not in f for f in seen)
    assert "rr" in vm_flags(store.tokens) and "sr" not in vm_flags(store.tokens)


def test_verify_restores_the_advice_when_it_fails(tmp_path):
    path = tmp_path / "s"
    build(path, make_docs(50, seed=3), dtype=np.uint16)
    with open(path / "tokens.bin", "r+b") as f:  # flip one token: a checksum mismatch
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))
    store = mmpack.open(path)
    with pytest.raises(FormatError, match="fails its checksum"):
        store.verify()
    assert "rr" in vm_flags(store.tokens)


def test_verify_keeps_an_advice_set_by_the_user(store):
    store.advise("normal")
    store.verify()
    assert not {"rr", "sr"} & vm_flags(store.tokens)


def test_unpickled_store_maps_again_with_random_advice(store):
    clone = pickle.loads(pickle.dumps(store))
    assert clone.tokens.ctypes.data != store.tokens.ctypes.data
    assert "rr" in vm_flags(clone.tokens)


# ------------------------------------------------------------------------------------ residency
def test_resident_follows_the_page_cache(store):
    positions = np.array([0, store.num_tokens // 2, store.num_tokens - 1])
    evict(store)
    assert not store.resident(positions)
    for p in positions:
        int(store.tokens[p])  # fault each page in
    assert store.resident(positions)


def test_prefetch_requests_pages_and_reads_stay_equal(store):
    expect = np.array(store.tokens[: store.num_tokens])  # a private copy, warm
    evict(store)
    starts = np.array([0, 4096, 100_000, store.num_tokens - 10])
    lengths = np.array([10, 5000, 3, 10])
    assert store.prefetch(starts, lengths) == 4
    assert np.array_equal(np.asarray(store.tokens), expect)


@pytest.mark.parametrize(
    ("starts", "lengths", "exc", "match"),
    [
        ([-1], [3], IndexError, "outside"),
        ([0], [10**12], IndexError, "outside"),
        ([5, 6], [1], ValueError, "1-D of one length"),
        ([[1]], [[1]], ValueError, "1-D of one length"),
        ([0.5], [1], TypeError, "integers"),
        ([1], [-2], IndexError, "outside"),
    ],
)
def test_prefetch_rejects_bad_ranges(store, starts, lengths, exc, match):
    with pytest.raises(exc, match=match):
        store.prefetch(np.array(starts), np.array(lengths))


def test_prefetch_range_checks_bounds_and_requests_one_range(store):
    evict(store)
    assert store.prefetch_range(100, 5000) == 1
    assert store.prefetch_range(np.int64(7), 7) == 0
    for bad in ((-1, 5), (5, 4), (0, store.num_tokens + 1)):
        with pytest.raises(IndexError, match="outside"):
            store.prefetch_range(*bad)
    with pytest.raises(TypeError, match="start"):
        store.prefetch_range(1.5, 3)


def test_prefetch_of_nothing_issues_nothing(store):
    assert store.prefetch(np.empty(0, np.int64), np.empty(0, np.int64)) == 0
    assert store.prefetch(np.array([5]), np.array([0])) == 0


def _naive_pages(starts, lengths, itemsize, nbytes):
    pages = set()
    for s, n in zip(starts, lengths):
        if n > 0:
            first = s * itemsize // PAGE
            last = ((s + n) * itemsize - 1) // PAGE
            pages.update(range(first, last + 1))
    return pages


@given(
    st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 9000)), max_size=40),
    st.sampled_from([1, 2, 4, 8]),
)
def test_page_ranges_cover_exactly_the_pages_of_the_ranges(pairs, itemsize):
    n_items = 60_000
    pairs = [(s, min(n, n_items - s)) for s, n in pairs]
    starts = np.array([p[0] for p in pairs], dtype=np.int64)
    lengths = np.array([p[1] for p in pairs], dtype=np.int64)
    nbytes = n_items * itemsize
    lo, hi = page_ranges(starts, lengths, itemsize, nbytes)
    assert lo.dtype == hi.dtype == np.int64
    assert np.all(lo % PAGE == 0) and np.all((hi % PAGE == 0) | (hi == nbytes))
    assert np.all(lo < hi) and np.all(hi[:-1] < lo[1:])  # disjoint, sorted, touching ones merged
    got = set()
    for a, b in zip(lo.tolist(), hi.tolist()):
        got.update(range(a // PAGE, -(-b // PAGE)))
    assert got == _naive_pages(starts.tolist(), lengths.tolist(), itemsize, nbytes)


def test_scan_requests_pages_ahead_and_yields_the_same_documents(store_path):
    store = mmpack.open(store_path)
    spy = Spy(store)
    calls = []
    real = store._backend.prefetch
    store._backend.prefetch = lambda s, n: calls.append((int(s[0]), int(n[0]))) or real(s, n)
    evict(store)
    docs = [d.copy() for d in store]
    fresh = mmpack.open(store_path)
    assert len(docs) == len(fresh)
    assert all(np.array_equal(a, fresh[j]) for j, a in enumerate(docs))
    # contiguous requests covering every token, each at most 2 MiB of uint16 tokens
    assert calls[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(calls))
    assert calls[-1][0] + calls[-1][1] == store.num_tokens
    assert max(n for _, n in calls) * 2 <= 1 << 21
    assert not spy.calls  # the scan goes to the backend directly


# ------------------------------------------------------------------------------------ views
def window_views(store):
    return [
        WindowDataset(store, 700, eot=EOT, labels=True),
        WindowDataset(store, 512, stride=300),
        WindowDataset(store, 1024, eot=EOT, drop_last=False),
    ]


def packed_views(store):
    return [
        PackedDataset(store, 2048, eot=EOT, pad_id=EOT + 1, cache=False),
        PackedDataset(
            store, 1000, pad_id=7, cache=False, mode="mlm", mask_id=EOT + 2, vocab_size=EOT + 3
        ),
    ]


def _same(a, b) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


@pytest.mark.parametrize("kind", ["window", "packed"])
def test_cold_batches_prefetch_and_equal_warm_batches(store_path, kind):
    store = mmpack.open(store_path)
    views = window_views(store) if kind == "window" else packed_views(store)
    rng = np.random.default_rng(5)
    for ds in views:
        idx = rng.integers(0, len(ds), size=40)
        warm = [dict(s) for s in ds.__getitems__(idx)]
        issued: list[int] = []
        real = store._backend.prefetch

        def counting(s, n, issued=issued, real=real):
            issued.append(real(s, n))
            return issued[-1]

        store._backend.prefetch = counting
        try:
            evict(store)
            cold = ds.__getitems__(idx)
        finally:
            del store._backend.prefetch
        assert issued and sum(issued) > 0, "a cold batch must request its pages"
        for w, c in zip(warm, cold):
            _same(w, c)
        assert all(len(c) for c in cold)


@pytest.mark.parametrize("kind", ["window", "packed"])
def test_warm_batches_skip_the_prefetch(store_path, kind):
    store = mmpack.open(store_path)
    ds = (window_views if kind == "window" else packed_views)(store)[0]
    idx = np.arange(min(len(ds), 30))
    ds.__getitems__(idx)  # now resident
    issued = []
    real = store._backend.prefetch
    store._backend.prefetch = lambda s, n: issued.append(real(s, n)) or issued[-1]
    ds.__getitems__(idx)
    assert issued == []


@pytest.mark.parametrize("kind", ["window", "packed"])
def test_single_cold_reads_prefetch_and_equal_warm_reads(store_path, kind):
    store = mmpack.open(store_path)
    ds = (window_views if kind == "window" else packed_views)(store)[0]
    idx = np.random.default_rng(2).integers(0, len(ds), size=30).tolist()
    warm = [{k: np.array(v) for k, v in ds[i].items()} for i in idx]
    spy = Spy(store)
    ds._cold.__init__()
    evict(store)
    cold = [ds[i] for i in idx]
    assert ds._cold.cold and spy.issued >= len(idx)  # the first read found the data cold
    for w, c in zip(warm, cold):
        _same(w, c)
    # each read asked for exactly its own ranges
    for i, (starts, lengths) in zip(idx, spy.calls):
        want = (
            ds._ranges(np.array([i * ds.stride])) if kind == "window" else ds._ranges(np.array([i]))
        )
        assert starts.tolist() == want[0].tolist() and lengths.tolist() == want[1].tolist()


def test_single_warm_reads_probe_rarely_and_never_prefetch(store_path):
    store = mmpack.open(store_path)
    int(np.asarray(store.tokens).sum())  # every page resident (other tests evict them)
    ds = WindowDataset(store, 300, eot=EOT)
    spy = Spy(store)
    probes = []
    real = store.resident
    store.resident = lambda p: probes.append(1) or real(p)
    for i in range(2 * PROBE_EVERY):
        ds[i % 50]
    assert len(probes) == 2 and not spy.calls  # reads 1 and PROBE_EVERY + 1
    assert not ds._cold.cold


def test_flat_start_matches_the_window_arithmetic(store):
    offsets = store.offsets
    ds = WindowDataset(store, 64, eot=EOT)
    rng = np.random.default_rng(1)
    vs = np.concatenate(
        [
            rng.integers(0, ds.total, 200),
            offsets[1:50] + np.arange(1, 50),
            offsets[1:50] + np.arange(0, 49),
        ]
    )
    starts, _ = ds._ranges(vs.astype(np.int64))
    for v, s in zip(vs.tolist(), starts.tolist()):
        assert flat_start(offsets, 1, v) == s
        assert flat_start(offsets, 0, v) == v


# ------------------------------------------------------------------------------------ ColdReads
class FakeStore:
    def __init__(self) -> None:
        self.is_resident = True
        self.probes = 0
        self.prefetched = 0

    def resident(self, positions) -> bool:
        self.probes += 1
        return self.is_resident

    def prefetch(self, starts, lengths) -> int:
        self.prefetched += 1
        return 1


def _read(cr: ColdReads, store: FakeStore, ranges_calls: list) -> None:
    """What a view does on each single read."""
    if cr.step():
        cr.before_read(store, 0, lambda: ranges_calls.append(1) or store.prefetch(None, None))


def _read_through_next_probe(cr: ColdReads, store: FakeStore, ranges: list) -> int:
    """Read until (and including) the next read that probes; return the reads made."""
    probes, n = store.probes, 0
    while store.probes == probes:
        _read(cr, store, ranges)
        n += 1
    return n


def test_cold_reads_state_machine():
    cr, store, ranges = ColdReads(), FakeStore(), []
    assert _read_through_next_probe(cr, store, ranges) == 1  # the first read probes
    for _ in range(3):  # warm: one probe every PROBE_EVERY reads, nothing else
        assert _read_through_next_probe(cr, store, ranges) == PROBE_EVERY
    assert store.probes == 4 and store.prefetched == 0 and ranges == [] and not cr.cold
    store.is_resident = False
    _read_through_next_probe(cr, store, ranges)  # that probe finds it cold: it prefetches
    assert cr.cold and store.prefetched == 1 and len(ranges) == 1
    for _ in range(10):  # every read prefetches while cold
        _read(cr, store, ranges)
    assert store.prefetched == 11 and len(ranges) == 11
    store.is_resident = True
    for _ in range(3):  # three resident probes in a row: still cold
        _read_through_next_probe(cr, store, ranges)
    assert cr.cold
    _read_through_next_probe(cr, store, ranges)  # the fourth ends cold mode, without a prefetch
    assert not cr.cold
    before = (store.prefetched, len(ranges))
    for _ in range(PROBE_EVERY - 1):
        _read(cr, store, ranges)
    assert (store.prefetched, len(ranges)) == before


def test_a_cold_probe_resets_the_resident_streak():
    cr, store, ranges = ColdReads(), FakeStore(), []
    store.is_resident = False
    _read(cr, store, ranges)  # the first read probes
    assert cr.cold
    for answer in (True, True, True, False, True, True, True):
        store.is_resident = answer
        _read_through_next_probe(cr, store, ranges)
    assert cr.cold
    store.is_resident = True
    _read_through_next_probe(cr, store, ranges)
    assert not cr.cold


def test_a_refused_hint_never_breaks_reading(store_path):
    store = mmpack.open(store_path)

    class Refusing:
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

    backend = store._backend
    backend._mm = Refusing()
    assert store.advise("sequential") == "random"
    assert backend._pattern == "random"  # the refused advice is not recorded
    assert store.prefetch(np.array([0, 5000]), np.array([10, 10])) == 0
    assert store.prefetch_range(0, 10) == 0
    ds = WindowDataset(store, 128, eot=EOT)
    ds._cold.cold = True  # every read asks for its pages: refused, then read anyway
    fresh = WindowDataset(mmpack.open(store_path), 128, eot=EOT)
    for i in (0, 5, len(ds) - 1):
        _same(ds[i], fresh[i])
    assert store.verify()["blocks"] > 0


def test_a_store_without_a_mapping_accepts_the_same_calls(tmp_path):
    """Zarr stores: advice is recorded, prefetch does nothing, views read as before."""
    docs = make_docs(40, seed=9, max_len=500)
    store = build(tmp_path / "z", docs, dtype=np.uint16, backend="zarr")
    assert store.tokens is None
    assert store.advise("sequential") == "normal" and store.advise("random") == "sequential"
    assert not store.resident([0, 10])
    assert store.prefetch(np.array([0]), np.array([10])) == 0
    assert store.prefetch_range(0, 10) == 0
    ds = WindowDataset(store, 64, eot=EOT)
    ref = WindowDataset(build(tmp_path / "m", docs, dtype=np.uint16), 64, eot=EOT)
    for i in range(len(ds)):
        _same(ds[i], ref[i])
    assert store.verify()["blocks"] > 0
