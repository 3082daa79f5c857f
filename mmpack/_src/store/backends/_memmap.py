"""The default backend: raw little-endian arrays mapped read-only.

Layout: ``mmpack.json`` (metadata), ``tokens.bin``, ``offsets.bin``.  Opening maps both files
read-only (no data is read) and closes them: the mappings hold no file descriptor
(:mod:`mmpack._src.store.backends._mapping`), so a process may hold thousands of stores; a range read is a slice of the mapping, so random access costs a
page-cache copy and nothing else.

Cold data (pages not in the page cache).  With the kernel's default advice every page fault on a
file mapping reads a whole read-ahead window around the faulting page (``read_ahead_kb``, 8 MiB on
the benchmark machine): a random 4 KiB window then costs ~6 ms (6,276 us against 59 us for an
``os.pread`` of the same bytes, ``benchmarks/bench_cold.py``).  So the token mapping is advised
``MADV_RANDOM`` at open (a fault reads its own page only) and switched to ``MADV_SEQUENTIAL`` for
scans (:meth:`TokenStore.verify`) then back.  Faults are still served one at a time, so batched
and cold single reads go through :meth:`MemmapBackend.prefetch`, one ``madvise(MADV_WILLNEED)`` per
page-aligned range (merged when ranges share pages): the kernel queues all of the batch's reads at
once and the copy kernel then waits for them together (a cold batch of 256 windows: 6.4 ms, against
1.05 s fault by fault with the default advice).  A ``madvise`` costs 2-3 us here even when the pages
are resident, too much to pay per range on every warm batch, so :meth:`MemmapBackend.resident`
first asks ``mincore`` about a couple of sampled pages (~5 us each) and callers skip the prefetch
when they are in memory.
The offsets mapping keeps the default advice: its pages are read as reads and checks use them.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.libc import libc_function
from mmpack._src.store.backends._base import OFFSETS_FILE, TOKENS_FILE, Backend
from mmpack._src.store.backends._mapping import FileMapping, map_file
from mmpack._src.store.format import META_FILE, OFFSETS_DTYPE, StoreMeta, write_json_atomic
from mmpack.errors import FormatError


def map_readonly(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """Map ``count`` items of ``dtype`` from ``path``, after checking the file size."""
    expected = count * dtype.itemsize
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FormatError(f"{path} is missing: the store is incomplete") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FormatError(
            f"{path} is not a regular file (mode {stat.filemode(st.st_mode)}): "
            "the store is damaged; rebuild it"
        )
    try:  # size and mapping from one open file: a concurrent rebuild cannot slip between
        actual = st.st_size
        if actual != expected:
            raise FormatError(
                f"{path} holds {actual} bytes but the metadata says {count} items of {dtype} "
                f"({expected} bytes): the file is truncated or was replaced"
            )
        if count == 0:
            return np.empty(0, dtype=dtype)
        try:
            raw = map_file(fd, 0, expected)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        os.close(fd)  # the mapping holds no descriptor (see mmpack._src.store.backends._mapping)
    return raw.view(dtype)


ADVICE: dict[str, int] = {
    "normal": getattr(mmap, "MADV_NORMAL", 0),
    "random": getattr(mmap, "MADV_RANDOM", 1),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", 2),
}
"""``madvise`` values of the access patterns :meth:`MemmapBackend.advise` accepts."""

PAGE = mmap.PAGESIZE
_PROBES = 2  # pages asked about by resident(): ~5 us each (mincore through ctypes, this VM)
_FEW = 4  # prefetch() requests up to this many ranges one by one, without merging


def mapping_of(arr: np.ndarray) -> FileMapping | mmap.mmap | None:
    """The mapping under ``arr`` (a view of :func:`map_readonly`'s :class:`FileMapping`, or of a
    ``numpy.memmap``'s ``mmap.mmap``), or None."""
    base: Any = arr
    while base is not None and not isinstance(base, (FileMapping, mmap.mmap)):
        base = getattr(base, "base", None)
    return base


def _load_mincore() -> Any:
    # None where the C library has none: residency unknown
    return libc_function(
        "mincore", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    )


_MINCORE = _load_mincore()


def page_ranges(
    starts: np.ndarray, lengths: np.ndarray, itemsize: int, nbytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges holding element ranges ``[starts, starts + lengths)``, widened to whole
    pages, sorted, with ranges that share or touch a page merged.

    Returns
    -------
    lo, hi : numpy.ndarray, int64, shape (m,)
        Page-aligned ``lo``; ``hi`` page-aligned or ``nbytes``; disjoint, increasing.
    """
    keep = lengths > 0
    if not keep.all():
        starts, lengths = starts[keep], lengths[keep]
    if starts.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    lo = (starts * itemsize) // PAGE * PAGE
    hi = np.minimum(-(-((starts + lengths) * itemsize) // PAGE) * PAGE, nbytes)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    # a new merged range starts where a range begins after everything before it has ended
    first = np.ones(lo.size, dtype=bool)
    first[1:] = lo[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    ends = np.append(heads[1:], lo.size) - 1
    return lo[heads], reach[ends]


class MemmapBackend(Backend):
    name = "memmap"
    tokens: np.ndarray

    def __init__(self, path: Path, meta: StoreMeta) -> None:
        super().__init__(path, meta)
        self.tokens = map_readonly(path / TOKENS_FILE, meta.dtype, meta.num_tokens)
        self._offsets = map_readonly(path / OFFSETS_FILE, OFFSETS_DTYPE, meta.num_docs + 1)
        self._mm = mapping_of(self.tokens)
        self._nbytes = meta.num_tokens * meta.dtype.itemsize
        self._base = self.tokens.ctypes.data if self._mm is not None else 0
        self._vec = (ctypes.c_ubyte * 1)()  # mincore's answer for one page
        self._pattern = "normal"
        self.advise("random")

    # ------------------------------------------------------------------ access pattern
    def advise(self, pattern: str) -> str:
        """``madvise`` the whole token mapping for ``pattern`` (see :data:`ADVICE`); return the
        previous pattern.  Advice is a property of the mapping, shared by every thread using
        this store (never by other processes, whose mappings are their own)."""
        if pattern not in ADVICE:
            raise ValueError(f"pattern must be one of {sorted(ADVICE)}, got {pattern!r}")
        previous = self._pattern
        if self._mm is not None and hasattr(self._mm, "madvise"):
            try:
                self._mm.madvise(ADVICE[pattern])
            except OSError:  # a hint the platform refuses changes speed only: reading goes on
                return previous
        self._pattern = pattern
        return previous

    def resident(self, positions: np.ndarray) -> bool:
        """True when the pages holding the first few (:data:`_PROBES`) of ``positions`` are all
        in the page cache (``mincore``); positions are clipped into the array."""
        if self._mm is None or positions.size == 0:
            return True
        if _MINCORE is None:
            return False
        base, vec, last = self._base, self._vec, self.meta.num_tokens - 1
        itemsize = self.meta.dtype.itemsize
        step = max(1, positions.size // _PROBES)
        for pos in positions[::step][:_PROBES].tolist():
            byte = (pos if 0 <= pos <= last else min(max(pos, 0), last)) * itemsize
            if _MINCORE(base + byte - byte % PAGE, 1, vec) != 0 or not vec[0] & 1:
                return False
        return True

    def prefetch(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """One ``madvise(MADV_WILLNEED)`` per merged page range of the token ranges (see
        :func:`page_ranges`): the kernel starts reading every missing page now and returns at
        once.  Returns the number of calls (0 if the platform refuses the hint)."""
        if self._mm is None or not hasattr(self._mm, "madvise"):
            return 0
        try:
            return self._will_need(self._mm, starts, lengths)
        except OSError:  # a refused hint: the reads themselves will fault the pages in
            return 0

    def _will_need(
        self, mm: FileMapping | mmap.mmap, starts: np.ndarray, lengths: np.ndarray
    ) -> int:
        will_need = mm.madvise
        flag = mmap.MADV_WILLNEED
        itemsize = self.meta.dtype.itemsize
        if starts.size <= _FEW:  # a few ranges: plain ints, ~25 us less than the numpy path
            calls = 0
            for s, n in zip(starts.tolist(), lengths.tolist()):
                if n > 0:
                    a = s * itemsize // PAGE * PAGE
                    will_need(flag, a, min(-(-(s + n) * itemsize // PAGE) * PAGE, self._nbytes) - a)
                    calls += 1
            return calls
        lo, hi = page_ranges(starts, lengths, itemsize, self._nbytes)
        for a, b in zip(lo.tolist(), hi.tolist()):
            will_need(flag, a, b - a)
        return int(lo.size)

    @staticmethod
    def read_meta(path: Path) -> Any | None:
        meta_path = path / META_FILE
        if not meta_path.is_file():
            if os.path.lexists(meta_path):  # a FIFO would block the read: never open it
                raise FormatError(f"{meta_path} is not a regular file: the store is damaged")
            return None
        try:
            return json.loads(meta_path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{meta_path} is not valid JSON: {exc}") from None

    @staticmethod
    def commit(tmpdir: Path, meta: StoreMeta) -> None:
        write_json_atomic(tmpdir / META_FILE, meta.to_json())

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    def prefetch_range(self, start: int, stop: int) -> int:
        """One ``madvise(MADV_WILLNEED)`` over the pages of ``[start, stop)``: the single-read
        path, in plain ints (~2 us of Python around the call)."""
        if stop <= start or self._mm is None or not hasattr(self._mm, "madvise"):
            return 0
        itemsize = self.meta.dtype.itemsize
        a = start * itemsize // PAGE * PAGE
        b = min(-(-stop * itemsize // PAGE) * PAGE, self._nbytes)
        try:
            self._mm.madvise(mmap.MADV_WILLNEED, a, b - a)
        except OSError:  # a refused hint: the read itself will fault the pages in
            return 0
        return 1

    def read_range(self, start: int, stop: int) -> np.ndarray:
        return self.tokens[start:stop]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if starts.size > 1 and not self.resident(starts):
            self.prefetch(starts, lengths)  # cold: queue the batch's page reads together
        return self.tokens, starts
