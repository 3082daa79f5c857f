"""A bounded block cache on local disk, shared by every process of a node.

Layout under ``cache_dir``::

    blocks/<fingerprint>-<block>.blk   one verified check block (16 KiB by default) per file
    blocks/.usage                      the bytes the block files hold (text), kept under the lock
    blocks/.lock                       ``fcntl.flock`` serializing inserts and evictions

Reads take no lock: a block file is written to a temporary name and renamed into place
(``os.replace``), so a reader sees a whole block or none, and a reader still holding a file that
is evicted keeps its open copy.  Inserts take the lock once per batch, add the batch's size to
``.usage`` and, when that would pass ``limit``, first evict the least recently used files (file
mtime; a hit touches it) until the batch fits in 90% of the limit; an eviction pass recounts the
folder, so a ledger a crashed process left stale heals.  The total never exceeds ``limit``
(temporary files included: they are written under the lock, after the reservation).  Blocks are
checked again when read (size and CRC-32): the cache holds no unverified byte.

No duplicate downloads: before fetching, a process claims each missing block with an
``O_EXCL`` marker file (``<fingerprint>-<block>.fetching``); a block another process has
claimed is awaited in the cache (polling, up to the read timeout) instead of fetched again, and
fetched after all if its marker disappears without the block or is older than 30 s (a fetch
that died).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["BlockCache"]

_CLAIM_SECONDS = 30.0  # a marker older than this belongs to a fetch that died
_TOUCH_SECONDS = 60.0  # a hit refreshes a block's mtime when it is older than this


class BlockCache:
    """Blocks of verified bytes on disk, total size at most ``limit`` bytes."""

    def __init__(self, root: Path, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache_limit must be a non-negative integer (bytes), got {limit!r}")
        self.root = Path(root) / "blocks"
        self.limit = limit
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, fingerprint: str, block: int) -> Path:
        return self.root / f"{fingerprint}-{block}.blk"

    def get(self, fingerprint: str, block: int) -> bytes | None:
        path = self._path(fingerprint, block)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                data = os.read(fd, st.st_size)
            finally:
                os.close(fd)
            if time.time() - st.st_mtime > _TOUCH_SECONDS:  # LRU-ish: recency to a minute
                os.utime(path)
        except OSError:
            return None
        return data

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _usage(self) -> int:
        try:
            return int((self.root / ".usage").read_text() or 0)
        except (OSError, ValueError):
            return self._recount()

    def _set_usage(self, value: int) -> None:
        tmp = self.root / f".usage.{os.getpid()}"
        tmp.write_text(str(value))
        os.replace(tmp, self.root / ".usage")

    def _files(self) -> list[tuple[float, int, Path]]:
        out = []
        for entry in os.scandir(self.root):
            if entry.name.endswith(".blk"):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, Path(entry.path)))
        return out

    def _recount(self) -> int:
        return sum(size for _, size, _ in self._files())

    def usage(self) -> int:
        """Bytes held by block files now (a directory scan)."""
        return self._recount()

    def put_many(self, fingerprint: str, blocks: dict[int, bytes]) -> None:
        """Store verified blocks; those that cannot fit under the limit are not kept."""
        if self.limit == 0 or not blocks:
            return
        items = [(b, d) for b, d in blocks.items() if len(d) <= self.limit]
        with self._locked():
            used = self._usage()
            need = sum(len(d) for _, d in items)
            if used + need > self.limit:
                used = self._evict(target=max(0, int(self.limit * 0.9) - need))
                while items and used + need > self.limit:  # a batch larger than the cache
                    need -= len(items.pop()[1])
            for b, data in items:
                path = self._path(fingerprint, b)
                if path.exists():
                    need -= len(data)
                    continue
                tmp = path.with_name(f".{path.name}.{os.getpid()}")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, path)
                except OSError:
                    tmp.unlink(missing_ok=True)
                    need -= len(data)
            self._set_usage(used + need)

    # ------------------------------------------------------------------ no duplicate downloads
    def claim(self, fingerprint: str, blocks: list[int]) -> tuple[list[int], list[int]]:
        """Split ``blocks`` into those this process fetches (an ``O_EXCL`` marker file created)
        and those another process is fetching now (a marker younger than ``_CLAIM_SECONDS``)."""
        mine: list[int] = []
        theirs: list[int] = []
        now = time.time()
        for b in blocks:
            marker = self.root / f"{fingerprint}-{b}.fetching"
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                mine.append(b)
            except FileExistsError:
                try:
                    fresh = now - marker.stat().st_mtime < _CLAIM_SECONDS
                except OSError:
                    fresh = False
                (theirs if fresh else mine).append(b)
            except OSError:
                mine.append(b)
        return mine, theirs

    def release(self, fingerprint: str, blocks: list[int]) -> None:
        for b in blocks:
            with contextlib.suppress(OSError):
                (self.root / f"{fingerprint}-{b}.fetching").unlink()

    def wait_for(self, fingerprint: str, blocks: list[int], timeout: float) -> dict[int, bytes]:
        """The blocks another process fetches, as they land (polling); those that do not
        appear within ``timeout`` (or whose fetch was abandoned) are left out."""
        out: dict[int, bytes] = {}
        todo = list(blocks)
        deadline = time.monotonic() + timeout
        delay = 0.001
        while todo:
            for b in list(todo):
                data = self.get(fingerprint, b)
                if data is not None:
                    out[b] = data
                    todo.remove(b)
                elif not (self.root / f"{fingerprint}-{b}.fetching").exists():
                    data = self.get(fingerprint, b)  # landed just now, or abandoned
                    if data is not None:
                        out[b] = data
                    todo.remove(b)
            if not todo or time.monotonic() > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return out

    def _evict(self, target: int) -> int:
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= target:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size
        return total
