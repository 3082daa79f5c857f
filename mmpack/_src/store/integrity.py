"""Checking a store's structure and checksums: the offsets' invariants at open and the per-block
checksums, for a full :meth:`~mmpack.TokenStore.verify` and for verify-on-read.

:func:`check_offsets` checks what every open checks: ``offsets`` has ``num_docs + 1`` entries,
starts at 0, never decreases and ends at ``num_tokens`` (one O(num_docs) pass; numpy below 4M
documents, so ``mmpack info`` never loads numba, the numba kernel above, with no temporaries).
:class:`StripeChecker` recomputes the digest of a 16 MiB block of the offsets (CRC-32) or tokens
(XXH64, :func:`stripe_digest`) from the backend's raw bytes and compares it with the metadata's,
and keeps a bitmap of the token blocks already checked, so verify-on-read checks each block once
(the first read that touches it) and then costs one bitmap lookup per touched block (the cost of
a block: ``python -m benchmarks.bench_store``, docs/benchmarks.md).
:class:`CheckedPages` is the one rule for an index checked lazily: a bitmap of pages, each checked
once on first use (the store's :class:`~mmpack._src.store.offsets_pages.OffsetsPages`, a cached plan's chunks in
:mod:`mmpack._src.packing.plan_file`); after that a read costs one bitmap lookup per page it touches.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mmpack._src.store.backends import Backend
from mmpack._src.store.format import StoreMeta
from mmpack.errors import FormatError

__all__ = [
    "CheckedPages",
    "ReadChecker",
    "StripeChecker",
    "check_offsets",
    "stripe_digest",
    "stripe_digests",
]


class ReadChecker(Protocol):
    """What a store with ``verify_reads`` asks before serving tokens: check (once) every block
    that flat token ranges touch, raising :class:`FormatError` naming the first bad one.
    :class:`StripeChecker` checks a store's own block checksums; a kind of store without them
    (a join, another tool's files) brings its own (:class:`TokenStore`'s ``read_checker``)."""

    def verify_span(self, start: int, stop: int) -> None:
        """Tokens ``[start, stop)`` (validated ints)."""

    def verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Ranges ``[starts, starts + lengths)`` (int64, shape (k,), validated)."""

    def all_checked(self) -> bool:
        """Whether every block has been checked (later reads need no check)."""


def stripe_digest(data: Any) -> int:
    """XXH64 (seed 0) of the bytes ``data`` (bytes, memoryview or numpy array): the digest of a
    token stripe, a remote page, a plan array (:func:`mmpack._src.kernels.store.xxh64`; numba is
    loaded on the first call)."""
    from mmpack._src.kernels.store import xxh64

    raw = _bytes_of(data)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design (NUMBA_DISABLE_JIT)
        return int(xxh64(raw, _words_of(raw), np.uint64(0)))


