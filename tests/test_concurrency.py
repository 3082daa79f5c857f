"""Concurrent readers: processes (spawn and fork) and threads reading one store and one
WindowDataset at once get exactly the expected data, and a rebuild with ``overwrite=True`` while
processes read the same path never shows any of them a half store.

Expected data is recomputed independently in every reader from the corpus seed (``_corpus``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mmpack
from mmpack import WindowDataset
from mmpack.errors import StateMismatchError

BACKENDS = ["memmap", "zarr"]


def _corpus(version: int, n: int = 300) -> list[np.ndarray]:
    """Corpus ``version``: document 0 is ``[version]``, so a reader can tell versions apart."""
    rng = np.random.default_rng(version)
    high = 60000 if version % 2 else 250  # versions differ in dtype too
    docs = [rng.integers(0, high, int(rng.integers(0, 80))) for _ in range(n + version * 7)]
    return [np.array([version]), *docs]


def _check_reader(args) -> int:
    """Read random documents, ranges and windows of ``store``; compare with the recomputed corpus."""
    store, version, seed, rounds = args
    docs = _corpus(version)
    flat = np.concatenate(docs)
    ds = WindowDataset(store, 17, 5, eot=99999, labels=True)
    stream = np.concatenate([np.append(d, 99999) for d in docs])
    rng = np.random.default_rng(seed)
    checks = 0
    for _ in range(rounds):
        j = int(rng.integers(len(docs)))
        assert np.array_equal(store[j], docs[j]), f"document {j} differs"
        a = int(rng.integers(flat.size))
        b = int(rng.integers(a, flat.size + 1))
        assert np.array_equal(store.read_range(a, b), flat[a:b])
        idx = rng.integers(0, len(ds), 8)
        for i, sample in zip(idx, ds.__getitems__(idx)):
            v = int(i) * 5
            assert np.array_equal(sample["input_ids"], stream[v : v + 17])
            assert np.array_equal(sample["labels"], stream[v + 1 : v + 18])
        checks += 3
    return checks


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    return mmpack.build(tmp_path / "s", _corpus(1), backend=request.param, fsync=False)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_processes_read_the_same_store(tmp_path, method):
    stores = [mmpack.build(tmp_path / b, _corpus(1), backend=b, fsync=False) for b in BACKENDS]
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(4) as pool:
        counts = pool.map(_check_reader, [(s, 1, seed, 30) for seed in range(4) for s in stores])
    assert counts == [90] * 8


def test_threads_read_the_same_store(store):
    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(_check_reader, [(store, 1, seed, 60) for seed in range(16)]))
    assert counts == [180] * 16


def test_threads_share_one_window_dataset(store):
    ds = WindowDataset(store, 33, 7)
    flat = np.concatenate(_corpus(1))
    expected = [flat[i * 7 : i * 7 + 33] for i in range(len(ds))]

    def read(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            idx = rng.integers(0, len(ds), 16)
            for i, sample in zip(idx, ds.__getitems__(idx)):
                assert np.array_equal(sample["input_ids"], expected[i])
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, range(8)))


def _swap_reader(path, started, stop, results) -> None:
    """Until ``stop`` is set (and at least once): open the path, check the version found is
    complete; keep re-reading the store opened first (memmap: its old data; zarr: old data or a
    clear refusal).  Reports its counts on ``results``."""
    while True:
        try:
            first = mmpack.open(path)
            first_version = int(first[0][0])
            break
        except StateMismatchError:  # zarr: swapped between the open and the read
            continue
    # Warm up (compiles the window kernels when numba's cache is cold, as in a fresh clone)
    # before the swaps start, so that they overlap real reads.
    try:
        _check_reader((first, first_version, 0, 1))
    except StateMismatchError:
        pass
    started.release()
    seen = {"opens": 0, "versions": 0, "old_reads": 0, "old_refused": 0}
    versions = set()
    seed = os.getpid()
    while True:
        store = mmpack.open(path)  # must always find a complete store
        try:
            v = int(store[0][0])
            versions.add(v)
            _check_reader((store, v, seed, 2))
        except StateMismatchError:
            # zarr only: swapped after this open; reopening finds the new store
            assert store.backend == "zarr", "a memmap reader lost its data"
        seen["opens"] += 1
        try:
            _check_reader((first, first_version, seed, 1))
            seen["old_reads"] += 1
        except StateMismatchError:
            assert first.backend == "zarr", "a memmap reader lost its old data"
            seen["old_refused"] += 1
        if stop.is_set():
            break
    seen["versions"] = len(versions)
    results.put(seen)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_while_processes_read(tmp_path, backend):
    """Readers start and warm up first (a loaded machine or a cold numba cache may make them
    late), then the store is rebuilt with overwrite=True at least 5 times over at least a
    second, then the readers stop."""
    path = tmp_path / "s"
    mmpack.build(path, _corpus(0), backend=backend, fsync=False)
    ctx = multiprocessing.get_context("fork")
    started, stop, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    readers = [
        ctx.Process(target=_swap_reader, args=(path, started, stop, results)) for _ in range(3)
    ]
    for r in readers:
        r.start()
    for _ in readers:
        assert started.acquire(timeout=60)
    version = 0
    t_end = time.monotonic() + 1.0
    while version < 5 or time.monotonic() < t_end:
        version += 1
        mmpack.build(path, _corpus(version), backend=backend, overwrite=True, fsync=False)
        time.sleep(0.05)
    stop.set()
    seen = [results.get(timeout=60) for _ in readers]
    for r in readers:
        r.join(timeout=60)
        assert r.exitcode == 0
    assert version >= 2
    for s in seen:
        assert s["opens"] > 0
        if backend == "memmap":
            assert s["old_refused"] == 0 and s["old_reads"] > 0
    assert max(s["versions"] for s in seen) >= 2, seen  # readers did see swaps
    final = mmpack.open(path)
    assert int(final[0][0]) == version
    final.verify()
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
