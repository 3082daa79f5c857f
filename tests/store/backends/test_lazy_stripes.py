"""Arrays filled stripe by stripe (mmpack._src.store.backends._lazy_stripes), offsets and
check tables: fetched and CRC-checked on first use, kept in a sparse file other readers reuse,
served from memory where that file cannot be written, a corrupt stripe refused (from the source
or from the kept file), loads from several threads at once each fetching a stripe once."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import mmpack._src.store.backends._lazy_stripes as lazy_stripes
from mmpack._src.store.backends._lazy_stripes import LazyStripes
from mmpack._src.store.format import crc32_blocks
from mmpack.errors import FormatError

STRIPE = 64  # bytes: 8 entries a stripe
OFFSETS = {"dtype": np.int64, "what": "offsets"}


def _offsets(n: int = 45) -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([[0], np.cumsum(rng.integers(0, 9, n - 1))]).astype(np.int64)


class Source:
    """The offsets' bytes behind ``fetch(lo, hi)``, counting calls and bytes."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.raw = bytearray(offsets.tobytes())
        self.calls: list[tuple[int, int]] = []

    def fetch(self, lo: int, hi: int) -> bytes:
        self.calls.append((lo, hi))
        return bytes(self.raw[lo:hi])


def _lazy(offsets, source, kept=None, on_error=None, crcs=True):
    sums = crc32_blocks(offsets.tobytes(), STRIPE) if crcs else None
    return LazyStripes(
        offsets.shape[0], STRIPE, sums, source.fetch, "src", kept, on_error, **OFFSETS
    )


def test_stripes_are_fetched_on_first_use_only_and_read_only():
    want = _offsets()
    src = Source(want)
    lz = _lazy(want, src)
    assert lz.array.shape == want.shape and not lz.array.flags.writeable
    assert src.calls == [] and not lz.array.any()  # nothing read at construction
    lz.load(2)
    assert src.calls == [(128, 192)] and lz.loaded(2) and not lz.loaded(1)
    np.testing.assert_array_equal(lz.array[16:24], want[16:24])
    lz.load(2)
    lz.load(0, 6)  # stripes 0, 1, 3, 4, 5: two runs around the one already there
    assert src.calls[1:] == [(0, 128), (192, 360)]
    np.testing.assert_array_equal(lz.array, want)


def test_runs_are_cut_at_run_bytes(monkeypatch):
    monkeypatch.setattr(lazy_stripes, "RUN_BYTES", 2 * STRIPE)
    want = _offsets()
    src = Source(want)
    lz = _lazy(want, src)
    lz.load(0, 6)
    assert src.calls == [(0, 128), (128, 256), (256, 360)]


def test_a_stripe_failing_its_crc_is_refused_and_stays_absent():
    want = _offsets()
    src = Source(want)
    src.raw[3 * STRIPE + 5] ^= 1
    lz = _lazy(want, src)
    with pytest.raises(FormatError, match=r"src: offsets stripe 3 \(bytes 192\.\.256\) fails its"):
        lz.load(3)
    assert not lz.loaded(3) and not lz.array[24:32].any()
    with pytest.raises(FormatError, match="stripe 3"):
        lz.load(0, 6)  # a run holding it: the stripes before it are kept
    assert lz.loaded(2) and not lz.loaded(3)
    src.raw = bytearray(want.tobytes())  # fixed at the source: fetched again
    lz.load(3)
    np.testing.assert_array_equal(lz.array[24:32], want[24:32])


def test_a_short_answer_is_refused():
    want = _offsets()
    src = Source(want)
    src.raw = src.raw[:300]
    lz = _lazy(want, src)
    with pytest.raises(FormatError, match="came back as 44 bytes"):
        lz.load(4, 6)


def test_the_kept_file_is_sparse_reused_and_repaired(tmp_path):
    want = _offsets()
    kept = tmp_path / "f" / "offsets.bin"
    first = _lazy(want, Source(want), kept)
    assert kept.stat().st_size == want.nbytes and not kept.read_bytes().strip(b"\0")
    first.load(1)
    first.load(5)
    disk = np.frombuffer(kept.read_bytes(), np.int64)
    np.testing.assert_array_equal(disk[8:16], want[8:16])
    assert not disk[:8].any() and not disk[16:40].any()  # never fetched: zeros (holes)
    # another reader: stripes on disk cost a CRC and no fetch; the others are fetched
    src = Source(want)
    second = _lazy(want, src, kept)
    second.load(0, 6)
    assert src.calls == [(0, 64), (128, 320)]
    np.testing.assert_array_equal(second.array, want)
    # a stripe damaged on disk is fetched again and written back
    with open(kept, "r+b") as f:
        f.seek(2 * STRIPE + 3)
        f.write(b"\x7f")
    src = Source(want)
    third = _lazy(want, src, kept)
    third.load(0, 6)
    assert src.calls == [(128, 192)]
    np.testing.assert_array_equal(third.array, want)
    assert kept.read_bytes() == want.tobytes()
    for lz in (first, second, third):
        lz.close()


def test_an_unwritable_kept_folder_serves_from_memory_and_tells_once(tmp_path):
    want = _offsets()
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")  # a file where the folder should be: nothing can be created
    told: list[OSError] = []
    src = Source(want)
    lz = _lazy(want, src, blocker / "offsets.bin", told.append)
    assert len(told) == 1 and isinstance(told[0], OSError)
    lz.load(0, 6)
    np.testing.assert_array_equal(lz.array, want)
    assert len(told) == 1


