"""One fetch per block: a first epoch in the block-window order from S3 (SeaweedFS on loopback
behind a proxy adding 20 ms to every request) against a local memmap store read in the same
order, the bare transfer floor, and the global order from S3 in the same run.

Cases (windows or packed rows of 2048 tokens, batches of 32, ``mmpack.torch.loader``, a fresh
node cache each), for each configuration of the block order: at the defaults
(``block_bytes`` 4 MiB, ``window_blocks`` 256: the target; on this store one window holds the
whole corpus, so the fetcher has every part of the epoch to issue at once), with 2 DataLoader
workers, over a packed view, and with windows small enough that the store has several
(``window_blocks`` 8 of 4 MiB blocks, then of 1 MiB blocks: two windows in flight hold only
16 parts, so the transfer runs at that concurrency):

- ``local memmap``: the local store through the same loader and order (the reference; the
  faster of two epochs, after a warm-up);
- ``transfer floor``: the same check pages (every window's spans, the same parts) fetched with
  the same client, ``max_concurrency`` at a time, nothing else (no checks, no cache, no reads;
  the faster of two runs);
- ``S3 20 ms``: the loader over the remote store opened with a node cache: its
  :class:`~mmpack._src.torch.block_fetch.WindowFetcher` fetches the current and next window as whole
  spans in parts of at most 4 MiB (``max_concurrency`` at a time), checked, into the node cache;
- ``S3 20 ms, global order``: the path of ``shuffle=True``, each batch's blocks fetched as it is
  read (the first batches of its epoch only: it is slow), against the local store in the global
  order.

Columns: ``s`` seconds of the epoch (or of the batches timed), ``vs local`` / ``vs floor`` their
ratios (higher is better, 1 = as fast), ``first batch s`` from the loader's ``iter`` to the first
batch, ``fetched/served`` bytes moved per byte of tokens the batches hold, ``req/sample`` range
requests per sample served, ``cache peak / 2 windows`` the node cache's largest holding (sampled
after every batch) over the bytes of the two largest consecutive windows, ``fetches/page``
check pages fetched per check page the epoch's windows read (both without the first window of
the next epoch, which the fetcher fetches while the loop is in the last one); ``cpu here s`` the
CPU seconds of this process (and its DataLoader workers), ``cpu server+proxy s`` those of the S3
server and the proxy, ``cpu / cores s`` their sum over the machine's cores: no schedule of the
case on this machine runs faster (where the server shares the reader's cores, that bounds
``vs local`` and ``vs floor``); ``order bound`` (``order bound vs floor``) the most ``vs local``
(``vs floor``) any fetcher of the order can reach with the loop at the local rate and the
transfer at the floor's, side by side (:func:`_order_seconds`: the first window is fetched before
it is read, then each window takes the longer of reading one and fetching the next, then the
last is read); ``machine bound`` the most ``vs local`` any reader reaches on this machine
(:func:`_machine_seconds`: the loop's CPU, the bare transfer's, and landing two windows in new
pages, over every core).  Two rows before the cases give what writing bytes into new page-cache
pages costs this machine, against overwriting resident ones (:func:`_page_costs`: a first epoch
lands at least two windows in new pages, where the local store's pages are already resident),
and what checking a fetched part and a single page costs (:func:`_check_costs`).

``--pinned`` (issue's speed check): the server and the proxy pinned to core 0, this process and
its DataLoader workers to core 1, then the same unpinned; a first epoch in the block order
(windows of 8 MiB: twelve on the default store) through a plain ``DataLoader`` over a
``ResumableSampler`` and through ``mmpack.torch.loader``, 0 and 2 workers, against the local
store read the same way (pinned the same way).  ``L`` is the local loop's CPU seconds per GB
served, ``F`` the bare client's per GB fetched (the floor's); on one core the loop and the
fetching share the CPU, so a first epoch reaches at most ``bound = L / (L + F)`` of the local
one; ``of bound`` is ``vs local / bound``, ``cpu beyond local / F`` the reader's CPU per GB
beyond the local loop's over the bare client's.

Run: ``python -m benchmarks.bench_block_fetch`` (``--quick``: 28 MB, under 20 s; ``--large``: a
2.7 GB store, three windows at the defaults, the default case alone, about 3 minutes: the store of
the default run fits in one window, so its first batch, which waits for the blocks a whole
window's first samples read, weighs on its epoch).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_remote import _cpu_seconds, _docs, _Proxy, _server_helpers

BATCH = 32
SEQLEN = 2048
MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    """One configuration: the view (``"window"`` or ``"packed"``), the block order's
    ``block_bytes`` and ``window_blocks``, and the DataLoader workers."""

    kind: str
    block_bytes: int
    window_blocks: int
    workers: int = 0

    @property
    def tag(self) -> str:
        return (
            f"{self.kind}, block_bytes={self.block_bytes // MiB} MiB, "
            f"window_blocks={self.window_blocks}, {self.workers} workers"
        )

    def view(self, store: Any) -> Any:
        import mmpack

        if self.kind == "packed":
            return mmpack.PackedDataset(store, SEQLEN)
        return mmpack.WindowDataset(store, SEQLEN)

    def loader(self, view: Any, workers: int | None = None) -> Any:
        from mmpack.torch import loader

        return loader(
            view,
            BATCH,
            shuffle="blocks",
            block_bytes=self.block_bytes,
            window_blocks=self.window_blocks,
            seed=1,
            num_workers=self.workers if workers is None else workers,
        )


def _cases(quick: bool, large: bool = False) -> list[Case]:
    """At the defaults (the target), then windows small enough that the store has several."""
    from mmpack._src.core.constants import FETCH_BLOCK_BYTES, WINDOW_BLOCKS

    defaults = [Case("window", FETCH_BLOCK_BYTES, WINDOW_BLOCKS)]
    small = [Case("window", MiB, 8)]
    if large:
        return defaults
    if quick:
        return defaults + small
    return (
        defaults
        + [
            Case("window", FETCH_BLOCK_BYTES, WINDOW_BLOCKS, workers=2),
            Case("packed", FETCH_BLOCK_BYTES, WINDOW_BLOCKS),
            Case("window", FETCH_BLOCK_BYTES, 8),
        ]
        + small
    )


def _epoch(ld: Any, limit: int | None = None, watch: Any = None) -> tuple[float, float, int]:
    """Seconds of a pass (or of its first ``limit`` batches), to the first batch, and the peak of
    ``watch()`` after each batch."""
    t0 = time.perf_counter()
    first, peak = 0.0, 0
    for k, _ in enumerate(ld):
        if k == 0:
            first = time.perf_counter() - t0
        if watch is not None:
            peak = max(peak, watch())
        if limit is not None and k + 1 >= limit:
            break
    return time.perf_counter() - t0, first, peak


class _Cpu:
    """CPU seconds (user + system) over a block of code, ``with _Cpu(pids) as c: ...``:
    ``c.client`` of this process and its children other than ``pids`` (DataLoader workers),
    ``c.others`` of ``pids`` (the S3 server, the proxy)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def __enter__(self) -> _Cpu:
        self._t0 = self._now()
        return self

    def __exit__(self, *exc: Any) -> None:
        t1 = self._now()
        self.others = t1[1] - self._t0[1]
        self.client = t1[0] - self._t0[0] - self.others

    def _now(self) -> tuple[float, float]:
        return _cpu_seconds(os.getpid()), sum(_cpu_seconds(p) for p in self.pids)


