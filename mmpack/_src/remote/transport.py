"""Object access for remote stores: whole and ranged GETs, PUTs, listing, deletion, per URL scheme.

``make_transport(url, storage_options)`` returns a :class:`Transport` rooted at the store's
prefix; keys are relative to it (``"mmpack.json"``, ``"data-<id>/tokens.bin"``):

- ``s3://bucket/prefix`` -> :class:`S3Transport`: the fork-safe SigV4 client of
  :mod:`mmpack._src.remote._s3http` (the default, and the only one tested against a server);
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
:class:`~mmpack.errors.RemoteAccessError`; a missing bucket or key is :class:`ObjectMissing`.
This module owns the choice by scheme; the transports live in :mod:`~mmpack._src.remote.protocol`,
:mod:`~mmpack._src.remote.s3`, :mod:`~mmpack._src.remote.local` and :mod:`~mmpack._src.remote._obstore`.
"""

from __future__ import annotations

from typing import Any

from mmpack._src.remote.local import LocalTransport
from mmpack._src.remote.protocol import (
    OPTION_DEFAULTS,
    ObjectMissing,
    Transport,
    split_url,
)
from mmpack._src.remote.s3 import S3Transport

__all__ = [
    "LocalTransport",
    "ObjectMissing",
    "S3Transport",
    "Transport",
    "make_transport",
    "split_url",
]


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
        plain = {k: v for k, v in options.items() if k in OPTION_DEFAULTS or k == "allow_http"}
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
        from mmpack._src.remote._obstore import ObstoreTransport

        return ObstoreTransport(url, options)
    raise ValueError(
        f"{url!r}: unsupported scheme {scheme!r} (s3://, gs://, az://, file://, https://)"
    )
