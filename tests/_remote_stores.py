"""Remote stores for the object-storage tests: a random corpus, a fresh S3 URL per store, a build
with a chosen check block, and the cache faults (a held lock, a full disk) other suites reuse."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
from _s3 import BUCKET


def _corpus(n_docs: int = 200, seed: int = 0, vocab: int = 50_000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(5.0, 1.2, size=n_docs).astype(int), 0)
    return [rng.integers(0, vocab, size=n) for n in lens]


def _url(name: str = "s") -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/{name}"


def _build_with_page(url, docs, options, page):
    from mmpack._src.remote.writer import RemoteStoreWriter

    with RemoteStoreWriter(url, storage_options=options, check_block_bytes=page) as w:
        w.add_many(docs)
    return w.store


@contextlib.contextmanager
def hold_cache_lock(cache_dir: Path):
    """A process stopped while it holds ``cache_dir``'s lock, for the ``with`` block (killed
    after it, by its pid)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(cache_dir / "pages" / ".lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()  # a stopped process takes SIGKILL
        holder.wait(30)


def full_disk(monkeypatch, root: Path) -> None:
    """Make every write under ``root`` fail with ENOSPC, as on a full disk: creating files
    works, writing bytes into them (``write``, ``pwrite``, ``ftruncate``, ``fallocate``) and
    creating folders does not.  Paths elsewhere are untouched."""
    root_s = str(root.resolve())

    def under(path) -> bool:
        try:
            return os.path.abspath(os.fsdecode(os.fspath(path))).startswith(root_s)
        except TypeError:
            return False

    def fd_under(fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(root_s)
        except OSError:
            return False

    real_open = io.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+") and not isinstance(file, int) and under(file):
            return _FullFile(f)
        return f

    def by_fd(real):
        def call(fd, *args):
            if fd_under(fd):
                raise _enospc(f"fd {fd}")
            return real(fd, *args)

        return call

    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if under(path):
            raise _enospc(path)
        return real_mkdir(path, *args, **kwargs)

    import builtins

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    for name in ("write", "pwrite", "ftruncate", "posix_fallocate"):
        monkeypatch.setattr(os, name, by_fd(getattr(os, name)))
    monkeypatch.setattr(os, "mkdir", mkdir)


# ----------------------------------------------------------------------------- stopped holders
_HOLD = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # stopped while holding the lock (Ctrl-Z, a paused container)
"""


# ----------------------------------------------------------------------------- a full disk
def _enospc(what) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(what))


class _FullFile:
    """A file opened for writing on a full disk: created, every write refused."""

    def __init__(self, f) -> None:
        self._f = f

    def write(self, data):
        raise _enospc(self._f.name)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
