"""Stores on object storage: shuffled batches from S3 (SeaweedFS on loopback) behind a proxy that
adds 10 or 20 ms to every request, against the same batches from a local memmap store.

Cases (32 x 2048 windows, and packed rows of 2048, in a shuffled order):

- ``local``: the memmap store (the reference);
- ``remote`` without look-ahead: each batch's check blocks fetched when the batch is read (its
  range requests concurrent, adjacent blocks merged);
- ``remote + look-ahead K``: :class:`mmpack.views.readahead.Lookahead` hints the next K
  batches, so their blocks are in flight while the current one is consumed;
- ``node cache (new reader)``: a fresh store object (as a new worker would open it) reading the
  same batches again, the node's block cache filled by a first pass (a second epoch over a
  store the cache holds);
- ``50 ms step per batch``: the look-ahead loop with a simulated 50 ms training step per batch;
  the ratio is then local step time over remote step time (what a trainer sees).

The batches are the first 48 of a shuffled epoch (12 with ``--quick``), so the bytes fetched per
byte served are those of a store much larger than what is read (blocks shared by batches are
reused only from the per-process memory LRU).

Columns: ``Mtok/s`` tokens served per second, ``vs local`` the ratio to the local memmap run,
``fetched/served`` bytes moved from the store per byte of tokens served (the price of verifying
whole 64 KiB check blocks).

Run: ``python -m benchmarks remote`` (``--quick``: a smaller store, 20 ms only).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_TESTS = Path(__file__).resolve().parent.parent / "tests"

BATCH = 32
SEQLEN = 2048
STEP_SECONDS = 0.05


def _server_helpers() -> Any:
    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    import _s3

    return _s3


def _docs(n_tokens: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(6.0, 1.2, size=n_tokens // 500).astype(np.int64), 1)
    flat = rng.integers(0, 50_000, size=int(lens.sum()), dtype=np.uint16)
    return np.split(flat, np.cumsum(lens)[:-1])


def _views(store: Any) -> dict[str, Any]:
    import mmpack

    return {
        "window": mmpack.WindowDataset(store, SEQLEN, eot=50_000),
        "packed": mmpack.PackedDataset(store, SEQLEN, eot=50_000),
    }


def _epoch(view: Any, batches: list[np.ndarray], lookahead: int, step: float) -> float:
    from mmpack.views.readahead import Lookahead

    source = Lookahead(batches, view, lookahead) if lookahead else batches
    t0 = time.perf_counter()
    for idx in source:
        view.__getitems__(idx)
        if step:
            time.sleep(step)
    return time.perf_counter() - t0


def run(quick: bool = False) -> list[dict[str, Any]]:
    import mmpack

    s3 = _server_helpers()
    n_tokens = (1 << 20) if quick else (8 << 20)
    delays = (0.02,) if quick else (0.01, 0.02)
    depth = 8
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-remote-") as tmp_name:
        tmp = Path(tmp_name)
        saved_cache = os.environ.get("MMPACK_CACHE_DIR")
        os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache-home")  # build(url) opens the store
        server = s3.S3Server.start(tmp / "server")
        try:
            docs = _docs(n_tokens)
            url = f"s3://{s3.BUCKET}/bench/store"
            t0 = time.perf_counter()
            mmpack.build(url, docs, storage_options=server.options, overwrite=True)
            upload_s = time.perf_counter() - t0
            local = mmpack.build(tmp / "local", docs)
            rows.append(
                {"case": "build + upload", "seconds": upload_s, "MB": local.num_tokens * 2 / 1e6}
            )
            for kind, local_view in _views(local).items():
                n = len(local_view)
                order = np.random.default_rng(1).permutation(n)
                n_batches = min(n // BATCH, 12 if quick else 48)  # a part of an epoch
                batches = [order[b * BATCH : (b + 1) * BATCH] for b in range(n_batches)]
                served = n_batches * BATCH * SEQLEN * 2
                tokens = served // 2
                _epoch(local_view, batches[:2], 0, 0)  # warm-up (numba, page cache)
                local_s = _epoch(local_view, batches, 0, 0)
                k_step = min(n_batches, 12)
                local_step_s = _epoch(local_view, batches[:k_step], 0, STEP_SECONDS) / k_step
                rows.append(
                    {
                        "case": f"{kind} local memmap",
                        "Mtok/s": tokens / local_s / 1e6,
                        "vs local": 1.0,
                        "batches": n_batches,
                    }
                )
                for delay in delays:
                    proxy = s3.DelayProxy(server.port, delay)
                    try:
                        opts = dict(server.options, endpoint=proxy.endpoint, max_concurrency=32)
                        tag = f"{kind} remote {delay * 1e3:.0f} ms"
                        for ahead in (0, depth):
                            store = mmpack.open(
                                url,
                                storage_options=opts,
                                cache_dir=tmp / f"c-{kind}-{delay}-{ahead}",
                            )
                            secs = _epoch(_views(store)[kind], batches, ahead, 0)
                            label = tag + (f" + look-ahead {ahead}" if ahead else "")
                            row = {
                                "case": label,
                                "Mtok/s": tokens / secs / 1e6,
                                "vs local": local_s / secs,
                                "batches": n_batches,
                                "fetched/served": store._backend.stats["bytes_fetched"] / served,
                            }
                            if ahead and delay == 0.02:
                                row.update(target="≥ 0.5", met=local_s / secs >= 0.5)
                            rows.append(row)
                        store = mmpack.open(
                            url, storage_options=opts, cache_dir=tmp / f"s-{kind}-{delay}"
                        )
                        step_s = (
                            _epoch(_views(store)[kind], batches[:k_step], depth, STEP_SECONDS)
                            / k_step
                        )
                        rows.append(
                            {
                                "case": f"{tag} + look-ahead {depth}, "
                                f"{STEP_SECONDS * 1e3:.0f} ms step per batch",
                                "vs local": local_step_s / step_s,
                                "batches": k_step,
                            }
                        )
                        if delay == max(delays):  # the node cache: fill it, then a new reader
                            cache = tmp / f"cache-{kind}"
                            first = mmpack.open(
                                url, storage_options=opts, cache_dir=cache, cache_limit=1 << 30
                            )
                            _epoch(_views(first)[kind], batches, depth, 0)
                            again = mmpack.open(
                                url, storage_options=opts, cache_dir=cache, cache_limit=1 << 30
                            )
                            secs = _epoch(_views(again)[kind], batches, 0, 0)
                            rows.append(
                                {
                                    "case": f"{tag}, same batches again, node cache (new reader)",
                                    "Mtok/s": tokens / secs / 1e6,
                                    "vs local": local_s / secs,
                                    "batches": n_batches,
                                    "fetched/served": again._backend.stats["bytes_fetched"]
                                    / served,
                                    "target": "≥ 0.8",
                                    "met": local_s / secs >= 0.8,
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

    print_table("remote stores", run(quick="--quick" in sys.argv))
