"""Documents written straight to the token file (``StripeWriter``: ``pwritev`` on a writer thread,
blocks hashed from the file on a hash thread) against the naive concatenation and its digests:
any pieces, strided arrays, truncation, short writes, files that cannot be mapped, and the
caller's buffers changed once the writer returns.

Run: ``pytest tests/store/test_stripe_writer.py``.
"""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
import mmpack._src.store.stripe_writer as BW
from mmpack._src.store.integrity import stripe_digest
from mmpack._src.store.stripe_writer import StripeWriter
from mmpack._src.store.tokenfile import TokenFile
from mmpack.store import StoreWriter


def _naive(raw: bytes, block: int) -> list[int]:
    return [stripe_digest(raw[a : a + block]) for a in range(0, len(raw), block)]


def _write_arrays_and_check(path, docs, block: int) -> None:
    """``TokenFile.append_arrays`` of ``docs`` gives the file and block digests of their naive
    concatenation."""
    tf = TokenFile(path, open, np.dtype("<u2"), block)
    assert tf.append_arrays(docs, np.array([d.size for d in docs], dtype=np.int64))
    digests = tf.finish()
    tf.close()
    expected = np.concatenate(docs).tobytes() if docs else b""
    assert path.read_bytes() == expected
    assert digests == _naive(expected, block)


def _piece(values: list[int], strided: bool) -> np.ndarray:
    if strided:  # every other element of a larger array: not contiguous
        return np.repeat(np.array(values, dtype=np.uint16), 2)[::2]
    return np.array(values, dtype=np.uint16)


def _written(path, bw: StripeWriter) -> tuple[bytes, list[int]]:
    digests = bw.digests()
    bw.close()
    with open(path, "rb") as f:
        return f.read(), digests


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 65535), max_size=50), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([8, 24, 64, 4096]),
    st.data(),
)
def test_pieces_and_truncation_match_the_naive_file(tmp_path_factory, calls, block, data):
    """Lists of pieces (some strided, some empty), with a cut back to any earlier length between
    calls: the file holds the naive bytes and every block's digest is the naive one."""
    path = tmp_path_factory.mktemp("bw") / "t.bin"
    expected = b""
    with open(path, "wb") as f:
        bw = StripeWriter(f.fileno(), path, block)
        try:  # an example aborted by a draw must not leave its writer running
            for values, strided in calls:
                n = data.draw(st.integers(1, 3))
                pieces = [_piece(values[j::n], strided) for j in range(n)]
                ends = np.cumsum([p.nbytes for p in pieces]).astype(np.int64)
                if ends[-1]:
                    bw.submit(pieces, ends)
                    expected += b"".join(p.tobytes() for p in _copy_pieces(values, n, strided))
                if data.draw(st.booleans()):
                    cut = data.draw(st.integers(0, len(expected)))
                    bw.truncate(cut)
                    expected = expected[:cut]
            raw, digests = _written(path, bw)
        finally:
            bw.close()
    assert raw == expected
    assert digests == _naive(expected, block)


def _copy_pieces(values: list[int], n: int, strided: bool) -> list[np.ndarray]:
    return [np.ascontiguousarray(_piece(values[j::n], strided)) for j in range(n)]


def test_more_pieces_than_one_pwritev_takes(tmp_path):
    docs = [np.full(j % 7, j, dtype=np.uint16) for j in range(3000)]
    _write_arrays_and_check(tmp_path / "t.bin", docs, 256)


def test_a_large_buffer_is_written_in_slices(tmp_path, monkeypatch):
    monkeypatch.setattr(BW, "_PIECE", 96)
    data = (np.arange(1000, dtype=np.uint16) * 7).tobytes()
    path = tmp_path / "t.bin"
    with open(path, "wb") as f:
        bw = StripeWriter(f.fileno(), path, 64)
        bw.submit([np.frombuffer(data, dtype=np.uint8)], np.array([len(data)], dtype=np.int64))
        raw, digests = _written(path, bw)
    assert raw == data
    assert digests == _naive(data, 64)