def stripe_digests(data: Any, block: int) -> np.ndarray:
    """:func:`stripe_digest` of each ``block`` bytes of ``data`` (the last block may be short), in
    one kernel call.

    Returns
    -------
    numpy.ndarray, uint64, shape (ceil(len(data) / block),)
    """
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0 or block % 8:
        raise ValueError(f"block must be a positive multiple of 8 (bytes), got {block!r}")
    raw = _bytes_of(data)
    out = np.empty(-(-raw.size // block), np.uint64)
    from mmpack._src.kernels.store import xxh64_stripes

    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design (NUMBA_DISABLE_JIT)
        xxh64_stripes(raw, _words_of(raw), block, out)
    return out


def _bytes_of(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _words_of(raw: np.ndarray) -> np.ndarray:
    words = raw[: raw.size // 8 * 8].view("<u8")
    if sys.byteorder != "little":  # pragma: no cover  (the kernel reads native words)
        words = words.astype(np.uint64)
    return words


class StripeChecker:
    """The block checksums of one store: check one block, check the token blocks a read touches
    (each once), or all of them.

    Parameters
    ----------
    path : Path
        Named in error messages.
    meta : StoreMeta
        Holds the block size and the stored block digests (``tokens_digests``, XXH64;
        ``offsets_crc32``).
    backend : Backend
        Serves ``raw_bytes(name, lo, hi)``.
    track_reads : bool
        Keep the bitmap of checked token blocks (verify-on-read); without it only
        :meth:`check_block` and :meth:`check_all` are used, and ``meta`` may be a record without
        block checksums (a joined or foreign store, which verifies its own way).
    """

    def __init__(self, path: Path, meta: StoreMeta, backend: Backend, track_reads: bool) -> None:
        self._path = path
        self._meta = meta
        self._backend = backend
        self._verified = np.zeros(len(meta.tokens_digests) if track_reads else 0, dtype=bool)
        self._pending = int(self._verified.shape[0])  # blocks not verified yet

    def all_checked(self) -> bool:
        return self._pending == 0

    def verify_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Checksum every not yet verified token block that ranges ``[starts, starts+lengths)``
        (int64, shape (k,)) touch (ranges are short next to a block: usually one or two blocks
        each).  Once every block is verified a call returns at once."""
        if not self._pending:
            return
        keep = lengths > 0
        if not keep.all():
            starts, lengths = starts[keep], lengths[keep]
        if not starts.size:
            return
        per_block = self._meta.block_bytes // self._meta.dtype.itemsize
        first = starts // per_block
        last = (starts + lengths - 1) // per_block
        touched = np.unique(np.concatenate([first, last]))
        todo = touched[~self._verified[touched]]
        for b in todo.tolist():
            self._verify_token_block(b)
        for f, last_b in zip(first[last - first > 1].tolist(), last[last - first > 1].tolist()):
            self.verify_span(f * per_block, (last_b + 1) * per_block)  # a range over 3+ blocks

    def verify_span(self, start: int, stop: int) -> None:
        """Checksum every not yet verified token block that flat tokens ``[start, stop)`` touch."""
        if stop <= start or not self._pending:
            return
        per_block = self._meta.block_bytes // self._meta.dtype.itemsize
        for b in range(start // per_block, (stop - 1) // per_block + 1):
            if not self._verified[b]:
                self._verify_token_block(b)

    def _verify_token_block(self, b: int) -> None:
        self.check_block("tokens", b)
        if not self._verified[b]:
            self._verified[b] = True
            self._pending -= 1

    def check_block(self, name: str, b: int) -> int:
        """Checksum block ``b`` of array ``name`` (``"offsets"`` or ``"tokens"``);
        :class:`FormatError` naming it on a mismatch.  Returns the block's size in bytes."""
        meta = self._meta
        offsets = name == "offsets"
        if offsets:
            nbytes, digests, kind = (meta.num_docs + 1) * 8, meta.offsets_crc32, "crc32"
        else:
            nbytes, digests = meta.num_tokens * meta.dtype.itemsize, meta.tokens_digests
            kind = "xxh64"
        lo = b * meta.block_bytes
        hi = min(nbytes, lo + meta.block_bytes)
        raw = self._backend.raw_bytes(name, lo, hi)
        got = zlib.crc32(raw) if offsets else stripe_digest(raw)
        if got != digests[b]:
            width = 10 if offsets else 18
            raise FormatError(
                f"{self._path}: {name} stripe {b} (bytes {lo}..{hi}) fails its checksum "
                f"({kind}: stored {digests[b]:#0{width}x}, computed {got:#0{width}x}): the data was "
                "modified or corrupted; rebuild the store"
            )
        return hi - lo

    def check_all(self, on_block: Callable[[int], None] | None = None) -> dict[str, int]:
        """Every block of the offsets, then of the tokens; ``{"blocks", "bytes"}`` checked.
        ``on_block`` is told each checked block's size in bytes (a progress bar)."""
        meta = self._meta
        checked_blocks = checked_bytes = 0
        for name, digests in (("offsets", meta.offsets_crc32), ("tokens", meta.tokens_digests)):
            for b in range(len(digests)):
                size = self.check_block(name, b)
                checked_bytes += size
                checked_blocks += 1
                if on_block is not None:
                    on_block(size)
        return {"blocks": checked_blocks, "bytes": checked_bytes}


_NUMPY_CHECK_DOCS = 1 << 22


def _first_decrease(offsets: np.ndarray) -> int:
    """Index of the first decrease in ``offsets`` or -1.  Small indexes are checked with numpy
    (opening a store for ``mmpack info`` then never loads numba, ~0.5 s); large ones with the
    kernel (one pass, no temporaries)."""
    if offsets.shape[0] <= _NUMPY_CHECK_DOCS:
        bad = np.flatnonzero(offsets[1:] < offsets[:-1])
        return int(bad[0]) if bad.size else -1
    from mmpack._src.kernels.store import first_decrease

    return int(first_decrease(offsets))


def check_offsets(offsets: np.ndarray, meta: StoreMeta, path: Path) -> None:
    """:class:`FormatError` naming ``path`` unless ``offsets`` (int64, shape (num_docs + 1,))
    starts at 0, never decreases and ends at ``meta.num_tokens``."""
    _check_ends(offsets, meta, path)
    _raise_decrease(offsets, _first_decrease(offsets), 0, path)


def _check_ends(offsets: np.ndarray, meta: StoreMeta, path: Path) -> None:
    """The O(1) part of :func:`check_offsets`: the shape, the first and the last entry."""
    if offsets.shape != (meta.num_docs + 1,):
        raise FormatError(
            f"{path}: offsets has shape {offsets.shape}, expected ({meta.num_docs + 1},)"
        )
    if offsets[0] != 0:
        raise FormatError(f"{path}: offsets[0] is {int(offsets[0])}, expected 0")
    if offsets[-1] != meta.num_tokens:
        raise FormatError(
            f"{path}: offsets end at {int(offsets[-1])} but the store holds "
            f"{meta.num_tokens} tokens"
        )


def _raise_decrease(offsets: np.ndarray, bad: int, base: int, path: Path) -> None:
    """:class:`FormatError` naming document ``base + bad`` unless ``bad`` is -1."""
    if bad >= 0:
        bad += base
        raise FormatError(
            f"{path}: offsets decrease at document {bad} "
            f"({int(offsets[bad])} -> {int(offsets[bad + 1])}): the index is corrupt"
        )


class CheckedPages:
    """Pages of ``entries`` consecutive entries of an array, each checked once, on first use.

    Parameters
    ----------
    entries : int
        Entries of the array (>= 0).
    page_entries : int
        Entries per page (>= 1; the last page may be short).
    check_page : callable
        ``check_page(p)`` checks page ``p`` and raises (:class:`FormatError`) when it is bad; a
        page that fails stays unchecked, so the next read that uses it fails again.
    checked : numpy.ndarray, optional
        bool, shape (pages,): the bitmap to keep (zeros), shared with a ``check_page`` that looks
        at which neighbours are checked; a new one when None.
    """

    def __init__(
        self,
        entries: int,
        page_entries: int,
        check_page: Callable[[int], None],
        checked: np.ndarray | None = None,
    ) -> None:
        self.page_entries = max(1, int(page_entries))
        self._check = check_page
        pages = -(-int(entries) // self.page_entries)
        if checked is None:
            checked = np.zeros(pages, dtype=bool)
        self._checked = checked
        self._pending = pages - int(checked.sum())

    @property
    def n_pages(self) -> int:
        return int(self._checked.shape[0])

    def all_checked(self) -> bool:
        return self._pending == 0

    def check_page(self, p: int) -> None:
        """Check page ``p`` (an int in ``[0, n_pages)``) unless it was checked."""
        if not self._checked[p]:
            self._check(p)
            self._checked[p] = True
            self._pending -= 1

    def check_entries(self, lo: int, hi: int) -> None:
        """Check (once) the pages holding entries ``[lo, hi]`` (ints, ``0 <= lo <= hi <
        entries``)."""
        if not self._pending:
            return
        for p in range(lo // self.page_entries, hi // self.page_entries + 1):
            self.check_page(p)

    def check_ranges(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Check (once) the pages holding entries ``[lo[k], hi[k]]`` for every ``k`` with
        ``lo[k] <= hi[k]`` (int64, shape (k,), inside the array)."""
        if not self._pending:
            return
        keep = lo <= hi
        if not keep.all():
            lo, hi = lo[keep], hi[keep]
        first, last = lo // self.page_entries, hi // self.page_entries
        touched = np.unique(np.concatenate([first, last]))
        for p in touched[~self._checked[touched]].tolist():
            self.check_page(p)
        wide = last - first > 1  # a range over 3+ pages (rare: pages are long)
        for f, g in zip(first[wide].tolist(), last[wide].tolist()):
            for p in range(f + 1, g):
                self.check_page(p)

    def unchecked(self) -> list[int]:
        """The pages not checked yet, in order."""
        return np.flatnonzero(~self._checked).tolist()

    def check_all(self) -> None:
        """Check every page not checked yet."""
        for p in self.unchecked():
            self.check_page(p)

    def mark_all(self) -> None:
        """Record every page as checked (the caller checked them all its own way)."""
        self._checked[:] = True
        self._pending = 0
