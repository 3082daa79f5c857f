"""Where a remote store's token pages come from: the page sources behind
:class:`~mmpack._src.remote.fetcher.PageFetcher` and :class:`~mmpack._src.remote.spans.SpanFetcher`.

A page source locates, fetches and verifies the pages of a store's token bytes (page ``b``
is bytes ``[b * page, min((b + 1) * page, nbytes))`` of the flat little-endian tokens):

- :class:`PageSource`, the memmap layout: one object (``tokens.bin``), its pages of ``page``
  bytes checked against a table of XXH64 digests (one kernel pass over a fetched run; the
  digests are the node cache's own where its unit is the page);
- :class:`ChunkSource`, the sharded Zarr layout: one page per inner chunk, located through its
  shard's index (fetched once per shard), the chunks of a request merged into one range request
  per run of adjacent chunks of a shard, each checked against its crc32c and decoded.

Both fetch a list of pages (:meth:`~PageSource.fetch`) or a run of them back to back
(:meth:`~PageSource.fetch_run`); a page failing its check is fetched once more, then the
:class:`~mmpack.errors.FormatError` stands (a corrupt store never yields data); an object gone
since open is a :class:`~mmpack.errors.StateMismatchError`.  Each range request is reported to
the caller's ``count(requests, nbytes, again)`` (``again``: a re-fetch after a failed check).

Cost: a range request per run of pages at most ``merge_gap_bytes`` apart (memmap) or adjacent
in one shard (Zarr), all concurrently, ``max_concurrency`` at a time; one XXH64 per page or
one crc32c per chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mmpack._src.core.process import PerProcess
from mmpack._src.remote.pages import runs_of
from mmpack._src.remote.transport import ObjectMissing, Transport
from mmpack._src.store.backends._zarr_shards import ShardLayout, ShardReader
from mmpack._src.store.integrity import stripe_digest, stripe_digests
from mmpack.errors import FormatError, StateMismatchError

__all__ = ["ChunkSource", "Count", "FetchSource", "PageSource"]

Count = Callable[[int, int, bool], None]
"""``count(requests, nbytes, again)``: range requests made, the bytes they asked for, and
whether they fetch again what failed its check."""


def _no_count(requests: int, nbytes: int, again: bool) -> None:
    pass


class FetchSource(Protocol):
    """What :class:`~mmpack._src.remote.fetcher.PageFetcher` and
    :class:`~mmpack._src.remote.spans.SpanFetcher` need of a layout: its pages located, fetched and
    verified (:class:`PageSource`, :class:`ChunkSource`)."""

    transport: Transport
    url: str
    page: int
    """Bytes of a page (a power of 2; the last page may be short)."""
    nbytes: int
    """Bytes of the flat tokens."""
    itemsize: int
    digests: bool
    """Whether :meth:`fetch_run` returns each page's XXH64 (else None)."""

    def warm(self) -> None:
        """Compile what fetch threads run, in the calling thread, once per process."""

    def fetch(self, ids: list[int], count: Count = ...) -> dict[int, Any]:
        """Pages ``ids`` (sorted), verified: id -> its bytes (bytes or a uint8 array)."""
        ...

    def fetch_run(self, lo: int, hi: int, count: Count = ...) -> tuple[Any, np.ndarray | None]:
        """Pages ``[lo, hi)`` back to back, verified, and their XXH64 digests (or None)."""
        ...