def test_short_writes_are_completed(tmp_path, monkeypatch):
    """``pwritev`` may write less than asked (a signal, a nearly full disk): the rest follows."""
    real = os.pwritev
    calls = []

    def short(fd, buffers, offset):
        calls.append(len(buffers))
        first = memoryview(np.ascontiguousarray(buffers[0])).cast("B")
        return real(fd, [first[: max(1, len(first) // 2)]], offset)

    monkeypatch.setattr(BW.os, "pwritev", short)
    docs = [np.arange(j, j + 30, dtype=np.uint16) for j in range(20)]
    tf = TokenFile(tmp_path / "t.bin", open, np.dtype("<u2"), 64)
    assert tf.append_arrays(docs, np.full(20, 30, dtype=np.int64))
    digests = tf.finish()
    tf.close()
    assert calls
    expected = np.concatenate(docs).tobytes()
    assert (tmp_path / "t.bin").read_bytes() == expected
    assert digests == _naive(expected, 64)


def test_a_file_that_cannot_be_mapped_is_hashed_by_reading(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    docs = [np.arange(j, j + 50, dtype=np.uint16) for j in range(10)]
    tf = TokenFile(tmp_path / "t.bin", open, np.dtype("<u2"), 128)
    assert tf.append_arrays(docs, np.full(10, 50, dtype=np.int64))
    digests = tf.finish()
    tf.close()
    assert digests == _naive(np.concatenate(docs).tobytes(), 128)


def test_a_refused_append_after_direct_writes_cuts_the_file(tmp_path):
    """Blocks written straight from the documents, then an append converted over several blocks
    and refused at its last token: the file is cut back, and what follows is hashed right."""
    tf = TokenFile(tmp_path / "t.bin", open, np.dtype("<u2"), 64)
    docs = [np.arange(j, j + 40, dtype=np.uint16) for j in range(5)]
    assert tf.append_arrays(docs, np.full(5, 40, dtype=np.int64))
    bad = np.arange(100, dtype=np.int64)
    bad[-1] = -1
    assert tf.append(bad) == 99
    assert tf.num_tokens == 200
    assert tf.append(np.arange(7, dtype=np.uint16)) == -1
    digests = tf.finish()
    tf.close()
    expected = np.concatenate([*docs, np.arange(7, dtype=np.uint16)]).tobytes()
    assert (tmp_path / "t.bin").read_bytes() == expected
    assert digests == _naive(expected, 64)


def test_widening_after_direct_writes(tmp_path):
    tf = TokenFile(tmp_path / "t.bin", open, None, 64)
    docs = [np.arange(j, j + 100, dtype=np.uint8) for j in range(3)]
    assert tf.append_arrays(docs, np.full(3, 100, dtype=np.int64))
    assert tf.append(np.array([300, 5], dtype=np.int64)) == -1
    digests = tf.finish()
    tf.close()
    assert tf.dtype == np.uint16
    expected = np.concatenate([*docs, np.array([300, 5])]).astype("<u2").tobytes()
    assert (tmp_path / "t.bin").read_bytes() == expected
    assert digests == _naive(expected, 64)
    assert not (tmp_path / "t.bin.widen").exists()


@pytest.mark.parametrize("how", ["add_many", "add_batch"])
def test_the_callers_arrays_may_change_once_the_writer_returns(tmp_path, how):
    """Documents written straight from the caller's arrays are on disk before ``add_many`` or
    ``add_batch`` returns: changing the arrays then changes nothing stored."""
    docs = [np.full(5000, j, dtype=np.uint16) for j in range(200)]  # 2 MB: written directly
    expected = [d.tolist() for d in docs]
    with StoreWriter(tmp_path / "s", dtype=np.uint16, fsync=False) as w:
        if how == "add_many":
            w.add_many(docs)
            for d in docs:
                d[:] = 9
        else:
            flat = np.concatenate(docs)
            w.add_batch(flat, np.full(200, 5000))
            flat[:] = 9
    assert w.store is not None
    assert [d.tolist() for d in w.store] == expected
    w.store.verify()


def test_builds_through_every_path_verify(tmp_path):
    """A list of arrays (direct), a generator (its chunk buffers written directly), strided and
    small documents: the stores hold the documents and pass ``verify()``."""
    base = np.arange(400_000, dtype=np.uint16) % 5000
    docs = [base[a : a + 997] for a in range(0, 390_000, 997)] + [base[::3][:50], base[:3]]
    expected = [d.tolist() for d in docs]
    for k, src in enumerate([docs, iter(docs)]):
        with StoreWriter(tmp_path / f"s{k}", fsync=False) as w:
            w.add_many(src)
        assert w.store is not None
        assert [d.tolist() for d in w.store] == expected
        w.store.verify()
    store = mmpack.build(tmp_path / "t", iter(docs), fsync=False, buffer_tokens=1 << 16)
    assert len(store) == len(docs)
    store.verify()


# ------------------------------------------------------------------ failures and lifetimes
def test_a_failing_pwritev_fails_the_build_and_leaves_nothing(tmp_path, monkeypatch):
    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(BW, "_pwritev", full)
    docs = np.split(np.arange(600_000, dtype=np.uint16), range(3000, 600_000, 3000))
    with pytest.raises(OSError, match="No space"):
        mmpack.build(tmp_path / "s", docs, fsync=False, dtype=np.uint16)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ review: errors of the threads
def _fail_first_write(monkeypatch) -> dict[str, int]:
    """The write fails with EIO the first time it is called."""
    import errno

    state = {"fail": 1}
    real = BW._pwritev

    def gate() -> None:
        if state["fail"]:
            state["fail"] -= 1
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(BW, "_pwritev", lambda *a: gate() or real(*a))
    return state


@pytest.mark.parametrize("how", ["list", "array", "generator"])
def test_a_failed_write_is_never_published_even_if_caught(tmp_path, monkeypatch, how):
    """A write error raised by one ``add`` leaves a gap in the file (its bytes were counted):
    catching it and going on must not publish a store whose gap reads as zeros (the digests,
    taken from the file, would match them)."""
    state = _fail_first_write(monkeypatch)
    a = np.arange(1 << 20, dtype=np.uint16) % 1000 + 1
    docs = {"list": np.split(a, 64), "array": [a], "generator": iter(np.split(a, 64))}[how]
    with pytest.raises(OSError, match="Input/output"):
        with StoreWriter(tmp_path / "s", dtype=np.uint16, fsync=False) as w:
            with pytest.raises(OSError, match="Input/output"):
                w.add_many(docs)
            assert state["fail"] == 0
            w.add(a[::-1].copy())
    assert os.listdir(tmp_path) == []


def test_an_interrupted_wait_is_waited_for_before_the_file_closes(tmp_path, monkeypatch):
    """``KeyboardInterrupt`` while waiting for the writer: the write still in flight is waited
    for by ``close`` (else it would go on writing to a closed, maybe reused, descriptor)."""
    import signal
    import threading
    import time

    started, finished = threading.Event(), threading.Event()
    real = BW._pwritev

    def slow(*a):
        started.set()
        time.sleep(0.4)
        n = real(*a)
        finished.set()
        return n

    monkeypatch.setattr(BW, "_pwritev", slow)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with open(tmp_path / "t.bin", "wb") as f:
            bw = StripeWriter(f.fileno(), tmp_path / "t.bin", 64)
            bw.submit([np.arange(100, dtype=np.uint16)], np.array([200], dtype=np.int64))
            assert started.wait(5)
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                bw.sync()
            bw.close()
            assert finished.is_set()  # close waited for the write
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_write_that_makes_no_progress_raises(tmp_path, monkeypatch):
    """A short write followed by writes of 0 bytes (no error) raises instead of looping."""
    calls = []

    def nothing(fd, data, offset):
        calls.append(1)
        if len(calls) > 100:
            raise AssertionError("the writer loops on writes of 0 bytes")
        return 0

    monkeypatch.setattr(BW, "_pwritev", lambda fd, bufs, offset: 0)
    monkeypatch.setattr(BW.os, "pwrite", nothing)
    with open(tmp_path / "t.bin", "wb") as f:
        bw = StripeWriter(f.fileno(), tmp_path / "t.bin", 64)
        bw.submit([np.arange(100, dtype=np.uint16)], np.array([200], dtype=np.int64))
        with pytest.raises(OSError) as info:
            bw.sync()
        bw.close()
    assert info.value.errno == errno.ENOSPC


def test_documents_stay_alive_until_written_when_the_callers_list_is_cleared(tmp_path, monkeypatch):
    """The writer holds its own references to the documents it writes: the caller clearing
    its list (another thread, or after ``append_arrays`` returns) frees none of them while
    ``pwritev`` reads them."""
    import gc
    import threading

    go = threading.Event()
    real = BW._pwritev

    def held(fd, buffers, offset):
        assert go.wait(5)
        return real(fd, buffers, offset)

    monkeypatch.setattr(BW, "_pwritev", held)
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 60_000, 40_000).astype(np.uint16) for _ in range(40)]  # apart
    expected = np.concatenate(docs).tobytes()
    tf = TokenFile(tmp_path / "t.bin", open, np.dtype("<u2"), 1 << 16)
    assert tf.append_arrays(docs, np.full(40, 40_000, dtype=np.int64))
    docs.clear()
    gc.collect()
    junk = [np.full(40_000, 7, dtype=np.uint16) for _ in range(40)]  # reuse the freed memory
    go.set()
    digests = tf.finish()
    tf.close()
    del junk
    assert (tmp_path / "t.bin").read_bytes() == expected
    assert digests == _naive(expected, 1 << 16)


def test_a_token_file_that_fails_to_start_closes_its_descriptor(tmp_path, monkeypatch):
    """A failure after the file is opened (here the writer's threads cannot start) closes the
    file before the error propagates: no descriptor is left behind."""
    opened = []

    def opener(path, mode):
        f = open(path, mode)
        opened.append(f)
        return f

    def cannot_start(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr("mmpack._src.store.tokenfile.StripeWriter", cannot_start)
    with pytest.raises(RuntimeError, match="new thread"):
        TokenFile(tmp_path / "t.bin", opener, np.dtype("<u2"), 256)
    assert len(opened) == 1 and opened[0].closed


def test_a_write_in_flight_never_reaches_a_file_that_reuses_its_descriptor(tmp_path, monkeypatch):
    """The owner closes its file while a write is still in flight (an exception between
    ``submit`` and ``close``, e.g. a test example aborted mid-way) and the descriptor number is
    reused by the next file opened: the write lands in its own file, never in the new one."""
    import threading

    go, started = threading.Event(), threading.Event()
    real = BW._pwritev

    def held(fd, buffers, offset):
        started.set()
        assert go.wait(5)
        return real(fd, buffers, offset)

    monkeypatch.setattr(BW, "_pwritev", held)
    with open(tmp_path / "a.bin", "wb") as f:
        bw = StripeWriter(f.fileno(), tmp_path / "a.bin", 8)
        bw.submit([np.array([0, 0, 0], dtype=np.uint16)], np.array([6], dtype=np.int64))
        assert started.wait(5)
        reused = f.fileno()
    with open(tmp_path / "b.bin", "wb") as g:  # most likely the number the first file had
        g.write(b"\xe5\xc4")
        g.flush()
        go.set()
        bw.sync()
        assert g.fileno() == reused  # else this test proves nothing
    bw.close()
    assert (tmp_path / "b.bin").read_bytes() == b"\xe5\xc4"
    assert (tmp_path / "a.bin").read_bytes() == bytes(6)


def test_closing_an_abandoned_writer_gives_back_the_disk_reserved(tmp_path):
    """A writer closed without :meth:`digests` (a build being abandoned) releases the disk it
    reserved past the file's end; the bytes written stay."""
    path = tmp_path / "t.bin"
    with open(path, "wb") as f:
        bw = StripeWriter(f.fileno(), path, 64)
        bw.submit([np.arange(100, dtype=np.uint16)], np.array([200], dtype=np.int64))
        bw.sync()
        reserved = os.stat(path).st_blocks * 512
        bw.close()
    assert path.read_bytes() == np.arange(100, dtype=np.uint16).tobytes()
    if reserved > 1 << 20:  # the file system took the reservation
        assert os.stat(path).st_blocks * 512 < 1 << 20
