"""Object access for remote stores: whole and ranged GETs, PUTs, listing, deletion, per URL scheme.

``make_transport(url, storage_options)`` returns a :class:`Transport` rooted at the store's
prefix; keys are relative to it (``"mmpack.json"``, ``"data-<id>/tokens.bin"``):

- ``s3://bucket/prefix`` -> :class:`S3Transport`: the fork-safe SigV4 client of
  :mod:`mmpack.store.remote._s3http` (the default, and the only one tested against a server);
- ``file:///path`` -> :class:`LocalTransport`: ``os.pread`` and atomic renames (tests, NFS);
- ``https://host/path`` (``http://`` with ``allow_http``) -> the S3 transport, unsigned and
  read-only (any web server that honours ``Range``);
- ``gs://``, ``az://`` (and ``s3://`` with ``storage_options={"client": "obstore"}``) ->
  :class:`ObstoreTransport`, through obstore's own constructors.  obstore is not fork-safe:
  a process that used it and then forks gets a clear ``RuntimeError`` in the child instead of a
  hang (use ``multiprocessing_context="spawn"`` for DataLoader workers there).

Faults: connection errors, timeouts, 429 and 5xx are retried ``retries`` times with exponential
backoff (``retry_backoff`` * 2**attempt, jittered), then raised as one
:class:`~mmpack.errors.RemoteError` naming the URL; 403 is a
:class:`~mmpack.errors.RemoteAccessError`; a missing bucket or key is :class:`ObjectMissing`
(the caller turns it into the right error for what was missing).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmpack.errors import RemoteAccessError, RemoteError

__all__ = ["ObjectMissing", "Transport", "make_transport", "split_url"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_OPTION_DEFAULTS = {
    "retries": 4,
    "retry_backoff": 0.1,
    "connect_timeout": 5.0,
    "read_timeout": 30.0,
    "max_concurrency": 16,
}


class ObjectMissing(FileNotFoundError):
    """The bucket or key does not exist (mapped by callers to the error of what was missing;
    a ``FileNotFoundError`` naming the URL should one slip through)."""

    def __init__(self, url: str, code: str) -> None:
        super().__init__(f"{url}: {code}")
        self.url = url
        self.code = code


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
        opts = dict(_OPTION_DEFAULTS)
        for k in _OPTION_DEFAULTS:
            if k in options and options[k] is not None:
                opts[k] = options[k]
        self.retries = int(opts["retries"])
        self.retry_backoff = float(opts["retry_backoff"])
        self.connect_timeout = float(opts["connect_timeout"])
        self.read_timeout = float(opts["read_timeout"])
        self.max_concurrency = int(opts["max_concurrency"])
        if self.retries < 0 or self.max_concurrency < 1:
            raise ValueError(
                f"storage_options retries={self.retries!r} must be >= 0 and "
                f"max_concurrency={self.max_concurrency!r} >= 1"
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

    def put_file(self, key: str, path: Path) -> None:
        self._writable()
        self._retry(key, lambda: self._put(key, None, path))

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


# ------------------------------------------------------------------------------------ S3
class S3Transport(Transport):
    def __init__(self, url: str, bucket: str, prefix: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        from mmpack.store.remote._s3http import S3Config, S3Http

        self.prefix = prefix
        self.multipart_threshold = int(options.get("multipart_threshold", 256 << 20))
        self.multipart_chunk = int(options.get("multipart_chunk", 64 << 20))
        if self.multipart_chunk < 5 << 20:
            raise ValueError(
                f"storage_options multipart_chunk={self.multipart_chunk} is below "
                "S3's 5 MiB minimum part size"
            )
        self.http = S3Http(
            bucket,
            S3Config(options),
            max_concurrency=self.max_concurrency,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
        )

    def _full(self, key: str) -> str:
        if not self.prefix:
            return key
        return f"{self.prefix}/{key}" if key else self.prefix

    def _call(self, method: str, key: str | None, **kw: Any) -> Any:
        import urllib3

        try:
            resp = self.http.request(method, self._full(key) if key is not None else "", **kw)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        if resp.status in _RETRY_STATUS:
            raise _Transient(f"HTTP {resp.status} {_s3_code(resp.data)}")
        if resp.status in (401, 403):
            code = _s3_code(resp.data) or "AccessDenied"
            raise RemoteAccessError(
                f"{self.key_url(key or '')}: the object store refused the request ({code}); "
                "check the credentials (storage_options or AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY)"
            )
        if resp.status == 404:
            raise ObjectMissing(self.key_url(key or ""), _s3_code(resp.data) or "NoSuchKey")
        if resp.status >= 300:
            raise RemoteError(
                f"{self.key_url(key or '')}: HTTP {resp.status} "
                f"{_s3_code(resp.data)} {resp.data[:200]!r}"
            )
        return resp

    def _get(self, key: str, rng: tuple[int, int] | None) -> bytes:
        headers = {} if rng is None else {"Range": f"bytes={rng[0]}-{rng[1] - 1}"}
        data = self._call("GET", key, headers=headers).data
        if rng is not None and len(data) != rng[1] - rng[0]:
            raise _Transient(f"short read: {len(data)} bytes for range {rng}")
        return data

    def _get_many(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if len(ranges) <= 1:
            return super()._get_many(key, ranges)
        futures = [
            self.http.executor.submit(self._retry, key, functools.partial(self._get, key, r))
            for r in ranges
        ]
        return [f.result() for f in futures]

    def _size(self, key: str) -> int:
        return int(self._call("HEAD", key).headers.get("Content-Length", -1))

    def put_file(self, key: str, path: Path) -> None:
        self._writable()
        size = path.stat().st_size
        if size <= self.multipart_threshold:
            return super().put_file(key, path)
        return self._put_multipart(key, path, size)

    def _put_multipart(self, key: str, path: Path, size: int) -> None:
        """Multipart upload (parts of ``multipart_chunk`` bytes, 4 at a time, each retried);
        aborted on failure, so no part is left billed and nothing becomes visible."""
        body = self._retry(key, lambda: self._call("POST", key, query={"uploads": ""}).data)
        upload_id = _xml(body.decode(), "UploadId")
        if not upload_id:
            raise RemoteError(f"{self.key_url(key)}: no UploadId in {body[:200]!r}")
        chunk = self.multipart_chunk

        def part(n: int) -> str:
            with open(path, "rb") as f:
                f.seek((n - 1) * chunk)
                data = f.read(chunk)
            resp = self._retry(
                key,
                lambda: self._call(
                    "PUT", key, query={"partNumber": str(n), "uploadId": upload_id}, body=data
                ),
            )
            return resp.headers.get("ETag", "")

        from concurrent.futures import ThreadPoolExecutor

        try:
            with ThreadPoolExecutor(4) as pool:
                etags = list(pool.map(part, range(1, -(-size // chunk) + 1)))
            xml = (
                "<CompleteMultipartUpload>"
                + "".join(
                    f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"
                    for n, e in enumerate(etags, 1)
                )
                + "</CompleteMultipartUpload>"
            )
            done = self._retry(
                key,
                lambda: (
                    self._call("POST", key, query={"uploadId": upload_id}, body=xml.encode()).data
                ),
            )
            if b"<Error>" in done:  # S3 may report a failed completion in a 200 body
                raise RemoteError(f"{self.key_url(key)}: multipart upload failed: {done[:300]!r}")
        except BaseException:
            with contextlib.suppress(Exception):  # the original error matters more
                self._call("DELETE", key, query={"uploadId": upload_id})
            raise

    def _put(self, key: str, data: bytes | None, path: Path | None) -> None:
        if path is not None:
            self._call("PUT", key, body_file=(str(path), path.stat().st_size))
        else:
            self._call("PUT", key, body=data)

    def _bucket_missing(self) -> bool:
        try:
            self._call("HEAD", None)
        except ObjectMissing:
            return True
        return False

    def _list(self, prefix: str) -> list[tuple[str, int, float]]:
        out: list[tuple[str, int, float]] = []
        token = None
        full = self._full(prefix)
        while True:
            query = {"list-type": "2", "prefix": full}
            if token:
                query["continuation-token"] = token
            try:
                body = self._call("GET", None, query=query).data.decode()
            except ObjectMissing as exc:
                if self.missing_code(exc) == "NoSuchBucket":
                    raise
                return out  # nothing under this prefix yet
            for m in re.finditer(r"<Contents>(.*?)</Contents>", body, re.DOTALL):
                item = m.group(1)
                key = _xml(item, "Key")
                size = int(_xml(item, "Size") or 0)
                rel = key[len(self.prefix) + 1 :] if self.prefix else key
                out.append((rel, size, _iso_time(_xml(item, "LastModified"))))
            if _xml(body, "IsTruncated") != "true":
                return out
            token = _xml(body, "NextContinuationToken")

    def _delete(self, key: str) -> None:
        try:
            self._call("DELETE", key)
        except ObjectMissing:
            pass


def _xml(text: str, tag: str) -> str:
    m = re.search(f"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    if not m:
        return ""
    import html

    return html.unescape(m.group(1))


def _s3_code(body: bytes) -> str:
    try:
        return _xml(body.decode("utf-8", "replace"), "Code")
    except Exception:
        return ""


def _iso_time(text: str) -> float:
    import datetime as dt

    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# ------------------------------------------------------------------------------------ file://
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


def make_transport(url: str, storage_options: dict[str, Any] | None) -> Transport:
    """The transport for ``url`` (see the module docstring)."""
    options = dict(storage_options or {})
    scheme, bucket, prefix = split_url(url)
    if scheme == "file":
        return LocalTransport(url, prefix, options)
    if scheme == "s3" and options.get("client", "http") == "http":
        return S3Transport(url, bucket, prefix, options)
    if scheme in ("http", "https"):  # read-only: unsigned GET/HEAD through the same client
        first, _, rest = prefix.partition("/")
        plain = {k: v for k, v in options.items() if k in _OPTION_DEFAULTS or k == "allow_http"}
        transport = S3Transport(
            url,
            first,
            rest,
            dict(plain, endpoint=f"{scheme}://{bucket}", access_key_id="", secret_access_key=""),
        )
        transport.read_only = True
        return transport
    if scheme in ("s3", "gs", "az", "abfs", "abfss"):
        if options.get("client", "obstore") != "obstore":
            raise ValueError(
                f"storage_options client={options['client']!r} is not 'http' or 'obstore'"
            )
        from mmpack.store.remote._obstore import ObstoreTransport

        return ObstoreTransport(url, options)
    raise ValueError(
        f"{url!r}: unsupported scheme {scheme!r} (s3://, gs://, az://, file://, https://)"
    )