def _floor(store: Any, spans: list[tuple[int, int]]) -> float:
    """Seconds to fetch the check pages of ``spans`` in the span fetcher's parts, concurrently,
    with nothing else."""
    sf = store.span_fetcher
    f = sf.fetcher
    parts = []
    for a, b in spans:
        b0, b1 = sf.page_range(a, b)
        for lo in range(b0, b1, sf.part_pages):
            parts.append((lo * f.page, min(min(lo + sf.part_pages, b1) * f.page, f.nbytes)))
    t0 = time.perf_counter()
    src = f.source  # the memmap layout's pages: one object
    with ThreadPoolExecutor(src.transport.max_concurrency) as pool:
        list(pool.map(lambda r: src.transport.get_ranges(src.key, [r]), parts))
    return time.perf_counter() - t0


def _machine_seconds(local: _Cpu, floor: _Cpu, fresh_s: float) -> float:
    """The fewest seconds any reader of the case takes on this machine: the loop's CPU (the
    local epoch's), the bare transfer's (client, server and proxy: the floor's) and ``fresh_s``
    (landing the bytes of two windows, or of the store where it is smaller, in new pages),
    spread over every core with none idle."""
    return (local.client + floor.client + floor.others + fresh_s) / (os.cpu_count() or 1)


def _order_seconds(local_s: float, floor_s: float, n_windows: int) -> float:
    """The fewest seconds any fetcher of the block-window order takes over an epoch, with the
    loop at the local epoch's rate and the transfer at the floor's, side by side at full speed:
    the loop needs nearly all of a window before it gets far into it (after ``m`` samples of a
    window of ``W`` blocks it has touched a fraction ``1 - (1 - 1/W)**m`` of them: 95% after
    ``3 W``), and the fetcher runs at most one window ahead (the cache holds two).  So the first
    window's transfer comes before any reading, each later window takes the longer of reading
    the one before and fetching it, and the last is read after its transfer."""
    n = max(1, n_windows)
    fetch, read = floor_s / n, local_s / n
    return fetch + (n - 1) * max(read, fetch) + read