class PageSource:
    """The pages of object ``key`` of ``transport`` (memmap layout), ``page`` bytes each (a power
    of 2; the last may be short), checked against ``table`` (uint64, (npages,): XXH64 each);
    ``nbytes`` and ``itemsize`` are the object's size and its tokens' size.  ``need(b0, b1)``
    makes the table's entries ``[b0, b1)`` present before they are compared (a table fetched
    stripe by stripe, :class:`~mmpack._src.store.backends._lazy_stripes.LazyStripes`); None: the
    table is whole."""

    digests = True
    """:meth:`fetch_run` returns each page's XXH64 (the node cache's own digests)."""

    def __init__(
        self, transport: Transport, key: str, table: np.ndarray, page: int, nbytes: int,
        itemsize: int, need: Callable[[int, int], None] | None = None,
    ) -> None:  # fmt: skip
        self.transport, self.url, self.key, self.table = transport, transport.url, key, table
        self.page, self.nbytes, self.itemsize = page, nbytes, itemsize
        self._need = need
        self._warm = PerProcess(self._compile)

    def warm(self) -> None:
        """Compile the check kernel in the calling thread, once per process (before starting a
        thread that fetches: numba's lock across ``fork``, :mod:`mmpack._src.kernels._jit`)."""
        self._warm.get()

    def _compile(self) -> bool:
        stripe_digests(bytes(min(self.page, self.nbytes)), self.page)  # no table stripe read
        return True

    def _span(self, b: int) -> tuple[int, int]:
        lo = b * self.page
        return lo, min(lo + self.page, self.nbytes)

    def intact(self, b: int, data: bytes | memoryview) -> bool:
        """Whether ``data`` is page ``b`` as the table records it."""
        lo, hi = self._span(b)
        self.need(b, b + 1)
        return len(data) == hi - lo and stripe_digest(data) == int(self.table[b])

    def need(self, b0: int, b1: int) -> None:
        """Make the table's digests of pages ``[b0, b1)`` present (fetched and checked on first
        use); :class:`~mmpack.errors.FormatError` naming a table stripe that fails its CRC-32."""
        if self._need is not None:
            self._need(b0, min(b1, self.table.size))

    def check_run(self, b0: int, data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
        """Check the pages ``b0, b0 + 1, ...`` that ``data`` holds (whole pages from ``b0``; the
        object's last page may end it) against the table in one pass.

        Returns
        -------
        digests : numpy.ndarray, uint64, shape (npages,)
            Each page's XXH64.
        bad : numpy.ndarray, int64
            The ids of the pages that differ from the table (sorted).
        """
        digests = stripe_digests(data, self.page)
        b1 = b0 + digests.size
        whole = min(b1 * self.page, self.nbytes) - b0 * self.page
        if b1 > self.table.size or len(data) != whole:  # short or long: every page is bad
            return digests, np.arange(b0, b1, dtype=np.int64)
        self.need(b0, b1)
        bad = np.flatnonzero(digests != self.table[b0:b1].astype(np.uint64)) + b0
        return digests, bad.astype(np.int64)

    def _get(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        try:
            return self.transport.get_ranges(self.key, ranges)
        except ObjectMissing:
            raise StateMismatchError(
                f"{self.url}: {self.key} is gone: the store was rebuilt or deleted after it was "
                "opened; open it again"
            ) from None

    def fetch(self, ids: list[int], count: Count = _no_count) -> dict[int, bytes]:
        """Pages ``ids`` (sorted), verified: one range request per run of pages at most
        ``merge_gap_bytes`` apart, all at once."""
        runs = runs_of(ids, self.page, self.transport.merge_gap_bytes // self.page)
        ranges = [(self._span(r[0])[0], self._span(r[-1])[1]) for r in runs]
        pieces = self._get(ranges)
        count(len(ranges), sum(hi - lo for lo, hi in ranges), False)
        out: dict[int, bytes] = {}
        for run, piece in zip(runs, pieces):
            mv = memoryview(piece)
            bad = set(self.check_run(run[0], mv)[1].tolist())  # one pass over the run
            for k, b in enumerate(run):
                lo, hi = self._span(b)
                data = bytes(mv[k * self.page : k * self.page + hi - lo])
                if b in bad:
                    data = self._get([(lo, hi)])[0]
                    count(1, hi - lo, True)
                    if not self.intact(b, data):
                        raise FormatError(
                            f"{self.url}: {self.key} bytes {lo}..{hi} (check page {b}) fail "
                            f"their checksum (stored {int(self.table[b]):#018x}, got "
                            f"{stripe_digest(data):#018x}): the object is corrupt; "
                            "rebuild the store"
                        )
                out[b] = data
        return out

    def fetch_run(self, lo: int, hi: int, count: Count = _no_count) -> tuple[bytes, np.ndarray]:
        """Pages ``[lo, hi)`` back to back in one range request, verified (the whole run fetched
        once more on a bad page), and their XXH64 digests."""
        a, b = self._span(lo)[0], self._span(hi - 1)[1]
        for attempt in range(2):
            data = self._get([(a, b)])[0]
            count(1, b - a, attempt > 0)
            digests, bad = self.check_run(lo, data)
            if not bad.size:
                return data, digests
        raise FormatError(
            f"{self.url}: {self.key} bytes {a}..{b} (check pages {bad[:5].tolist()}) fail their "
            "checksum twice: the object is corrupt; rebuild the store"
        )


class ChunkSource:
    """The inner chunks of the token array ``layout`` of a remote sharded Zarr store, one page
    each: the objects are ``transport``'s keys under ``data`` (sizes in ``objects``), the shard
    indexes kept in the local folder ``kept``."""

    digests = False
    """:meth:`fetch_run` returns no digests (the node cache computes its own)."""

    def __init__(
        self, transport: Transport, data: str, objects: dict[str, int], layout: ShardLayout,
        kept: Path,
    ) -> None:  # fmt: skip
        self.transport, self.url, self.data, self.objects = transport, transport.url, data, objects
        self.itemsize = layout.dtype.itemsize
        self.page = layout.inner * self.itemsize
        self.nbytes = layout.count * self.itemsize
        self._local = threading.local()
        self._pool = PerProcess(self._make_pool)  # a forked child: the parent's threads are gone
        self.reader = self.make_reader("tokens", layout, kept)
        """The token array's :class:`ShardReader` (its shard indexes fetched once)."""

    def warm(self) -> None:
        """Nothing to compile (the checks are crc32c and zstd, not numba kernels)."""

    def _make_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.transport.max_concurrency, thread_name_prefix="mmpack-zarr")

    # ------------------------------------------------------------------------------ requests
    def make_reader(self, name: str, layout: ShardLayout, kept: Path) -> ShardReader:
        """A :class:`ShardReader` of array ``name`` (its shard indexes kept in ``kept``)."""

        def index_range(s: int) -> tuple[int, int]:
            size = self.objects[f"{name}/{layout.key(s)}"]
            return max(0, size - layout.index_nbytes), size

        def fetch(requests: Any) -> list[list[bytes]]:
            return self.request([(f"{name}/{layout.key(s)}", r) for s, r in requests])

        return ShardReader(layout, fetch, index_range, f"{self.url}/{self.data}{name}", kept)

    def request(self, tasks: list[tuple[str, list[tuple[int, int]]]]) -> list[list[bytes]]:
        """Byte ranges of several objects (keys under the data prefix), all requests at once
        (one per range, ``max_concurrency`` at a time), counted to the calling thread's
        ``count``."""
        flat = [(self.data + key, r) for key, ranges in tasks for r in ranges]
        count, again = getattr(self._local, "count", None) or (_no_count, False)
        count(len(flat), sum(hi - lo for _, (lo, hi) in flat), again)
        try:
            if len(flat) == 1:
                got = [self.transport.get_ranges(flat[0][0], [flat[0][1]])[0]]
            else:
                pool = self._pool.get()
                futures = [pool.submit(self.transport.get_ranges, k, [r]) for k, r in flat]
                got = [f.result()[0] for f in futures]
        except ObjectMissing:
            raise StateMismatchError(
                f"{self.url}: a shard of {self.data} is gone: the store was rebuilt or deleted "
                "after it was opened; open it again"
            ) from None
        out: list[list[bytes]] = []
        at = 0
        for _, ranges in tasks:
            out.append(got[at : at + len(ranges)])
            at += len(ranges)
        return out

    def verified(
        self, reader: ShardReader, ids: np.ndarray, count: Count = _no_count
    ) -> dict[int, np.ndarray]:
        """``reader.chunks(ids)``, decoded; a chunk or index failing its checksum is fetched once
        more (a bad transfer), then the FormatError stands."""
        try:
            self._local.count = (count, False)
            try:
                return reader.chunks(ids)
            except FormatError:
                reader._indexes.clear()
                self._local.count = (count, True)
                return reader.chunks(ids)
        finally:
            self._local.count = None

    # ------------------------------------------------------------------------------ pages
    def _bytes(self, b: int, chunk: np.ndarray) -> np.ndarray:
        """Chunk ``b``'s tokens as its page's bytes (the last page cut at the array's end)."""
        return chunk.view(np.uint8)[: self.nbytes - b * self.page]

    def fetch(self, ids: list[int], count: Count = _no_count) -> dict[int, np.ndarray]:
        """Pages ``ids`` (sorted): their chunks fetched, verified and decoded, as bytes
        (uint8 arrays, read-only)."""
        got = self.verified(self.reader, np.asarray(ids, np.int64), count)
        return {b: self._bytes(b, got[b]) for b in ids}

    def fetch_run(self, lo: int, hi: int, count: Count = _no_count) -> tuple[np.ndarray, None]:
        """Pages ``[lo, hi)`` back to back (their chunks in merged range requests per shard),
        verified and decoded."""
        got = self.fetch(list(range(lo, hi)), count)
        return np.concatenate([got[b] for b in range(lo, hi)]), None
