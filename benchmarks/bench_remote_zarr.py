"""Remote Zarr against remote memmap: shuffled batches from S3 (SeaweedFS on loopback) behind a
proxy that adds 10 or 20 ms to every request, against the same batches from a local memmap store.

The same documents are built three ways: a local memmap store (the reference), a remote memmap
store (``mmpack.build(url, docs)``: 16 KiB check pages) and a remote sharded Zarr store
(``mmpack.build(url, docs, backend="zarr")``: 8 KiB inner chunks with crc32c in 32 MiB shards).
For each, the first 48 batches (12 with ``--quick``) of a shuffled epoch of 32 windows (or
packed rows) of 2048 tokens are read by a fresh reader.  The process's decoded-chunk LRU is
cleared before each Zarr run, so every run starts cold (shard indexes included).

Columns: ``Mtok/s`` tokens served per second, ``vs local`` the ratio to the local memmap run,
``fetched/served`` bytes moved from the store per byte of tokens served, ``requests`` range GETs.

Run: ``PYTHONPATH=$PWD python -m benchmarks.bench_remote_zarr [--quick]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_remote import BATCH, SEQLEN, _docs, _epoch, _server_helpers, _view


def run(quick: bool = False) -> list[dict[str, Any]]:
    import mmpack
    from mmpack._src.store.backends._chunk_cache import get_cache

    s3 = _server_helpers()
    n_tokens = (1 << 20) if quick else (8 << 20)
    delays = (0.02,) if quick else (0.01, 0.02)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-remote-zarr-") as tmp_name:
        tmp = Path(tmp_name)
        saved_cache = os.environ.get("MMPACK_CACHE_DIR")
        os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache-home")
        server = s3.S3Server.start(tmp / "server")
        try:
            docs = _docs(n_tokens)
            urls = {}
            for layout in ("memmap", "zarr"):
                urls[layout] = f"s3://{s3.BUCKET}/bench-{layout}/store"
                t0 = time.perf_counter()
                mmpack.build(
                    urls[layout],
                    docs,
                    backend=layout,
                    storage_options=server.options,
                    overwrite=True,
                )
                rows.append(
                    {"case": f"build + upload, {layout}", "seconds": time.perf_counter() - t0}
                )
            local = mmpack.build(tmp / "local", docs)
            for kind in ("window", "packed"):
                local_view = _view(local, kind)
                order = np.random.default_rng(1).permutation(len(local_view))
                n_batches = min(len(local_view) // BATCH, 12 if quick else 48)
                batches = [order[b * BATCH : (b + 1) * BATCH] for b in range(n_batches)]
                tokens = n_batches * BATCH * SEQLEN
                _epoch(local_view, batches[:2], 0)  # warm-up (numba, page cache)
                local_s = _epoch(local_view, batches, 0)
                rows.append({"case": f"{kind} local memmap", "Mtok/s": tokens / local_s / 1e6})
                for delay in delays:
                    proxy = s3.DelayProxy(server.port, delay)
                    try:
                        opts = dict(server.options, endpoint=proxy.endpoint, max_concurrency=32)
                        for layout in ("memmap", "zarr"):
                            get_cache().clear()
                            store = mmpack.open(
                                urls[layout],
                                storage_options=opts,
                                cache_dir=tmp / f"c-{kind}-{delay}-{layout}",
                            )
                            secs = _epoch(_view(store, kind), batches, 0)
                            stats = store._backend.stats
                            rows.append(
                                {
                                    "case": f"{kind} remote {layout} {delay * 1e3:.0f} ms",
                                    "Mtok/s": tokens / secs / 1e6,
                                    "vs local": local_s / secs,
                                    "fetched/served": stats["bytes_fetched"] / (tokens * 2),
                                    "requests": stats["requests"],
                                }
                            )
                    finally:
                        proxy.close()
        finally:
            server.stop()
            if saved_cache is None:
                os.environ.pop("MMPACK_CACHE_DIR", None)
            else:
                os.environ["MMPACK_CACHE_DIR"] = saved_cache
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("remote Zarr stores", run(quick="--quick" in sys.argv))