def _page_costs(folder: Path, nbytes: int = 256 << 20) -> tuple[float, float]:
    """CPU seconds per GB of writing ``nbytes`` into new page-cache pages (a new file, 4 MiB
    at a time, as the node cache stores parts) and of writing them again over the resident
    ones: what bytes landing in memory cost this machine (on the 2-core VM of the object
    storage page, the first was 0.2-3.4 CPU s per GB and the second ~0.1)."""
    buf = np.random.default_rng(0).integers(0, 256, 4 << 20, np.uint8).tobytes()
    path = folder / "page-costs"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    out = []
    try:
        for _ in range(2):
            c0 = time.process_time()
            for at in range(0, nbytes, len(buf)):
                os.pwrite(fd, buf, at)
            out.append((time.process_time() - c0) / (nbytes / 1e9))
    finally:
        os.close(fd)
        path.unlink()
    return out[0], out[1]


def _check_costs(repeats: int = 20) -> tuple[float, float]:
    """GB/s of hashing a 4 MiB part's 16 KiB check pages in one call (what the span fetcher does
    per part) and microseconds of one page's digest alone (what a random read checks), the
    median of ``repeats`` timings each."""
    from mmpack._src.store.integrity import stripe_digest, stripe_digests

    part = np.random.default_rng(1).integers(0, 256, 4 << 20, np.uint8).tobytes()
    page = part[: 16 << 10]
    stripe_digests(part, 16 << 10)  # compiled (or loaded) before timing
    runs, singles = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        stripe_digests(part, 16 << 10)
        runs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(100):
            stripe_digest(page)
        singles.append((time.perf_counter() - t0) / 100)
    return len(part) / float(np.median(runs)) / 1e9, float(np.median(singles)) * 1e6


def _best(pids: list[int], run: Any, times: int = 2) -> tuple[float, _Cpu]:
    """The fastest of ``times`` runs of ``run()`` (which returns its seconds) and its CPU: the
    references (the local epoch, the floor) at their best, so one slow run on a shared machine
    flatters no ratio."""
    best: tuple[float, _Cpu] | None = None
    for _ in range(times):
        with _Cpu(pids) as cpu:
            secs = float(run())
        if best is None or secs < best[0]:
            best = (secs, cpu)
    assert best is not None
    return best


def _cpu_columns(c: _Cpu) -> dict[str, float]:
    cores = os.cpu_count() or 1
    return {"cpu here s": c.client, "cpu server+proxy s": c.others,
            "cpu / cores s": (c.client + c.others) / cores}  # fmt: skip


