"""Uploading a local sharded Zarr store to object storage as a remote Zarr store.

The objects go under a fresh ``data-*`` prefix (four PUTs at a time, one per shard: a shard is at
most 32 MiB), then ``mmpack.json`` -- the commit marker, carrying the arrays' metadata and every
shard's size -- is written last, so an interrupted upload is never taken for a store; the previous
generation's objects are removed after the commit (a failure there is a warning, and the next
build of the same target removes them).  The layout is described in
:mod:`mmpack.store.remote.zarr`, which reads it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mmpack.store.backends._zarr_shards import parse_layout
from mmpack.store.remote.transport import Transport
from mmpack.store.remote.zarr import LAYOUT

__all__ = ["upload_zarr"]


def upload_zarr(
    local: Path,
    transport: Transport,
    url: str,
    *,
    overwrite: bool,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """Upload the local sharded Zarr store at ``local`` to ``url`` (objects under a fresh
    ``data-*`` prefix, then ``mmpack.json``); returns it opened remotely."""
    from mmpack.store.reader import open_store
    from mmpack.store.remote.writer import commit_generation, new_generation

    group = json.loads((local / "zarr.json").read_text())
    raw = dict(group["attributes"]["mmpack"])
    arrays = {n: json.loads((local / n / "zarr.json").read_text()) for n in ("tokens", "offsets")}
    for n, a in arrays.items():
        if parse_layout(a) is None:
            raise ValueError(f"{local}/{n}: not the sharded Zarr layout; rebuild it")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    rel = {p: p.relative_to(local).as_posix() for p in files}
    previous, gen = new_generation(transport)
    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(transport.put_file, f"{gen}/{rel[p]}", p) for p in files]:
            f.result()
    raw["remote"] = {
        "data": gen,
        "layout": LAYOUT,
        "arrays": arrays,
        "objects": {
            rel[p]: p.stat().st_size
            for p in files
            if rel[p].split("/")[0] in ("tokens", "offsets") and p.name != "zarr.json"
        },
    }
    objects = [f"{gen}/{rel[p]}" for p in files]
    commit_generation(transport, url, raw, gen, previous, objects, overwrite=overwrite)
    return open_store(url, storage_options=storage_options)
