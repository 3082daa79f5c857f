"""A bounded block cache on local disk, shared by every process of a node.

Layout under ``cache_dir``::

    blocks/<fingerprint>-<block>.blk   one verified check block (64 KiB by default) per file
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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["BlockCache"]


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
            with open(path, "rb") as f:
                data = f.read()
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