@dataclasses.dataclass
class _RemoteEpoch:
    """A first epoch of a remote store through one loader, and the fetch floor of its windows."""

    secs: float  # the epoch
    first: float  # to the first batch
    peak: int  # bytes the node cache held at most, after a batch
    cpu: _Cpu  # over the epoch
    n_windows: int
    wbytes: list[int]  # each window's bytes, whole check pages
    fetched: int  # bytes fetched for the epoch (the next epoch's first window excluded)
    requests: int
    floor_s: float  # the windows' blocks fetched alone (:func:`_floor`), best of two
    cpu_floor: _Cpu


def _remote_epoch(url, opts, tmp, pids, make: Any, view_of: Any, watch: bool) -> _RemoteEpoch:
    """One first epoch of the store at ``url`` through ``make(view_of(store))`` (a loader whose
    sampler fetches by windows), with a fresh node cache, then the floor of the same windows;
    ``watch``: the node cache's peak read after every batch (else ``peak`` is 0)."""
    import mmpack

    store = mmpack.open(url, storage_options=opts, cache_dir=tmp / f"c{time.time()}",
                        cache_limit=8 << 30)  # fmt: skip
    ld = make(view_of(store))
    fetcher = ld.sampler.window_fetcher
    assert fetcher is not None
    cf = fetcher.spans.cache
    page = store.span_fetcher.fetcher.page
    with _Cpu(pids) as cpu:
        secs, first, peak = _epoch(
            ld, watch=(lambda: int(cf.state.sum()) * page) if watch else None
        )
    fetcher.wait()
    windows = [fetcher.window_spans(0, w) for w in range(fetcher.order.n_windows)]
    wbytes = [
        sum(b1 - b0 for b0, b1 in (fetcher.spans.page_range(a, b) for a, b in w)) * page
        for w in windows
    ]
    stats, reads = fetcher.spans.stats, store._backend.stats
    ahead = fetcher._jobs[(1, 0)].result()  # the next epoch's first window, fetched ahead
    fetched = stats["bytes_fetched"] + reads["bytes_fetched"] - ahead
    fetcher.close()
    floor_store = mmpack.open(url, storage_options=opts, cache_dir=tmp / f"f{time.time()}",
                              cache_limit=8 << 30)  # fmt: skip
    floor_store.span_fetcher.part_pages = fetcher.spans.part_pages
    floor_s, cpu_floor = _best(pids, lambda: _floor(floor_store, [s for w in windows for s in w]))
    return _RemoteEpoch(secs, first, peak, cpu, len(windows), wbytes, fetched,
                        stats["requests"] + reads["requests"], floor_s, cpu_floor)  # fmt: skip


def _blocks_rows(url, opts, tmp, local, case: Case, pids, fresh: float) -> list[dict[str, Any]]:
    tag = case.tag
    local_ld = case.loader(case.view(local), workers=0)
    _epoch(local_ld, limit=4)  # warm-up (numba, page cache)
    local_s, cpu_local = _best(pids, lambda: _epoch(local_ld)[0])
    e = _remote_epoch(url, opts, tmp, pids, case.loader, case.view, watch=True)
    secs, wbytes, floor_s = e.secs, e.wbytes, e.floor_s
    two = max([a + b for a, b in zip(wbytes, wbytes[1:])] or wbytes)
    samples = len(case.view(local))
    served = samples * SEQLEN * 2  # bytes of tokens the batches hold
    fewest = _order_seconds(local_s, floor_s, e.n_windows)
    return [
        {"case": f"local memmap, blocks, {tag}", "s": local_s, "vs local": 1.0}
        | _cpu_columns(cpu_local),
        {"case": f"transfer floor, {tag}", "s": floor_s, "MB/s": sum(wbytes) / floor_s / 1e6}
        | _cpu_columns(e.cpu_floor),
        {
            "case": f"S3 20 ms, blocks, {tag}",
            "s": secs,
            "MB/s": e.fetched / secs / 1e6,
            "vs local": local_s / secs,
            "vs floor": floor_s / secs,
            "order bound": local_s / fewest,
            "order bound vs floor": floor_s / fewest,
            "machine bound": local_s
            / _machine_seconds(cpu_local, e.cpu_floor, fresh * min(sum(wbytes), two) / 1e9),
            "first batch s": e.first,
            "fetched/served": e.fetched / served,
            "req/sample": e.requests / samples,
            "cache peak / 2 windows": e.peak / two if case.workers == 0 else "",
            "fetches/page": e.fetched / sum(wbytes),
            "target": "≥ 0.8 of both, first batch ≤ 2 s, ≤ 1.1 fetched/served",
            "met": local_s / secs >= 0.8
            and floor_s / secs >= 0.8
            and e.first <= 2.0
            and e.fetched / served <= 1.1,
        }
        | _cpu_columns(e.cpu),
    ]


