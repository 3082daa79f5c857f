"""Faults of the node cache (``mmpack/_src/remote/cache.py``, ``cachefile.py``, ``cached.py``)
against a real S3 server (SeaweedFS, ``tests/_s3.py``): a corrupt cached page (checked the
first time a reader serves it, dropped and fetched again), a stopped process holding the cache's
lock or a page's claim (waited for a bounded time, then read around), a truncated cache file
(discarded and fetched again), a disk that cannot be written (served from memory), and children
forked while a thread takes the lock (they never keep it).

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/remote/test_cachefile.py``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from _remote_stores import _build_with_page, _corpus, _url, full_disk, hold_cache_lock
from _s3 import isolate_cache_and_env

import mmpack
from mmpack._src.remote import cache as cache_mod
from mmpack._src.remote.cachefile import HEADER

GiB = 1 << 30
PAGE = 4096


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def _open(store, options, cache_dir, limit=GiB):
    return mmpack.open(
        store.location, storage_options=options, cache_dir=cache_dir, cache_limit=limit
    )


def _stem(cache_dir: Path, store) -> Path:
    return cache_dir / "pages" / f"{store.fingerprint}-tokens-p{PAGE}"


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def filled(s3_server, tmp_path):
    """A remote store of 4 KiB check pages, its local twin, and a node cache holding pages
    0..5 (filled by a reader that is gone)."""
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, PAGE)
    local = mmpack.build(tmp_path / "local", docs)
    first = _open(store, s3_server.options, tmp_path)
    np.testing.assert_array_equal(first.read_range(0, 6 * 2048), local.read_range(0, 6 * 2048))
    del first
    gc.collect()
    return store, local


# ----------------------------------------------------------------------------- corrupt pages
def _node_cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "node cache" in str(w.message)]


@pytest.mark.parametrize("how", ["read_range", "read_ranges", "dataset"])
def test_a_corrupt_cached_page_is_caught_by_a_new_reader_and_fetched_again(
    s3_server, tmp_path, filled, how
):
    """A flipped byte in ``pages/*.data`` is never served: a reader checks each cached page
    the first time it serves it (the hit path, the gather path and ``ds[i]`` alike), drops a
    bad one with one warning and fetches it again, which repairs the cache for everyone."""
    store, local = filled
    data = _stem(tmp_path, store).with_suffix(".data")
    _flip(data, 20)  # token 10, page 0
    _flip(data, 2 * PAGE + 6)  # token 4099, page 2
    fresh = _open(store, dict(s3_server.options, merge_gap_bytes=0), tmp_path)
    with pytest.warns(UserWarning, match=r"node cache.*fail.*checksum.*fetched again") as rec:
        if how == "read_range":
            np.testing.assert_array_equal(fresh.read_range(0, 6000), local.read_range(0, 6000))
        elif how == "read_ranges":
            starts, lengths = np.array([5, 4090], np.int64), np.array([100, 100], np.int64)
            src, at = fresh.read_ranges(starts, lengths)
            for k in range(2):
                a, n = int(starts[k]), int(lengths[k])
                np.testing.assert_array_equal(src[at[k] : at[k] + n], local.read_range(a, a + n))
        else:
            ds, want = mmpack.WindowDataset(fresh, 128), mmpack.WindowDataset(local, 128)
            for i in (0, 32):  # windows in pages 0 and 2
                np.testing.assert_array_equal(ds[i]["input_ids"], want[i]["input_ids"])
    named = " ".join(_node_cache_warnings(rec))
    assert ("[0, 2]" in named) if how != "dataset" else ("[0]" in named and "[2]" in named)
    assert fresh._backend.stats["bytes_fetched"] == 2 * PAGE  # the two bad pages, again
    again = _open(store, s3_server.options, tmp_path)  # the cache is repaired for everyone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(again.read_range(0, 6000), local.read_range(0, 6000))
    assert again._backend.stats["bytes_fetched"] == 0


def test_pages_are_checked_once_per_reader(s3_server, tmp_path, filled, monkeypatch):
    """A reader checks a cached page once: later batches over the same pages are copied out
    of the mapped file, unchecked (the hit path)."""
    from mmpack._src.remote import cachefile

    store, local = filled
    checked: list[int] = []
    real = cachefile.check_ranges

    def counting(data, words, state, digests, done, *args):
        before = done.copy()
        n = real(data, words, state, digests, done, *args)
        checked.extend(np.flatnonzero(done != before).tolist())
        return n

    monkeypatch.setattr(cachefile, "check_ranges", counting)
    fresh = _open(store, s3_server.options, tmp_path)
    starts, lengths = np.array([0, 3000, 9000], np.int64), np.array([50, 50, 50], np.int64)
    for _ in range(3):
        src, at = fresh.read_ranges(starts, lengths)
        assert fresh._backend.stats["bytes_fetched"] == 0  # from the mapping
        for k in range(3):
            a = int(starts[k])
            np.testing.assert_array_equal(src[at[k] : at[k] + 50], local.read_range(a, a + 50))
    assert checked == [0, 1, 4]  # each once


def _in_thread(fn, timeout: float):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still waiting after {timeout} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_stopped_process_holding_the_cache_lock_is_read_around(
    s3_server, tmp_path, filled, monkeypatch
):
    """A process stopped while it holds ``pages/.lock`` delays a reader at most the lock's
    bound, once: reads then go around the cache (fetched, served from memory), with one
    warning; once the lock is free the cache is used again."""
    monkeypatch.setattr(cache_mod, "LOCK_WAIT_SECONDS", 0.5)
    store, local = filled
    mapped = _open(store, s3_server.options, tmp_path)  # maps the cache before the stop
    np.testing.assert_array_equal(mapped.read_range(0, 100), local.read_range(0, 100))
    with hold_cache_lock(tmp_path):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            far = 40 * 2048  # page 40: not cached, so storing it needs the lock

            def reads():
                got = [mapped.read_range(far, far + 500)]  # charging a new page
                fresh = _open(store, s3_server.options, tmp_path)  # mapping the file
                got.append(fresh.read_range(far + 4000, far + 4500))
                got.append(fresh.read_range(0, 500))
                return got

            got = _in_thread(reads, 60)
        want = [local.read_range(far, far + 500), local.read_range(far + 4000, far + 4500)]
        for g, w in zip(got, want + [local.read_range(0, 500)]):
            np.testing.assert_array_equal(g, w)
        msgs = _node_cache_warnings(rec)
        assert len(msgs) == 1 and "lock" in msgs[0] and "memory" in msgs[0], msgs
        cf = mapped._backend.node_cache.mapped
        assert not cf.state[40]  # not stored: the lock was not had
    np.testing.assert_array_equal(mapped.read_range(far, far + 500), want[0])
    np.testing.assert_array_equal(
        mapped.read_range(far + 8192, far + 8692), local.read_range(far + 8192, far + 8692)
    )
    assert mapped._backend.node_cache.mapped.state[44]  # stored again: the lock is free


_CLAIM = """
import fcntl, os, signal, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
b = int(sys.argv[2])
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, int(sys.argv[3]) + b, 1, 0))
print("claimed", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_stopped_process_holding_a_page_claim_delays_a_reader_a_bounded_time(
    s3_server, tmp_path, filled
):
    """A page claimed by a process that then stopped is waited for at most ``read_timeout``,
    then fetched here and served from memory (never stored under another's claim)."""
    store, local = filled
    opts = dict(s3_server.options, read_timeout=1.0)
    reader = _open(store, opts, tmp_path)
    np.testing.assert_array_equal(reader.read_range(0, 100), local.read_range(0, 100))
    state = _stem(tmp_path, store).with_suffix(".state")
    holder = subprocess.Popen(
        [sys.executable, "-c", _CLAIM, str(state), "50", str(HEADER)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        a = 50 * 2048
        got = _in_thread(lambda: reader.read_range(a, a + 1000), 30)
        np.testing.assert_array_equal(got, local.read_range(a, a + 1000))
        assert not reader._backend.node_cache.mapped.state[50]
        got = _in_thread(lambda: reader.read_range(a + 10, a + 20), 0.9)  # from memory now
        np.testing.assert_array_equal(got, local.read_range(a + 10, a + 20))
    finally:
        holder.kill()
        holder.wait(30)


# ----------------------------------------------------------------------------- truncated files
@pytest.mark.parametrize(
    "suffix, keep",
    [(".state", 10), (".state", HEADER + 3), (".state", -1), (".data", 0), (".data", PAGE + 7)],
)
def test_a_truncated_cache_file_is_discarded_and_fetched_again(
    s3_server, tmp_path, filled, suffix, keep
):
    """A ``.state`` or ``.data`` file shorter than its object needs (``keep`` bytes left; -1:
    one byte short) is discarded when a reader maps the cache, in every process, and the
    pages fetched again; no ``ValueError: mmap length is greater than file size``."""
    store, local = filled
    path = _stem(tmp_path, store).with_suffix(suffix)
    size = path.stat().st_size
    os.truncate(path, size - 1 if keep < 0 else keep)
    for _ in range(2):  # the first reader repairs the cache, the second one uses it
        fresh = _open(store, s3_server.options, tmp_path)
        np.testing.assert_array_equal(fresh.read_range(0, 6000), local.read_range(0, 6000))
        cf = fresh._backend.node_cache.mapped
        assert cf is not None and cf.present(np.arange(3)).all()
    assert path.stat().st_size == size
    assert fresh._backend.stats["bytes_fetched"] == 0


@pytest.mark.parametrize("limit", [None, GiB])
def test_a_full_disk_under_cache_dir_serves_from_memory(s3_server, tmp_path, monkeypatch, limit):
    """Nothing under ``cache_dir`` can be written (a full disk): ``mmpack.open`` keeps the
    index in memory and reads are fetched and served from memory, with one warning, whether
    the node cache is on or off."""
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, PAGE)
    local = mmpack.build(tmp_path / "local", docs)
    cache_dir = tmp_path / "full"
    full_disk(monkeypatch, cache_dir)  # the folder itself cannot be created either
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = mmpack.open(
            store.location, storage_options=s3_server.options, cache_dir=cache_dir,
            cache_limit=limit,
        )  # fmt: skip
        for a in (0, 5000, 20_000, 0):
            np.testing.assert_array_equal(s.read_range(a, a + 3000), local.read_range(a, a + 3000))
        ds, want = mmpack.WindowDataset(s, 128), mmpack.WindowDataset(local, 128)
        np.testing.assert_array_equal(ds[3]["input_ids"], want[3]["input_ids"])
        got = ds.__getitems__(np.arange(20))
        np.testing.assert_array_equal(
            got.columns["input_ids"], want.__getitems__(np.arange(20)).columns["input_ids"]
        )
    msgs = _node_cache_warnings(rec)
    assert len(msgs) == 1, msgs
    assert "No space left on device" in msgs[0] and "memory" in msgs[0]
    assert not cache_dir.exists()


_FSIZE = """
import json, resource, signal, sys
import numpy as np
import mmpack
url, opts, warm, cache, want_path = sys.argv[1:6]
opts = json.loads(opts)
w = mmpack.open(url, storage_options=opts, cache_dir=warm, cache_limit=1 << 30)
w.read_range(0, 3000); w.read_ranges(np.array([0]), np.array([10]))  # kernels compiled, cached
want = np.load(want_path)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # the kernel refuses every byte written
import warnings
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    s = mmpack.open(url, storage_options=opts, cache_dir=cache, cache_limit=1 << 30)
    ok = bool((s.read_range(0, 3000) == want).all() and (s.read_range(0, 3000) == want).all())
print(json.dumps({"ok": ok, "warnings": [str(x.message) for x in rec]}))
"""


def test_a_cache_dir_the_kernel_refuses_to_write_serves_from_memory(s3_server, tmp_path):
    """The same with a real refusal: a process whose file-size limit is 0 (``RLIMIT_FSIZE``:
    every write into a regular file fails with EFBIG) opens and reads, with one warning."""
    docs = _corpus(n_docs=400)
    store = _build_with_page(_url(), docs, s3_server.options, PAGE)
    want = tmp_path / "want.npy"
    np.save(want, mmpack.build(tmp_path / "local", docs).read_range(0, 3000))
    args = [store.location, json.dumps(s3_server.options), str(tmp_path / "warm")]
    args += [str(tmp_path / "refused"), str(want)]
    out = subprocess.run(
        [sys.executable, "-c", _FSIZE, *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ok"]
    msgs = [m for m in got["warnings"] if "node cache" in m]
    assert len(msgs) == 1 and "File too large" in msgs[0], got["warnings"]


def test_a_child_forked_while_a_thread_takes_the_lock_does_not_keep_it(tmp_path):
    """A fork landing between a thread's ``open`` of the lock file and its registration used
    to leave the child a copy of the descriptor: the lock (held on that open file) outlived the
    parent's release for as long as the child ran.  Children forked while a thread takes and
    releases the lock in a loop must never make it wait for them."""
    cache = cache_mod.PageCache(tmp_path, GiB)
    cache.root.mkdir(parents=True)
    stop = threading.Event()
    waits: list[float] = []

    def take() -> None:
        import time

        while not stop.is_set():
            t0 = time.monotonic()
            try:
                with cache._locked():
                    pass
            except cache_mod.CacheLockTimeout:
                waits.append(float("inf"))
                return
            waits.append(time.monotonic() - t0)

    thread = threading.Thread(target=take)
    thread.start()
    children = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with a thread running
            for _ in range(60):
                pid = os.fork()
                if pid == 0:  # the child lives a while, holding whatever it inherited
                    import time

                    time.sleep(3.0)
                    os._exit(0)
                children.append(pid)
                threading.Event().wait(0.005)
    finally:
        stop.set()
        thread.join(30)
        for pid in children:
            os.waitpid(pid, 0)
    assert waits and max(waits) < 1.5, f"the lock waited {max(waits):.2f} s for a child"


def test_threads_queue_on_the_lock_and_a_holder_past_the_bound_is_read_around(
    tmp_path, monkeypatch
):
    """Threads of one process take the cache's lock in turn (each entry alone inside); a
    thread kept waiting past :data:`LOCK_WAIT_SECONDS` by another thread of the process gets
    :class:`CacheLockTimeout` (the cache is then read around), and once the lock is free the
    next entry takes it and the lock is no longer stuck."""
    import time

    monkeypatch.setattr(cache_mod, "LOCK_WAIT_SECONDS", 0.3)
    cache = cache_mod.PageCache(tmp_path, GiB)
    cache.root.mkdir(parents=True)
    path = str(cache.root / ".lock")
    inside, overlaps = [0], []

    def enter() -> None:
        for _ in range(50):
            with cache._locked():
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.0002)
                inside[0] -= 1

    threads = [threading.Thread(target=enter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(overlaps) == 400 and max(overlaps) == 1

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._locked():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        t0 = time.monotonic()
        with pytest.raises(cache_mod.CacheLockTimeout, match="in this process"):
            with cache._locked():
                pass
        assert 0.25 <= time.monotonic() - t0 < 5
        assert path in cache_mod._STUCK
    finally:
        release.set()
        holder.join(10)
    with cache._locked():  # free again: taken at once, no longer stuck
        assert path not in cache_mod._STUCK
