"""Window random access against the physical floor, measured side by side.

* ``ds[i]``: one window, seqlen 2048 + 1 label token, eot inserted, C4-like documents
  (lognormal(5.48, 1.15), 10M documents in the full run, 50k in ``--quick``), against the floor
  ``raw[s:s+W].copy()`` on a plain ``np.frombuffer`` view of the same mapped bytes: p50, p99, ratio;
  int64 and ``dtype="int32"`` outputs, interleaved with the floor (:func:`side_by_side`) after an
  untimed pass over every sample and slice (``benchmarks.bench_getitem`` profiles the same call).
* ``__getitems__`` of 64/128/256 windows: tokens/s against copying the same bytes window by window
  into a reused buffer (``buf[k] = raw[s:s+W]``), and against a numba loop doing that copy with the
  cast to int64 (the strictest floor: no Python per window).
* Zarr batched reads against memmap: the same 300 shuffled batches of 32 windows (seqlen 2048 + 1)
  from one corpus written three ways (memmap, sharded Zarr, sharded Zarr with zstd; 1M C4-like
  documents, ~465M tokens, in the full run; 50k in ``--quick``), ``__getitems__`` timed alternately, two passes
  over the same batches with a fresh Zarr reader: for the default sharded store the first pass
  checks every chunk's crc32c on first touch, the second reads checked chunks (no cache is
  involved, whatever ``MMPACK_ZARR_CACHE_MB`` says); for zstd, decoded chunks go through the
  LRU (256 MiB by default; the second pass is cached only when the decoded store fits it:
  --quick, not the full run); ratio = memmap time / Zarr time (target >= 0.25).  Run only this
  case with ``--zarr``.
* Lookup cost against the number of documents (10^4 .. 10^8 in the full run, 10^4 .. 10^5 in ``--quick``): ns per
  window resolution (binary search over the mapped offsets), and ``ds[i]`` p50, to show the
  O(log n) curve stays flat.

Run ``python -m benchmarks.bench_window [--quick] [--zarr]``.
"""

from __future__ import annotations

import mmap
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import median_p99, per_call_seconds, per_item_seconds
from mmpack import WindowDataset
from mmpack._src.kernels._jit import njit
from mmpack._src.kernels.window import window_ranges
from mmpack.store import StoreWriter

SEQLEN = 2048
EOT = 50256


@njit
def _copy_floor(raw: np.ndarray, starts: np.ndarray, width: int, out: np.ndarray) -> None:
    for k in range(starts.shape[0]):
        src = raw[starts[k] : starts[k] + width]
        dst = out[k]
        for q in range(width):
            dst[q] = src[q]


def _lengths(n_docs: int, mu: float, sigma: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(rng.lognormal(mu, sigma, size=n_docs).astype(np.int64), 1)


def _make_store(path: Path, lens: np.ndarray, backend: str = "memmap") -> Any:
    """A store with the given document lengths; token values are a cheap deterministic pattern."""
    with StoreWriter(path, dtype=np.uint16, fsync=False, backend=backend) as w:
        pattern = (np.arange(1 << 24) % 50000).astype(np.uint16)
        step = 1 << 16
        for a in range(0, lens.size, step):
            part = lens[a : a + step]
            total = int(part.sum())
            tokens = np.resize(pattern, total) if total > pattern.size else pattern[:total]
            w.add_batch(tokens, part)
    return w.store


def _raw_view(store) -> np.ndarray:
    f = open(store.path / "tokens.bin", "rb")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=np.uint16)


def side_by_side(
    cases: dict[str, tuple[Any, Any]], rounds: int = 40, warm: bool = True
) -> dict[str, np.ndarray]:
    """Per-call seconds of every case ``name: (fn, items)``, interleaved: round ``r`` times
    items ``[r * k, (r + 1) * k)`` of each case in turn (``k = len(items) // rounds``), so load
    on the machine hits every case alike; first one untimed pass over all items of every case
    when ``warm`` (no case pays first-touch page faults inside the timing)."""
    clock = time.perf_counter_ns
    if warm:
        for fn, items in cases.values():
            for x in items:
                fn(x)
    out: dict[str, list[np.ndarray]] = {name: [] for name in cases}
    for r in range(rounds):
        for name, (fn, items) in cases.items():
            k = len(items) // rounds
            chunk = items[r * k : (r + 1) * k]
            t = np.empty(len(chunk))
            for q, x in enumerate(chunk):
                t0 = clock()
                fn(x)
                t[q] = clock() - t0
            out[name].append(t)
    return {name: np.concatenate(v) * 1e-9 for name, v in out.items()}