def _global_rows(url, opts, tmp, local, n_batches) -> list[dict[str, Any]]:
    import mmpack
    from mmpack import ResumableSampler

    def batches(view: Any) -> list[np.ndarray]:
        order = np.fromiter(ResumableSampler(len(view), seed=1), np.int64)
        return [order[k * BATCH : (k + 1) * BATCH] for k in range(n_batches)]

    def run(view: Any) -> float:
        src = batches(view)
        t0 = time.perf_counter()
        for idx in src:
            view.__getitems__(idx)
        return time.perf_counter() - t0

    lv = mmpack.WindowDataset(local, SEQLEN)
    run(lv)
    local_s = run(lv)
    store = mmpack.open(url, storage_options=opts, cache_dir=tmp / f"g{time.time()}")
    rv = mmpack.WindowDataset(store, SEQLEN)
    secs = run(rv)
    st = store._backend.stats
    served = n_batches * BATCH * SEQLEN * 2
    return [
        {
            "case": f"S3 20 ms, global order ({n_batches} batches)",
            "s": secs,
            "vs local": local_s / secs,
            "fetched/served": st["bytes_fetched"] / served,
            "req/sample": st["requests"] / (n_batches * BATCH),
        }
    ]


# ----------------------------------------------------------------------------- one core each
PINNED = Case("window", MiB, 8)
"""The pinned case: windows of 8 MiB, so the default store holds twelve of them."""


def _threads(pid: int) -> list[int]:
    """The threads of ``pid`` and of its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            out += [int(t) for t in os.listdir(f"/proc/{p}/task")]
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of ``pids`` and their descendants on ``cpus`` (threads and processes they
    start later inherit it)."""
    for pid in pids:
        for tid in _threads(pid):
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass


def _plain(view: Any, case: Case, workers: int) -> Any:
    """A plain ``DataLoader`` over a block-order ``ResumableSampler`` (the Trainer and Lightning
    path), batches as the mmpack loader's."""
    from torch.utils.data import DataLoader

    from mmpack import ResumableSampler
    from mmpack.torch import collate

    bounds = view.block_bounds(case.block_bytes)
    sampler = ResumableSampler(view, shuffle="blocks", block_bounds=bounds,
                               window_blocks=case.window_blocks, seed=1)  # fmt: skip
    return DataLoader(view, sampler=sampler, batch_size=BATCH, num_workers=workers,
                      collate_fn=collate)  # fmt: skip


def _pinned_rows(url, opts, tmp, local, pids, pinned: bool) -> list[dict[str, Any]]:
    """The first epoch of a remote store against the local store, through a plain DataLoader
    and through ``mmpack.torch.loader``, 0 and 2 workers; ``pinned``: the server and the proxy
    on core 0, this process and its workers on core 1 (the local reference too)."""

    everything = set(range(os.cpu_count() or 1))
    rows: list[dict[str, Any]] = []
    if pinned:
        _pin(pids, {0})
        _pin([os.getpid()], {1})
    try:
        for path in ("DataLoader", "loader"):
            for workers in (0, 2):
                rows.append(_pinned_row(url, opts, tmp, local, pids, path, workers, pinned))
    finally:
        _pin([*pids, os.getpid()], everything)
    return rows


