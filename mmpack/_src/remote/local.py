"""The ``file://`` transport: objects as files under a folder (tests, NFS).

Owns :class:`LocalTransport`: ranged reads with ``os.pread`` (a short read is a
:class:`~mmpack.errors.RemoteError`: the object is truncated), writes to a per-process temporary
name renamed into place (atomic on one file system), a listing by walking the folder (sorted),
deletes that ignore a missing file.  Cost: one system call or two per call; a listing stats
every file under the root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmpack._src.remote.protocol import ObjectMissing, Transport
from mmpack.errors import RemoteError

__all__ = ["LocalTransport"]


class LocalTransport(Transport):
    def __init__(self, url: str, root: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.root = Path(root)

    def _get(self, key: str, rng: tuple[int, int] | None) -> bytes:
        try:
            with open(self.root / key, "rb") as f:
                if rng is None:
                    return f.read()
                data = os.pread(f.fileno(), rng[1] - rng[0], rng[0])
        except FileNotFoundError:
            raise ObjectMissing(self.key_url(key), "NoSuchKey") from None
        if len(data) != rng[1] - rng[0]:
            raise RemoteError(
                f"{self.key_url(key)}: short read of range {rng} "
                f"({len(data)} bytes): the object is truncated"
            )
        return data

    def _size(self, key: str) -> int:
        try:
            return (self.root / key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(self.key_url(key), "NoSuchKey") from None

    def _put(self, key: str, data: bytes | None, path: Path | None) -> None:
        import shutil

        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part-{os.getpid()}")
        if path is not None:
            shutil.copyfile(path, tmp)
        else:
            tmp.write_bytes(data or b"")
        os.replace(tmp, target)

    def _list(self, prefix: str) -> list[tuple[str, int, float]]:
        out: list[tuple[str, int, float]] = []
        if not self.root.is_dir():
            return out
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    st = p.stat()
                    out.append((key, st.st_size, st.st_mtime))
        return out

    def _delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)
