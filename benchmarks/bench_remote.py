"""Stores on object storage: shuffled batches from S3 (SeaweedFS on loopback) behind a proxy that
adds 10 or 20 ms to every request, against the same batches from a local memmap store.

Cases (32 x 2048 windows, and packed rows of 2048, in a shuffled order):

- ``local``: the memmap store (the reference);
- ``remote``: each batch's check pages fetched when the batch is read (its range requests
  concurrent, blocks up to ``merge_gap_bytes`` apart merged), into the node cache;
- ``... merge_gap_bytes=0``: the same without merging nearby blocks (one request per run of
  adjacent blocks);
- ``node cache (new reader)``: a fresh store object (as a new worker would open it) reading the
  same batches again, the node's block cache filled by a first pass (a second epoch over a
  store the cache holds); timed alternately with the local store, 7 times, each time passing
  over the batches for at least ~0.1 s, medians;
- ``50 ms step per batch, 2 workers``: a DataLoader with two workers (their prefetch overlaps
  the fetches with the step) and a simulated 50 ms training step per batch, against the local
  store read the same way; the ratio is then local step time over remote step time (what a
  trainer sees).

The batches are the first 48 of a shuffled epoch (12 with ``--quick``).  The delay proxy runs in
its own process (in this one it would take the GIL from the client).  Columns: ``Mtok/s``
tokens served per second, ``vs local`` the ratio to the local memmap run, ``req/s`` range
requests per second, ``fetched/served`` bytes moved from the store per byte of tokens served,
``client/server ms/req`` CPU time per request of this process and of the S3 server (the bound on
a machine whose cores they share).

Run: ``python -m benchmarks remote`` (``--quick``: a smaller store, 20 ms only);
``python -m benchmarks.bench_remote --sweep``: the window case over ``max_concurrency``
16 / 64 / 256 and the two S3 clients (the fork-safe urllib3 one, obstore in threads);
``python -m benchmarks.bench_remote --open``: opening stores of 10^5, 10^7 and 4 x 10^7
two-token documents (both layouts) and one of 10^8 tokens in 1000 documents (memmap; a fresh
cache folder, then again): seconds, requests and bytes fetched by the open, then by the first
read of a middle document, and the bytes of the check table (``tokens.xxh``) among them
(``--quick``: 10^4, 10^6 documents, 10^7 tokens).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
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
WORKERS = 2


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


def _view(store: Any, kind: str) -> Any:
    import mmpack

    if kind == "window":
        return mmpack.WindowDataset(store, SEQLEN, eot=50_000)
    return mmpack.PackedDataset(store, SEQLEN, eot=50_000)


def _epoch(view: Any, batches: list[np.ndarray], step: float) -> float:
    t0 = time.perf_counter()
    for idx in batches:
        view.__getitems__(idx)
        if step:
            time.sleep(step)
    return time.perf_counter() - t0


def _workers_step(view: Any, batches: list[np.ndarray]) -> float:
    """Seconds per batch through a DataLoader with :data:`WORKERS` forked workers and a
    :data:`STEP_SECONDS` step per batch (the first batch not timed)."""
    from torch.utils.data import DataLoader

    from mmpack.torch import collate

    loader = DataLoader(
        view,
        batch_sampler=[b.tolist() for b in batches],
        num_workers=WORKERS,
        collate_fn=collate,
        multiprocessing_context="fork",
    )
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in it:
        time.sleep(STEP_SECONDS)
        n += 1
    return (time.perf_counter() - t0) / max(n, 1)


def _proxy_main(target: int, delay: float, conn: Any) -> None:
    proxy = _server_helpers().DelayProxy(target, delay, max_connections=512)
    conn.send(proxy.port)
    conn.recv()  # until told to stop
    proxy.close()


class _Proxy:
    """The delay proxy in a child process (stopped by ``close``)."""

    def __init__(self, target: int, delay: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_proxy_main, args=(target, delay, child), daemon=True)
        self._proc.start()
        self.endpoint = f"http://127.0.0.1:{self._conn.recv()}"
        self.pid = self._proc.pid

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (from /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _remote_row(label: str, store: Any, run: Any, tokens: int, local_s: float, server: Any) -> dict:
    """Time ``run()``; the row with its throughput, requests and CPU per request."""
    served = tokens * 2
    s0, r0 = _cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    secs = run()
    s1, r1 = _cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    stats = store._backend.stats
    n = max(stats["requests"], 1)
    client = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return {
        "case": label,
        "Mtok/s": tokens / secs / 1e6,
        "vs local": local_s / secs,
        "req/s": stats["requests"] / secs,
        "fetched/served": stats["bytes_fetched"] / served,
        "client/server ms/req": f"{client / n * 1e3:.2f} / {(s1 - s0) / n * 1e3:.2f}",
    }


def _cache_rows(
    url: str,
    opts: dict,
    tmp: Path,
    kind: str,
    local_view: Any,
    batches: list,
    tokens: int,
    tag: str,
) -> dict:
    import mmpack

    cache = tmp / f"cache-{kind}"
    first = mmpack.open(url, storage_options=opts, cache_dir=cache, cache_limit=1 << 30)
    _epoch(_view(first, kind), batches, 0)
    again = mmpack.open(url, storage_options=opts, cache_dir=cache, cache_limit=1 << 30)
    view = _view(again, kind)
    _epoch(view, batches[:2], 0)
    passes = batches * max(1, int(0.1 / _epoch(local_view, batches, 0)))  # >= ~0.1 s each
    local_t, cache_t = [], []
    for _ in range(7):  # interleaved: the same load on both
        local_t.append(_epoch(local_view, passes, 0) / (len(passes) // len(batches)))
        cache_t.append(_epoch(view, passes, 0) / (len(passes) // len(batches)))
    ratio = float(np.median(local_t) / np.median(cache_t))
    return {
        "case": f"{tag}, same batches again, node cache (new reader)",
        "Mtok/s": tokens / float(np.median(cache_t)) / 1e6,
        "vs local": ratio,
        "fetched/served": again._backend.stats["bytes_fetched"] / (tokens * 2),
        "target": "≥ 0.8",
        "met": ratio >= 0.8,
    }


def _kind_rows(kind, local, url, server, tmp, delays, quick) -> list[dict[str, Any]]:
    import mmpack

    rows: list[dict[str, Any]] = []
    local_view = _view(local, kind)
    order = np.random.default_rng(1).permutation(len(local_view))
    n_batches = min(len(local_view) // BATCH, 12 if quick else 48)  # a part of an epoch
    batches = [order[b * BATCH : (b + 1) * BATCH] for b in range(n_batches)]
    tokens = n_batches * BATCH * SEQLEN
    _epoch(local_view, batches[:2], 0)  # warm-up (numba, page cache)
    local_s = float(np.median([_epoch(local_view, batches, 0) for _ in range(3)]))
    local_step_s = _workers_step(local_view, batches)
    rows.append({"case": f"{kind} local memmap", "Mtok/s": tokens / local_s / 1e6, "vs local": 1.0})
    for delay in delays:
        proxy = _Proxy(server.port, delay)
        try:
            opts = dict(server.options, endpoint=proxy.endpoint)
            tag = f"{kind} remote {delay * 1e3:.0f} ms"
            for suffix, extra in (("", {}), (", merge_gap_bytes=0", {"merge_gap_bytes": 0})):
                store = mmpack.open(
                    url, storage_options=dict(opts, **extra), cache_dir=tmp / f"c{time.time()}"
                )
                view = _view(store, kind)
                row = _remote_row(
                    tag + suffix,
                    store,
                    lambda v=view: _epoch(v, batches, 0),
                    tokens,
                    local_s,
                    server,
                )
                if not extra and delay == 0.02:
                    row.update(target="≥ 0.5", met=row["vs local"] >= 0.5)
                rows.append(row)
            store = mmpack.open(url, storage_options=opts, cache_dir=tmp / f"s{time.time()}")
            step_s = _workers_step(_view(store, kind), batches)
            rows.append(
                {
                    "case": f"{tag}, {STEP_SECONDS * 1e3:.0f} ms step per batch, {WORKERS} workers",
                    "vs local": local_step_s / step_s,
                }
            )
            if delay == max(delays):
                rows.append(_cache_rows(url, opts, tmp, kind, local_view, batches, tokens, tag))
        finally:
            proxy.close()
    return rows


def sweep() -> list[dict[str, Any]]:
    """Window batches, 20 ms, over requests in flight and the client
    (``python -m benchmarks.bench_remote --sweep``)."""
    import mmpack

    s3 = _server_helpers()
    rows: list[dict[str, Any]] = [{"case": f"load average {os.getloadavg()[0]:.1f} at start"}]
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-remote-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache-home")
        server = s3.S3Server.start(tmp / "server")
        proxy = None
        try:
            docs = _docs(8 << 20)
            url = f"s3://{s3.BUCKET}/bench/store"
            mmpack.build(url, docs, storage_options=server.options, overwrite=True)
            local_view = _view(mmpack.build(tmp / "local", docs), "window")
            order = np.random.default_rng(1).permutation(len(local_view))
            batches = [order[b * BATCH : (b + 1) * BATCH] for b in range(48)]
            tokens = 48 * BATCH * SEQLEN
            _epoch(local_view, batches[:2], 0)
            local_s = float(np.median([_epoch(local_view, batches, 0) for _ in range(3)]))
            proxy = _Proxy(server.port, 0.02)
            for client in ("http", "obstore"):
                for conc in (16, 64, 256):
                    opts = dict(server.options, endpoint=proxy.endpoint, max_concurrency=conc)
                    opts["client"] = client
                    store = mmpack.open(
                        url, storage_options=opts, cache_dir=tmp / f"c{time.time()}"
                    )
                    view = _view(store, "window")
                    label = f"window 20 ms, {client}, max_concurrency={conc}"
                    rows.append(
                        _remote_row(
                            label,
                            store,
                            lambda v=view: _epoch(v, batches, 0),
                            tokens,
                            local_s,
                            server,
                        )
                    )
        finally:
            if proxy is not None:
                proxy.close()
            server.stop()
    return rows


_TABLE_BYTES = [0]
"""Bytes of check tables (``tokens.xxh``) this process's S3 transports fetched
(:func:`_count_table_bytes`)."""


def _count_table_bytes() -> None:
    """Make the S3 transport add the bytes it fetches of any ``tokens.xxh`` to
    :data:`_TABLE_BYTES` (whole GETs and range GETs alike), once per process."""
    from mmpack._src.remote.s3 import S3Transport

    if getattr(S3Transport, "_bench_counted", False):
        return
    get, get_ranges = S3Transport.get, S3Transport.get_ranges

    def counted_get(self: Any, key: str) -> bytes:
        data = get(self, key)
        if key.endswith("tokens.xxh"):
            _TABLE_BYTES[0] += len(data)
        return data

    def counted_ranges(self: Any, key: str, ranges: Any) -> list[bytes]:
        parts = get_ranges(self, key, ranges)
        if key.endswith("tokens.xxh"):
            _TABLE_BYTES[0] += sum(len(p) for p in parts)
        return parts

    S3Transport.get, S3Transport.get_ranges = counted_get, counted_ranges  # type: ignore[method-assign]
    S3Transport._bench_counted = True  # type: ignore[attr-defined]


def _open_row(url: str, opts: dict[str, Any], proxy: Any, cache: Path, label: str) -> dict:
    """One open of ``url`` through ``proxy`` (counting requests and bytes, and the check
    table's bytes), then one read."""
    import mmpack

    _count_table_bytes()
    counts = (proxy.requests, proxy.bytes_down, _TABLE_BYTES[0])
    t0 = time.perf_counter()
    store = mmpack.open(url, storage_options=opts, cache_dir=cache)
    open_s = time.perf_counter() - t0
    opened = (proxy.requests, proxy.bytes_down, _TABLE_BYTES[0])
    t0 = time.perf_counter()
    store[len(store) // 2]
    read_s = time.perf_counter() - t0
    return {
        "case": label,
        "docs": len(store),
        "tokens": store.num_tokens,
        "offsets MB": (len(store) + 1) * 8 / 1e6,
        "open s": open_s,
        "open requests": opened[0] - counts[0],
        "open MB fetched": (opened[1] - counts[1]) / 1e6,
        "open table bytes": opened[2] - counts[2],
        "first read s": read_s,
        "first read MB fetched": (proxy.bytes_down - opened[1]) / 1e6,
        "first read table bytes": _TABLE_BYTES[0] - opened[2],
    }


def open_costs(quick: bool = False) -> list[dict[str, Any]]:
    """What opening a remote store costs against its number of documents
    (``python -m benchmarks.bench_remote --open``)."""
    from mmpack.ingest import copy_store
    from mmpack.store import StoreWriter

    s3 = _server_helpers()
    sizes = (10**4, 10**6) if quick else (10**5, 10**7, 4 * 10**7)
    long_tokens = 10**7 if quick else 10**8  # in 1000 documents: a check table of note
    rows: list[dict[str, Any]] = [{"case": f"load average {os.getloadavg()[0]:.1f} at start"}]
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-remote-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache-home")
        server = s3.S3Server.start(tmp / "server")
        proxy = s3.DelayProxy(server.port, 0.0)
        try:
            opts = dict(server.options, endpoint=proxy.endpoint)
            for n in sizes:
                local = tmp / f"local-{n}"
                with StoreWriter(local, fsync=False) as w:
                    w.add_batch(np.arange(2 * n, dtype=np.uint16), np.full(n, 2, np.int64))
                for backend in ("memmap", "zarr"):
                    url = f"s3://{s3.BUCKET}/bench/open-{n}-{backend}"
                    kw = {"storage_options": server.options, "backend": backend}
                    copy_store(local, url, overwrite=True, **kw)
                    for k in range(2):
                        label = f"{backend}, {n:.0e} docs, " + ("cold" if k == 0 else "again")
                        cache = tmp / f"open-{n}-{backend}"  # the second open finds it kept
                        rows.append(_open_row(url, opts, proxy, cache, label))
            local = tmp / "local-long"
            with StoreWriter(local, fsync=False) as w:
                tokens = np.arange(long_tokens, dtype=np.uint64).astype(np.uint16)
                w.add_batch(tokens, np.full(1000, long_tokens // 1000, np.int64))
            url = f"s3://{s3.BUCKET}/bench/open-long"
            copy_store(local, url, overwrite=True, storage_options=server.options)
            for k in range(2):
                label = f"memmap, {long_tokens:.0e} tokens, " + ("cold" if k == 0 else "again")
                rows.append(_open_row(url, opts, proxy, tmp / "open-long", label))
        finally:
            proxy.close()
            server.stop()
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    import mmpack

    s3 = _server_helpers()
    n_tokens = (1 << 20) if quick else (8 << 20)
    delays = (0.02,) if quick else (0.01, 0.02)
    rows: list[dict[str, Any]] = [{"case": f"load average {os.getloadavg()[0]:.1f} at start"}]
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
            for kind in ("window", "packed"):
                rows.extend(_kind_rows(kind, local, url, server, tmp, delays, quick))
        finally:
            server.stop()
            if saved_cache is None:
                os.environ.pop("MMPACK_CACHE_DIR", None)
            else:
                os.environ["MMPACK_CACHE_DIR"] = saved_cache
    rows.append({"case": f"load average {os.getloadavg()[0]:.1f} at the end"})
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    if "--sweep" in sys.argv:
        print_table("remote stores: requests in flight and client", sweep())
    elif "--open" in sys.argv:
        print_table("remote stores: opening", open_costs(quick="--quick" in sys.argv))
    else:
        print_table("remote stores", run(quick="--quick" in sys.argv))
