"""Stores on object storage (``s3://``, ``gs://``, ``az://``, ``file://``); its modules::

    transport.py   make_transport(url): the transport of a URL
    protocol.py    the Transport interface: ranged GETs (concurrent), PUT, list, delete; retries
    s3.py          S3Transport: S3 responses to errors, multipart uploads, listing
    local.py       LocalTransport (file://)
    _s3http.py     the fork-safe S3 client (SigV4 over urllib3, pools per process)
    _obstore.py    gs://, az:// through obstore (refused in a forked child of a user)
    cache.py       the node cache: one sparse mapped file per object, limit, LRU eviction,
                   the bounded lock, faults read around with one warning
    cachefile.py   one cached object: its mapping, page states and digests, claims (OFD
                   locks), writes, the per-reader check of pages before they are served
    cached.py      CachedObject: one reader's mapping of an object's cache file (per process)
    sources.py     page sources: a memmap object's checked pages, a Zarr store's chunks
    fetcher.py     PageFetcher: a source's pages through the node cache's claims
    spans.py       SpanFetcher: whole token spans into the node cache in parts; pins, drops
    backend.py     RemoteBackend: open (the memmap layout's objects), verify
    pages.py       check-page arithmetic: ranges to pages, runs, gathering
    zarr.py        RemoteZarrBackend: open (a sharded Zarr store's objects), verify
    base.py        RemoteStoreBackend: what both backends share, reads through PageFetcher
    opener.py      open_url: mmpack.open(url); writer.py: RemoteStoreWriter, build then upload
    upload.py      upload, upload_zarr: objects under a fresh data-* prefix, metadata last

Registered in :mod:`mmpack._src.store.registry` on import (the ``"url"`` opener and writer).
"""

from __future__ import annotations

from mmpack._src.store.registry import register_opener, register_writer

__all__: list[str] = []

register_opener("url", "mmpack._src.remote.opener:open_url")
register_writer("url", "mmpack._src.remote.writer:RemoteStoreWriter")