def _pinned_row(url, opts, tmp, local, pids, path, workers, pinned) -> dict[str, Any]:
    case = PINNED

    def make(view: Any) -> Any:
        if path == "loader":
            return case.loader(view, workers=workers)
        return _plain(view, case, workers)

    local_ld = make(case.view(local))
    _epoch(local_ld, limit=4)  # warm-up (numba, page cache, workers' imports)
    local_s, cpu_local = _best(pids, lambda: _epoch(local_ld)[0])
    e = _remote_epoch(url, opts, tmp, pids, make, case.view, watch=False)
    served = len(case.view(local)) * SEQLEN * 2 / 1e9  # GB of tokens the batches hold
    loop = cpu_local.client / served  # L: the local loop's CPU s per GB
    bare = e.cpu_floor.client / (e.fetched / 1e9)  # F: the bare client's CPU s per GB
    bound = loop / (loop + bare) if pinned else 1.0
    beyond = (e.cpu.client - cpu_local.client) / served
    return {
        "case": f"{'pinned' if pinned else 'unpinned'}, {path}, {workers} workers",
        "s": e.secs,
        "local s": local_s,
        "vs local": local_s / e.secs,
        "L cpu s/GB": loop,
        "F cpu s/GB": bare,
        "bound": bound,
        "of bound": local_s / e.secs / bound,
        "cpu beyond local / F": beyond / bare,
        "fetched/served": e.fetched / 1e9 / served,
        "target": "of bound >= 0.9, cpu beyond / F <= 1.2, fetched/served <= 1.01",
        "met": local_s / e.secs / bound >= 0.9
        and beyond / bare <= 1.2
        and e.fetched / 1e9 / served <= 1.01,
    }


def run(quick: bool = False, large: bool = False, pinned: bool = False) -> list[dict[str, Any]]:
    import mmpack

    s3 = _server_helpers()
    n_tokens = (768 << 20) if large else (8 << 20) if quick else (48 << 20)
    rows: list[dict[str, Any]] = [{"case": f"load average {os.getloadavg()[0]:.1f} at start"}]
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-blocks-") as tmp_name:
        tmp = Path(tmp_name)
        saved = os.environ.get("MMPACK_CACHE_DIR")
        os.environ["MMPACK_CACHE_DIR"] = str(tmp / "cache-home")
        server = s3.S3Server.start(tmp / "server")
        proxy = None
        try:
            docs = _docs(n_tokens)
            url = f"s3://{s3.BUCKET}/bench/blocks"
            mmpack.build(url, docs, storage_options=server.options, overwrite=True)
            local = mmpack.build(tmp / "local", docs)
            rows.append({"case": f"store: {local.num_tokens * 2 / 1e6:.0f} MB of tokens"})
            fresh, again = _page_costs(tmp)
            rows.append({"case": f"page-cache writes: {fresh:.2f} CPU s per GB into new pages, "
                                 f"{again:.2f} over resident ones"})  # fmt: skip
            rate, single = _check_costs()
            rows.append({"case": f"checks: a 4 MiB part's blocks at {rate:.1f} GB/s in one call, "
                                 f"one 16 KiB page alone {single:.1f} us"})  # fmt: skip
            proxy = _Proxy(server.port, 0.02)
            opts = dict(server.options, endpoint=proxy.endpoint)
            pids = [server.proc.pid, proxy.pid]
            if pinned:
                rows.extend(_pinned_rows(url, opts, tmp, local, pids, pinned=True))
                rows.extend(_pinned_rows(url, opts, tmp, local, pids, pinned=False))
                return rows
            for case in _cases(quick, large):
                rows.extend(_blocks_rows(url, opts, tmp, local, case, pids, fresh))
            if not large:
                rows.extend(_global_rows(url, opts, tmp, local, 8 if quick else 24))
        finally:
            if proxy is not None:
                proxy.close()
            server.stop()
            if saved is None:
                os.environ.pop("MMPACK_CACHE_DIR", None)
            else:
                os.environ["MMPACK_CACHE_DIR"] = saved
    rows.append({"case": f"load average {os.getloadavg()[0]:.1f} at the end"})
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table(
        "one fetch per block",
        run(
            quick="--quick" in sys.argv, large="--large" in sys.argv, pinned="--pinned" in sys.argv
        ),
    )