def test_a_failing_write_keeps_the_stripe_in_memory(tmp_path, monkeypatch):
    want = _offsets()
    told: list[OSError] = []
    lz = _lazy(want, Source(want), tmp_path / "offsets.bin", told.append)

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    lz.load(0, 6)
    np.testing.assert_array_equal(lz.array, want)
    assert len(told) == 1 and told[0].errno == 28
    assert not (tmp_path / "offsets.bin").read_bytes().strip(b"\0")  # nothing half-written


def test_without_crcs_the_bitmap_alone_says_what_is_present():
    want = _offsets()
    src = Source(want)
    lz = _lazy(want, src, crcs=False)
    lz.load(1)
    lz.load(1)
    assert src.calls == [(64, 128)]
    np.testing.assert_array_equal(lz.array[8:16], want[8:16])
    with pytest.raises(ValueError, match="kept file needs"):
        LazyStripes(want.shape[0], STRIPE, None, src.fetch, "src", kept=Path("x"), **OFFSETS)


def test_a_wrong_number_of_crcs_is_a_format_error():
    want = _offsets()
    with pytest.raises(FormatError, match="holds 2 offsets checksums for 6 stripes"):
        LazyStripes(
            want.shape[0], STRIPE, [zlib.crc32(b"")] * 2, Source(want).fetch, "src", **OFFSETS
        )


def test_a_kept_file_of_another_user_is_read_and_never_written(tmp_path, monkeypatch):
    want = _offsets()
    kept = tmp_path / "offsets.bin"
    first = _lazy(want, Source(want), kept)
    first.load(0)
    first.close()
    real_open = os.open

    def no_write(path, flags, *args):
        if flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_write)
    told: list[OSError] = []
    src = Source(want)
    lz = _lazy(want, src, kept, told.append)
    lz.load(0, 6)
    assert src.calls == [(64, 360)] and told == []  # stripe 0 from the file, nothing written
    np.testing.assert_array_equal(lz.array, want)
    assert not np.frombuffer(kept.read_bytes(), np.int64)[8:].any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_child_forked_while_a_load_holds_the_lock_loads_its_own_stripes():
    """A DataLoader worker forked while another thread loads a stripe gets a lock of its own:
    its first load does not wait forever on the parent's held lock."""
    import multiprocessing as mp

    want = _offsets()
    lz = _lazy(want, Source(want))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with lz._lock.get():  # the parent's lock held across the fork

        def child():
            lz.load(0, 6)
            out.put(bool(np.array_equal(lz.array, want)))

        proc = ctx.Process(target=child)
        proc.start()
        try:
            assert out.get(timeout=60) is True
        finally:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    assert not lz.loaded(0)  # the child's loads are its own


def _digests(n: int = 37) -> np.ndarray:
    return np.random.default_rng(4).integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)


def _table(want, src, kept=None):
    sums = crc32_blocks(want.astype("<u8").tobytes(), STRIPE)
    return LazyStripes(
        want.shape[0], STRIPE, sums, src.fetch, "t", kept, dtype="<u8", what="check table"
    )


def test_a_uint64_table_loads_the_stripes_of_the_entries_asked_for(tmp_path):
    want = _digests()
    src = Source(want)
    lz = _table(want, src, tmp_path / "tokens.xxh")
    assert lz.array.dtype == np.dtype("<u8") and src.calls == []
    lz.load_items(9, 17)  # entries 9..16: stripes 1 and 2
    assert src.calls == [(64, 192)] and [lz.loaded(p) for p in range(5)] == [0, 1, 1, 0, 0]
    np.testing.assert_array_equal(lz.array[8:24], want[8:24])
    lz.load_items(36, 37)  # the short last stripe
    lz.load_items(5, 5)  # no entry: nothing
    assert src.calls[1:] == [(256, 296)]
    assert (tmp_path / "tokens.xxh").stat().st_size == want.nbytes
    src.raw[2 * STRIPE + 1] ^= 1
    lz.recheck(1)  # the source's stripe 1 is intact
    with pytest.raises(FormatError, match=r"t: check table stripe 2 \(bytes 128\.\.192\) fails"):
        lz.recheck(2)  # the source's bytes, not the kept copy
    np.testing.assert_array_equal(lz.array[16:24], want[16:24])
    lz.close()


def test_an_empty_table_and_a_bad_stripe_size(tmp_path):
    empty = np.zeros(0, np.uint64)
    lz = _table(empty, Source(empty), tmp_path / "tokens.xxh")
    lz.load_items(0, 0)
    assert lz.array.shape == (0,) and not (tmp_path / "tokens.xxh").exists()
    with pytest.raises(ValueError, match="not a positive multiple of 8"):
        LazyStripes(4, 12, None, Source(empty).fetch, "t", dtype="<u8", what="check table")


def test_loads_from_several_threads_fetch_each_stripe_once(tmp_path):
    """The span fetcher checks its parts from several threads: concurrent loads of overlapping
    stripes each see their entries and the source is asked once per stripe."""
    import threading
    import time

    want = _digests(400)
    src = Source(want)
    slow = src.fetch

    def fetch(lo, hi):
        time.sleep(0.002)  # a request in flight while the other threads ask
        return slow(lo, hi)

    sums = crc32_blocks(want.tobytes(), STRIPE)
    lz = LazyStripes(400, STRIPE, sums, fetch, "t", tmp_path / "k", dtype="<u8", what="table")
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        start.wait()
        try:
            for lo in rng.integers(0, 390, 40).tolist():
                lz.load_items(lo, lo + 10)
                np.testing.assert_array_equal(lz.array[lo : lo + 10], want[lo : lo + 10])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    fetched = [p for lo, hi in src.calls for p in range(lo // STRIPE, -(-hi // STRIPE))]
    assert len(fetched) == len(set(fetched))  # no stripe fetched twice
    lz.close()
