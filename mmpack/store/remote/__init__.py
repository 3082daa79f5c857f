"""Stores on object storage (``s3://``, ``gs://``, ``az://``, ``file://``).

::

    transport.py   make_transport(url): the transport of a URL
    protocol.py    the Transport interface: ranged GETs (concurrent), PUT, list, delete; retries
    s3.py          S3Transport: S3 responses to errors, multipart uploads, listing
    local.py       LocalTransport (file://)
    _s3http.py     the fork-safe S3 client (SigV4 over urllib3, pools per process)
    _obstore.py    gs://, az:// through obstore (refused in a forked child of a user)
    cache.py       the node cache: one sparse mapped file per object, limit, LRU eviction
    cachefile.py   one cached object: its mapping, block states, claims (OFD locks), writes
    fetcher.py     claims, range requests, verification, memory LRU, look-ahead threads
    backend.py     RemoteBackend: open, the zero-copy hit path, verify
    blocks.py      check-block arithmetic: ranges to blocks, runs, CRCs
    opener.py      open_url: mmpack.open(url)
    writer.py      RemoteStoreWriter / upload: build locally, upload, metadata last

``mmpack.open(url)`` reaches :func:`~mmpack.store.remote.opener.open_url` through the ``"url"``
entry of :data:`mmpack.store.reader.OPENERS`; ``mmpack.build(url, ...)`` uses
:class:`~mmpack.store.remote.writer.RemoteStoreWriter`.  Fork safety: the S3 client keeps its
connection and thread pools per process (keyed by ``os.getpid()``), so DataLoader workers work
under fork and spawn; obstore (gs://, az://) is refused with a clear error in a forked child of
a process that used it.
"""

from __future__ import annotations

__all__: list[str] = []
