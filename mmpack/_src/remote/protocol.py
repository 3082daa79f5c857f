"""The transport protocol: objects under one URL prefix, the options, the retries and the faults.

Owns :class:`Transport` (the public calls, each retried, over the primitives a scheme
implements: ``_get`` whole or ranged, ``_size``, ``_put`` of bytes or a file, ``_list``,
``_delete``), :class:`ObjectMissing`, :func:`split_url`, the storage options every transport
takes (``retries``, ``retry_backoff``, ``connect_timeout``, ``read_timeout``,
``max_concurrency``, ``merge_gap_bytes``) and ``_Transient``, the failure worth retrying.

Retries: a primitive that raises ``_Transient`` (connection error, timeout, 429, 5xx, short
read) is called again up to ``retries`` times after ``retry_backoff * 2**(attempt - 1)`` seconds,
jittered by a factor in [0.5, 1.5); then one :class:`~mmpack.errors.RemoteError` names the URL.
Any other exception passes through at once.  Cost: a failing call waits at most
``retry_backoff * (2**retries - 1) * 1.5`` seconds (2.25 s with the defaults) before it raises.
"""

from __future__ import annotations

import functools
import importlib
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmpack.errors import MissingDependencyError, RemoteError

__all__ = ["OPTION_DEFAULTS", "ObjectMissing", "Transport", "require_client", "split_url"]

OPTION_DEFAULTS = {
    "retries": 4,
    "retry_backoff": 0.1,
    "connect_timeout": 5.0,
    "read_timeout": 30.0,
    "max_concurrency": 64,
    "merge_gap_bytes": 128 << 10,
}
"""The storage options of every transport, and their defaults."""


class ObjectMissing(FileNotFoundError):
    """The bucket or key does not exist (mapped by callers to the error of what was missing;
    a ``FileNotFoundError`` naming the URL should one slip through)."""

    def __init__(self, url: str, code: str) -> None:
        super().__init__(f"{url}: {code}")
        self.url = url
        self.code = code


def require_client(module: str, url: str) -> None:
    """Import ``module``, the client a transport of ``url`` needs (``urllib3``, ``obstore``);
    a :class:`~mmpack.errors.MissingDependencyError` naming the ``remote`` extra if it is not
    installed."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            f"{url}: object storage needs {module}, which is not installed", module, "remote"
        ) from None


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket or host, prefix without slashes)``; ``ValueError`` for a bad URL."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url!r}: file URLs name a local path (file:///path)")
        return scheme, "", urllib.parse.unquote(parts.path).rstrip("/")
    if not parts.netloc:
        raise ValueError(f"{url!r} names no bucket ({scheme}://bucket/prefix/name)")
    prefix = parts.path.strip("/")
    if not prefix:
        raise ValueError(f"{url!r} names a bucket but no store inside it ({scheme}://bucket/name)")
    return scheme, parts.netloc, prefix


class Transport:
    """Objects under one URL prefix.  Subclasses implement the ``_`` methods; retries here."""

    url: str

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url = url.rstrip("/")
        opts = dict(OPTION_DEFAULTS)
        for k in OPTION_DEFAULTS:
            if k in options and options[k] is not None:
                opts[k] = options[k]
        self.retries = int(opts["retries"])
        self.retry_backoff = float(opts["retry_backoff"])
        self.connect_timeout = float(opts["connect_timeout"])
        self.read_timeout = float(opts["read_timeout"])
        self.max_concurrency = int(opts["max_concurrency"])
        self.merge_gap_bytes = int(opts["merge_gap_bytes"])
        if self.retries < 0 or self.max_concurrency < 1 or self.merge_gap_bytes < 0:
            raise ValueError(
                f"storage_options retries={self.retries!r} and merge_gap_bytes="
                f"{self.merge_gap_bytes!r} must be >= 0, max_concurrency="
                f"{self.max_concurrency!r} >= 1"
            )

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    # ------------------------------------------------------------------------- retried calls
    def _retry(self, key: str, fn: Callable[[], Any]) -> Any:
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff * 2 ** (attempt - 1) * (0.5 + random.random()))
            try:
                return fn()
            except _Transient as exc:
                last = exc
        raise RemoteError(
            f"{self.key_url(key)}: failed after {self.retries + 1} attempts ({last}); "
            "is the object store reachable?"
        ) from None

    def get(self, key: str) -> bytes:
        """The whole object."""
        return self._retry(key, lambda: self._get(key, None))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges ``[start, end)`` of one object, fetched concurrently."""
        return self._get_many(key, ranges)

    def _get_many(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self._retry(key, functools.partial(self._get, key, r)) for r in ranges]

    def size(self, key: str) -> int:
        return self._retry(key, lambda: self._size(key))

    read_only = False
    """True for plain ``https://`` locations: GET and HEAD only."""

    def _writable(self) -> None:
        if self.read_only:
            raise ValueError(
                f"{self.url}: plain http(s) locations are read-only; build to "
                "s3://, gs://, az:// or file://"
            )

    def put(self, key: str, data: bytes) -> None:
        self._writable()
        self._retry(key, lambda: self._put(key, data, None))

    def put_file(self, key: str, path: Path, on_bytes: Callable[[int], None] | None = None) -> None:
        """PUT the local file ``path`` as ``key``; ``on_bytes`` is told the bytes sent as they
        are acknowledged (a progress bar)."""
        self._writable()
        self._retry(key, lambda: self._put(key, None, path))
        if on_bytes is not None:
            on_bytes(path.stat().st_size)

    def list_prefix(self, prefix: str = "") -> list[tuple[str, int, float]]:
        """``(key, size, mtime)`` of every object whose key starts with ``prefix``."""
        self._writable()
        return self._retry(prefix, lambda: self._list(prefix))

    def delete(self, keys: Sequence[str]) -> None:
        self._writable()
        for key in keys:
            self._retry(key, functools.partial(self._delete, key))

    def missing_code(self, exc: ObjectMissing) -> str:
        """``"NoSuchBucket"`` only if a HEAD of the bucket confirms it is absent, else
        ``"NoSuchKey"`` (a server may answer NoSuchBucket for a bucket still being created)."""
        return (
            exc.code
            if exc.code != "NoSuchBucket"
            else ("NoSuchBucket" if self._retry("", self._bucket_missing) else "NoSuchKey")
        )

    def _bucket_missing(self) -> bool:
        return False

    # ------------------------------------------------------------------------- primitives
    def _get(self, key: str, rng: tuple[int, int] | None) -> bytes:
        raise NotImplementedError

    def _size(self, key: str) -> int:
        raise NotImplementedError

    def _put(self, key: str, data: bytes | None, path: Path | None) -> None:
        raise NotImplementedError

    def _list(self, prefix: str) -> list[tuple[str, int, float]]:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError


class _Transient(Exception):
    """A failure worth retrying (connection, timeout, throttling, 5xx)."""