def _access_rows(store, label: str, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    ds = WindowDataset(store, SEQLEN, eot=EOT, labels=True)
    narrow = WindowDataset(store, SEQLEN, eot=EOT, labels=True, dtype="int32")
    raw = _raw_view(store)
    width = SEQLEN + 1
    rng = np.random.default_rng(1)
    n_single = 20_000 if quick else 100_000
    idx = rng.integers(0, len(ds), size=n_single)
    raw_starts = rng.integers(0, raw.size - width, size=n_single)
    # ds[i] (int64 and int32) and the floor interleaved, after a pass that touches every page.
    secs = side_by_side(
        {
            "int64": (ds.__getitem__, idx.tolist()),
            "int32": (narrow.__getitem__, idx.tolist()),
            "floor": (lambda s: raw[s : s + width].copy(), raw_starts.tolist()),
        }
    )
    f50 = float(np.median(secs["floor"]))
    for name in ("int64", "int32"):
        o50, o99 = median_p99(secs[name])
        rows.append(
            {
                "case": f"ds[i] {name} ({label})" if name == "int32" else f"ds[i] ({label})",
                "p50 us": o50 * 1e6,
                "p99 us": o99 * 1e6,
                "floor p50 us": f50 * 1e6,
                "floor": "raw[s:s+W].copy()",
                "ratio": o50 / f50,
                "target": "ratio <= 3, p50 <= 3 us",
                "met": o50 / f50 <= 3 and o50 <= 3e-6,
            }
        )
    for batch in (64, 128, 256):
        calls = 40 if quick else 200
        batches = rng.integers(0, len(ds), size=(calls, batch))
        vstarts = batches * SEQLEN
        starts = np.empty(batch, dtype=np.int64)
        lens = np.empty(batch, dtype=np.int64)
        buf = np.empty((batch, width), dtype=np.uint16)
        buf64 = np.empty((batch, width), dtype=np.int64)
        flat_starts = []
        for row in vstarts:  # the flat ranges of the same windows: the floors copy those bytes
            window_ranges(store.offsets, ds._top, 1, row, width, ds.total, starts, lens)
            flat_starts.append(np.minimum(starts.copy(), raw.size - width))
        counter = iter(range(10**9))

        def gather() -> None:
            ds.__getitems__(batches[next(counter) % calls])

        def numpy_floor() -> None:
            for k, s in enumerate(flat_starts[next(counter) % calls]):
                buf[k] = raw[s : s + width]

        def kernel_floor() -> None:
            _copy_floor(raw, flat_starts[next(counter) % calls], width, buf64)

        t_ours = median_p99(per_call_seconds(gather, calls))
        t_np = median_p99(per_call_seconds(numpy_floor, calls))
        t_k = median_p99(per_call_seconds(kernel_floor, calls))
        tokens = batch * SEQLEN
        rows.append(
            {
                "case": f"__getitems__ x{batch} ({label})",
                "Mtok/s": tokens / t_ours[0] / 1e6,
                "p99 Mtok/s": tokens / t_ours[1] / 1e6,
                "floor Mtok/s": tokens / t_np[0] / 1e6,
                "floor": "buf[k] = raw[s:s+W] (reused)",
                "ratio": t_np[0] / t_ours[0],
                "target": ">= 0.7 of floor",
                "met": t_np[0] / t_ours[0] >= 0.7,
                "vs numba copy+cast": t_k[0] / t_ours[0],
            }
        )
    return rows


def _zarr_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    """Zarr ``__getitems__`` of shuffled 32-window batches against memmap, same batches: the
    default sharded store (first touch of every chunk: crc32c checked; then checked chunks),
    and a zstd one (decoded chunks through the LRU: cached when the store fits it)."""
    import mmpack._src.store.backends._zarr as zarr_backend

    n_docs = 50_000 if quick else 1_000_000
    lens = _lengths(n_docs, 5.48, 1.15)
    mem = _make_store(tmp / "zm", lens)
    zst = _make_store(tmp / "zz", lens, backend="zarr")
    level, zarr_backend.ZSTD_LEVEL = zarr_backend.ZSTD_LEVEL, 3
    try:
        zzs = _make_store(tmp / "zs", lens, backend="zarr")
    finally:
        zarr_backend.ZSTD_LEVEL = level
    rows = _zarr_pair(mem, zst, "sharded", ("first touch (crc32c checked)", "checked chunks"))
    rows += _zarr_pair(mem, zzs, "sharded+zstd", ("LRU cold", "LRU warm if the store fits"))
    return rows


def _zarr_pair(mem: Any, zst: Any, name: str, labels: tuple[str, str]) -> list[dict[str, Any]]:
    from mmpack import open as open_store
    from mmpack._src.store.backends._chunk_cache import get_cache

    batch, calls = 32, 300
    dss = {
        name: WindowDataset(st, SEQLEN, eot=EOT, labels=True)
        for name, st in (("memmap", mem), ("zarr", zst))
    }
    rng = np.random.default_rng(7)
    batches = rng.integers(0, len(dss["memmap"]), size=(calls, batch))
    for k in range(0, calls, 8):  # same samples from both (and compiles the kernels)
        a, b = dss["memmap"].__getitems__(batches[k]), dss["zarr"].__getitems__(batches[k])
        assert a.columns.keys() == b.columns.keys()
        assert all(np.array_equal(a.columns[key], b.columns[key]) for key in a.columns)
    dss["memmap"].__getitems__(batches.ravel())  # memmap: page cache warm for both passes
    zst = open_store(zst.path)  # a fresh reader: no chunk checked yet
    dss["zarr"] = WindowDataset(zst, SEQLEN, eot=EOT, labels=True)
    get_cache().clear()
    rows: list[dict[str, Any]] = []
    clock = time.perf_counter
    for label in labels:
        secs: dict[str, list[float]] = {"memmap": [], "zarr": []}
        for row in batches:
            for key in ("memmap", "zarr"):  # alternated, so drift hits both alike
                t0 = clock()
                dss[key].__getitems__(row)
                secs[key].append(clock() - t0)
        m, z = float(np.median(secs["memmap"])), float(np.median(secs["zarr"]))
        rows.append(
            {
                "case": f"zarr ({name}) vs memmap __getitems__ x{batch}, {label}",
                "tokens": zst.num_tokens,
                "zarr p50 ms": z * 1e3,
                "memmap p50 ms": m * 1e3,
                "ratio": m / z,
                "ratio of means": float(np.mean(secs["memmap"])) / float(np.mean(secs["zarr"])),
                "target": ">= 0.25",
                "met": m / z >= 0.25,
                "cache MiB": get_cache().nbytes / 2**20,
            }
        )
    return rows


def _scaling_rows(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    top = 5 if quick else 8
    for exp in range(4, top + 1):
        n_docs = 10**exp
        # Short documents (mean ~20 tokens) keep the 10^8-document store at ~4 GB.
        lens = _lengths(n_docs, 2.6, 0.8, seed=exp)
        store = _make_store(tmp / f"scale{exp}", lens)
        rng = np.random.default_rng(exp)
        row: dict[str, Any] = {"case": f"{n_docs:.0e} documents"}
        for label, flag in (("", False), (" (sampled index)", True)):
            ds = WindowDataset(store, SEQLEN, eot=EOT, labels=True, sampled_index=flag)
            vstarts = rng.integers(0, max(ds.total - SEQLEN - 1, 1), size=1 << 16)
            starts = np.empty_like(vstarts)
            lens_out = np.empty_like(vstarts)
            t = median_p99(
                per_call_seconds(
                    lambda: window_ranges(
                        store.offsets, ds._top, 1, vstarts, SEQLEN + 1, ds.total, starts, lens_out
                    ),
                    10 if quick else 30,
                )
            )
            idx = rng.integers(0, len(ds), size=5000 if quick else 20_000)
            single = median_p99(per_item_seconds(lambda i: ds[int(i)], idx))
            row[f"resolve ns{label}"] = t[0] / vstarts.size * 1e9
            row[f"ds[i] p50 us{label}"] = single[0] * 1e6
        rows.append(row)
        shutil.rmtree(tmp / f"scale{exp}", ignore_errors=True)
    return rows


def run(quick: bool = False, zarr_only: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-window-"))
    try:
        if zarr_only:
            return _zarr_rows(tmp, quick)
        n_docs = 50_000 if quick else 10_000_000
        store = _make_store(tmp / "c4", _lengths(n_docs, 5.48, 1.15))
        label = f"{n_docs:.0e} C4-like docs, {store.num_tokens / 1e9:.2f}B tokens"
        rows = _access_rows(store, label, quick)
        del store
        shutil.rmtree(tmp / "c4", ignore_errors=True)
        rows += _zarr_rows(tmp, quick)
        shutil.rmtree(tmp / "zm", ignore_errors=True)
        shutil.rmtree(tmp / "zz", ignore_errors=True)
        rows += _scaling_rows(tmp, quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def plot(rows: list[dict[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = [r for r in rows if "resolve ns" in r]
    if not scale:
        return
    docs = [float(r["case"].split()[0]) for r in scale]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.semilogx(docs, [r["resolve ns"] for r in scale], "o-", label="resolve: binary search")
    ax.semilogx(
        docs,
        [r["resolve ns (sampled index)"] for r in scale],
        "s-",
        label="resolve: sampled index + search",
    )
    ax.set_xlabel("documents in the store")
    ax.set_ylabel("ns")
    ax.set_ylim(bottom=0)
    ax.set_title("Window lookup cost vs corpus size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "window_scaling.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("window access", run(quick="--quick" in sys.argv, zarr_only="--zarr" in sys.argv))
