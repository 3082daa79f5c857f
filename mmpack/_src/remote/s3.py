"""The S3 transport: object calls over the fork-safe SigV4 client, S3 answers mapped to faults.

Owns :class:`S3Transport` (``s3://bucket/prefix``, and ``https://`` read-only through the same
client, unsigned), the mapping of S3 answers to errors, multipart uploads and the
ListObjectsV2 paging.  The signing and the connection pools are :mod:`mmpack._src.remote._s3http`.

Faults: connection errors, timeouts, 408, 429 and 5xx are ``_Transient`` (retried by
:class:`~mmpack._src.remote.protocol.Transport`); 401/403 a
:class:`~mmpack.errors.RemoteAccessError`; 404 :class:`ObjectMissing` with S3's code; any other
status >= 300 a :class:`~mmpack.errors.RemoteError`.  A ranged GET shorter than asked is
transient.  Cost: one request per call; ranges of one object go out concurrently on the client's
pool (``max_concurrency``); a file above ``multipart_threshold`` (256 MiB) is uploaded in parts of
``multipart_chunk`` (64 MiB), 4 at a time; a listing costs one request per 1000 keys.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmpack._src.remote.protocol import ObjectMissing, Transport, _Transient, require_client
from mmpack.errors import RemoteAccessError, RemoteError

__all__ = ["S3Transport"]

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses retried as transient."""


class S3Transport(Transport):
    def __init__(self, url: str, bucket: str, prefix: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        require_client("urllib3", url)
        from mmpack._src.remote._s3http import S3Config, S3Http

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

    def put_file(self, key: str, path: Path, on_bytes: Callable[[int], None] | None = None) -> None:
        self._writable()
        size = path.stat().st_size
        if size <= self.multipart_threshold:
            return super().put_file(key, path, on_bytes)
        return self._put_multipart(key, path, size, on_bytes)

    def _put_multipart(
        self, key: str, path: Path, size: int, on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """Multipart upload (parts of ``multipart_chunk`` bytes, 4 at a time, each retried);
        aborted on failure, so no part is left billed and nothing becomes visible.  Each part
        sent is told to ``on_bytes``."""
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
            if on_bytes is not None:
                on_bytes(len(data))
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
