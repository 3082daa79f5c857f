"""``mmpack.open(url)``: the ``"url"`` opener of :data:`mmpack._src.store.registry.OPENERS`.

Reads ``URL/mmpack.json`` (one GET; a missing one is :class:`~mmpack.errors.StoreNotFoundError`,
whatever data objects an interrupted upload left), validates it, and builds a
:class:`~mmpack._src.remote.backend.RemoteBackend` under a local folder keyed by the store's
fingerprint, where its index, check table and packing plans live.

The node cache: ``cache_limit`` bytes under ``cache_dir``; without one, two windows of the
block-window order at the defaults (:data:`~mmpack._src.core.constants.NODE_CACHE_BYTES`, 2 GiB),
so that the loader's whole-block fetch works without a flag, where the cache folder can be
written (one small file created and removed probes it); where it cannot, none (the pages read
are fetched and served from memory) and one warning.  ``cache_limit=0`` keeps none.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mmpack._src.core.constants import NODE_CACHE_BYTES
from mmpack._src.remote.backend import RemoteBackend
from mmpack._src.remote.cache import PageCache, warn_once
from mmpack._src.remote.transport import ObjectMissing, Transport, make_transport
from mmpack._src.store.format import META_FILE, StoreMeta
from mmpack.errors import FormatError, StoreNotFoundError

__all__ = ["node_cache", "open_record", "open_url"]


def _default_cache_dir() -> Path:
    """``$MMPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/mmpack``, else ``~/.cache/mmpack``."""
    if os.environ.get("MMPACK_CACHE_DIR"):
        return Path(os.environ["MMPACK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmpack"


def open_url(
    location: str,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    format: str | None = None,
) -> Any:
    """Open the store at URL ``location`` (``mmpack.open(url, ...)``).

    Parameters
    ----------
    location : str
        ``s3://bucket/prefix/name``, ``gs://...``, ``az://...`` or ``file:///path``.
    storage_options : dict, optional
        ``endpoint``, ``access_key_id``, ``secret_access_key``, ``session_token``, ``region``,
        ``allow_http`` (else the ``AWS_*`` environment variables), and ``retries`` (4),
        ``retry_backoff`` (0.1 s), ``connect_timeout`` (5 s), ``read_timeout`` (30 s),
        ``max_concurrency`` (16 requests), ``client`` (``"http"`` or ``"obstore"``).
    cache_dir : path, optional
        Local folder for the store's index, packing plans and the node cache
        (default :func:`_default_cache_dir`).
    cache_limit : int, optional
        Bytes of fetched pages kept in ``cache_dir`` (the node cache), shared by every process
        on the node; 0 keeps none.  Default :data:`~mmpack._src.core.constants.NODE_CACHE_BYTES`
        (two windows of the block-window order) where ``cache_dir`` can be written, else none
        (with one warning).
    """
    if format not in (None, "mmpack"):
        raise ValueError(f"format={format!r}: remote stores are mmpack's own layout")
    transport = make_transport(location, storage_options)
    root = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    try:
        text = transport.get(META_FILE)
    except ObjectMissing as exc:
        zarr = False
        code = transport.missing_code(exc)
        if code != "NoSuchBucket":
            try:
                transport.size("zarr.json")
                zarr = True
            except ObjectMissing:
                pass
        if zarr:
            raise FormatError(
                f"{location}: a Zarr group without mmpack.json (copied, not built remotely); "
                "build it with mmpack.build(url, docs, backend='zarr')"
            ) from None
        what = (
            "the bucket does not exist"
            if code == "NoSuchBucket"
            else f"{transport.key_url(META_FILE)} does not exist"
        )
        raise StoreNotFoundError(
            f"no mmpack store at {location!r}: {what} (an interrupted upload leaves no store)"
        ) from None
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{transport.key_url(META_FILE)} is not valid JSON: {exc}") from None
    return open_record(
        transport,
        raw,
        location,
        storage_options=storage_options,
        cache_dir=root,
        cache_limit=cache_limit,
    )


def open_record(
    transport: Transport,
    raw: Any,
    location: str,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    cache_limit: int | None = None,
) -> Any:
    """The store that the metadata record ``raw`` describes at ``transport``: what
    :func:`open_url` opens once it has read ``mmpack.json``, and what an upload checks before it
    writes that record (:func:`mmpack._src.remote.upload.upload`'s ``check``)."""
    from mmpack._src.store.reader import TokenStore

    root = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    meta = StoreMeta.from_json(raw, location)  # type: ignore[arg-type]
    folder = root / "stores" / meta.fingerprint
    cache = node_cache(root, cache_limit)
    backend: Any
    if meta.backend == "zarr":
        from mmpack._src.remote.zarr import RemoteZarrBackend

        backend = RemoteZarrBackend(transport, meta, raw, folder, cache)
    elif meta.backend == "memmap":
        backend = RemoteBackend(transport, meta, raw, folder, cache)
    else:
        raise FormatError(f"{location}: unknown backend {meta.backend!r}")
    options: dict[str, Any] = {
        "storage_options": storage_options,
        "cache_dir": str(root),
        "cache_limit": cache_limit,
    }
    return TokenStore(
        folder, meta, raw, backend, location=location, cache_dir=folder, open_options=options
    )


def node_cache(root: Path, cache_limit: int | None) -> PageCache | None:
    """The node cache under ``root`` of ``cache_limit`` bytes (None for 0); for None,
    :data:`~mmpack._src.core.constants.NODE_CACHE_BYTES` where ``root/pages`` can be written, else
    None after one warning (:func:`~mmpack._src.remote.cache.warn_once`)."""
    if cache_limit is None:
        folder = root / "pages"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:  # a read-only folder, a full disk: no node cache, as asked before
            warn_once(root, exc)
            return None
        cache_limit = NODE_CACHE_BYTES
    return None if cache_limit == 0 else PageCache(root, cache_limit)
