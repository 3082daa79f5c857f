"""Store build: tokens/s writing a store, against ``ndarray.tofile`` of the same tokens.

Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens), uint16
tokens.  Cases: ``build`` from a list of numpy arrays (slices of one array, as
``np.split`` gives: adjacent in memory), from a list of separately allocated copies of them,
from a generator of Python lists' worth of
arrays, and ``StoreWriter.add_batch`` of flat tokens; each with ``fsync=False`` so that it is
compared with ``tofile`` (which does not fsync either), and ``build`` once with the default
``fsync=True``.  Each pair (``tofile``, case) runs alternately; ``ratio`` is the median of the
per-pair wall-clock ratios, ``cpu ratio`` the same with process CPU time (all threads), which a
machine loaded by other work disturbs less.  Memory: tracemalloc peak of a generator build,
against the corpus size.

``--profile`` prints instead where a build's time goes, each stage measured alone and
alternated with ``tofile`` (medians, ms): XXH64 of every 16 MiB block in memory; the whole build
from the list and from a generator (wall, process CPU, and the CPU time of each thread: the
caller's, the writer's (``pwritev``) and the hasher's (blocks read back from the file)); the
caller's thread alone taking, checking and handing over the documents (writes stubbed out); and
two floors of any per-document copy from Python, main-thread CPU: ``list(map(BytesIO.write,
chunk))`` (one C-level buffer export and copy a document, no check, in 4096-document chunks into
a reused buffer) and the same through a Python ``for`` loop with the checks a generator needs
(``type``, ``ndim``, ``dtype``).

Measured (2026-11-30, 430k documents, 400 MB, a 2-core VM loaded by other work, load 2.4-3.2),
``--profile``: ``tofile`` 83 ms CPU; build(list) 192 ms CPU: caller's thread 69 (taking the
documents 21: one kernel pass over the list and array objects, no Python work per document;
replacing the previous store ~30), writer 71, hasher 41; build(generator) 300 ms CPU: caller's
thread 177 (taking 124 against the 68 ms floor of one copy a document from Python; the
generator itself and ``tee`` make most of the rest), writer 73, hasher 40.  Before this design
(documents copied into the block by ``np.concatenate``, then hashed and written on one thread)
the caller's thread took ~158 ms of a ~251 ms total for the list.  Alternating processes of the
old and the new writer (paired ratios to ``tofile``, 5 pairs each): list 0.25-0.33 before,
0.47-0.93 after (CPU ratio 0.42-0.52); generator 0.28-0.29 before, 0.28-0.30 after; ``add_batch``
0.48-0.61 before, 0.58-0.62 after.  Full runs of this benchmark after the change: at load
2.4-2.7 list 0.490 (CPU 0.465), generator 0.254 (0.281), ``add_batch`` 0.320 (0.536); at load
4.7-4.8 list 0.469 (0.425), generator 0.282 (0.286), ``add_batch`` 0.679 (0.591); and with the
per-build fixed cost cut (libc looked up once: the swap spawned ``ldconfig`` every overwrite,
~10 ms; a 100-document build 24 -> 8 ms), at load 1.6-1.8: list 0.590 (0.468), generator 0.376
(0.280), ``add_batch`` 0.736 (0.565); ``--profile`` then: ``tofile`` 98 ms, build(list) 154 ms
wall, 188 CPU (caller 64, writer 78, hasher 41), build(generator) 245 wall, 327 CPU (caller
189: taking the documents 141, the floor of one copy a document 72; writer 89, hasher 41).  The
final old/new alternation at load 1.0: list 0.382 -> 0.585 (CPU 0.265 -> 0.481), generator
0.372 -> 0.381 (0.260 -> 0.299), ``add_batch`` 0.568 -> 0.687; a list of separately allocated
arrays 0.342 -> 0.442 (0.257 -> 0.360) with one iovec each (~100 ns a document more in the
kernel), 0.517 once they are copied into the staging block by one kernel pass instead.  Full run
at load 1.0, final: list 0.614 (CPU 0.490), separately allocated 0.513 (0.358), generator 0.431
(0.327), ``add_batch`` 0.816 (0.607); ``--profile``: ``tofile`` 82 ms; build(list) 137 wall, 171
CPU (caller 56: taking 19, replacing the previous store ~30; writer 68; hasher 43);
build(generator) 222 wall, 287 CPU (caller 160: taking 109 against the 67 ms floor of one copy a
document; writer 70; hasher 41).  Missed: the generator (by ~0.07 at load 1, more when loaded):
its caller's thread alone (~160 ms: a generator's resume and one buffer export and copy a
document, which a source that may refill its array requires the moment it yields, plus ~30
replacing the previous store, which ``tofile`` pays too as its truncation) is about twice
``tofile``; the writer and hasher threads (~110 ms) overlap it only where a core is free.  Tried
and dropped: an anonymous ``mmap`` with ``mmap.write`` as the block (~200 ms against ~150), a
``BytesIO`` holding the block (no gain: the per-document checks cost what the copy saved), a
``dict.setdefault`` pass-through instead of ``tee`` (slower), ``MAP_POPULATE`` when hashing from
the file (+7 ms).

Run ``python -m benchmarks.bench_store [--quick] [--profile]``.
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.store.writer import StoreWriter, build


def _corpus(num_tokens: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.maximum(rng.lognormal(5.48, 1.15, size=num_tokens // 200).astype(np.int64), 1)
    lens = lens[np.cumsum(lens) <= num_tokens]
    flat = (np.arange(int(lens.sum()), dtype=np.int64) * 7919 % 50257).astype(np.uint16)
    docs = np.split(flat, np.cumsum(lens)[:-1])
    return docs, flat


def _seconds(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _paired(fn, floor_fn, repeats: int) -> tuple[float, float, float, float]:
    """Median seconds of ``fn`` and of ``floor_fn`` run alternately, and the medians of the
    per-pair ratios floor/fn in wall-clock and in CPU time (alternating cancels most of the
    machine's drift)."""
    ours, floors, ratios, cpu_ratios = [], [], [], []
    for _ in range(repeats):
        f, fc = _seconds(floor_fn)
        t, tc = _seconds(fn)
        ours.append(t)
        floors.append(f)
        ratios.append(f / t)
        cpu_ratios.append(fc / tc)
    return (
        float(np.median(ours)),
        float(np.median(floors)),
        float(np.median(ratios)),
        float(np.median(cpu_ratios)),
    )


def run(quick: bool = False) -> list[dict[str, Any]]:
    num_tokens = 20_000_000 if quick else 200_000_000
    repeats = 5
    docs, flat = _corpus(num_tokens)
    lens = np.fromiter((d.size for d in docs), dtype=np.int64, count=len(docs))
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-store-"))
    rows: list[dict[str, Any]] = []
    try:
        target = tmp / "s"

        def raw_write() -> None:
            flat.tofile(tmp / "raw.bin")

        def from_list(fsync: bool = False) -> None:
            build(target, docs, overwrite=True, fsync=fsync)

        separate = [d.copy() for d in docs]  # each its own allocation: apart in memory

        def from_separate() -> None:
            build(target, separate, overwrite=True, fsync=False)

        def from_generator() -> None:
            build(target, (d for d in docs), overwrite=True, fsync=False)

        def from_batches() -> None:
            with StoreWriter(target, overwrite=True, fsync=False) as w:
                step = 100_000
                ends = np.concatenate([[0], np.cumsum(lens)])
                for a in range(0, len(lens), step):
                    b = min(a + step, len(lens))
                    w.add_batch(flat[ends[a] : ends[b]], lens[a:b])

        build(tmp / "warm", docs[:100], fsync=False)  # compile the open-time kernel
        ntok = flat.size
        for name, fn in [
            ("build(list of arrays)", from_list),
            ("build(list of separately allocated arrays)", from_separate),
            ("build(generator)", from_generator),
            ("StoreWriter.add_batch", from_batches),
            ("build(list), fsync=True", lambda: from_list(True)),
        ]:
            t, floor, ratio, cpu_ratio = _paired(fn, raw_write, repeats)
            checked = "fsync" not in name
            rows.append(
                {
                    "case": name,
                    "tokens": ntok,
                    "Mtok/s": ntok / t / 1e6,
                    "floor Mtok/s (tofile)": ntok / floor / 1e6,
                    "ratio": ratio,
                    "cpu ratio": cpu_ratio,
                    "target": ">= 0.5" if checked else "",
                    "met": (ratio >= 0.5) if checked else "",
                }
            )

        tracemalloc.start()
        build(target, (d for d in docs), overwrite=True, fsync=False, buffer_tokens=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append(
            {
                "case": "generator build, buffer 2**20 tokens: peak traced MiB",
                "tokens": ntok,
                "Mtok/s": "",
                "ratio": peak / flat.nbytes,
                "target": "bounded (peak / corpus bytes << 1)",
                "met": peak < 64 << 20,
                "peak MiB": peak / 2**20,
            }
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _copy_floors(docs: list[np.ndarray], chunk: int = 4096) -> dict[str, float]:
    """Main-thread CPU seconds of the two per-document copy floors (module docstring)."""
    buf = io.BytesIO()
    buf.write(bytes(2 * max(d.nbytes for d in docs) + (32 << 20)))  # reused, never regrown
    out: dict[str, float] = {}
    c = time.thread_time()
    for a in range(0, len(docs), chunk):
        buf.seek(0)
        np.array(list(map(buf.write, docs[a : a + chunk])), dtype=np.int64)  # type: ignore[arg-type]  # numpy stubs: no __buffer__
    out["floor: map(BytesIO.write) per document, main-thread CPU"] = time.thread_time() - c
    nd, dt = np.ndarray, docs[0].dtype
    c = time.thread_time()
    for a in range(0, len(docs), chunk):
        buf.seek(0)
        sizes: list[int] = []
        push, write = sizes.append, buf.write
        for d in docs[a : a + chunk]:
            if type(d) is nd and d.ndim == 1 and d.dtype is dt:
                push(write(d))  # type: ignore[arg-type]  # numpy stubs: no __buffer__
        np.array(sizes, dtype=np.int64)
    out["floor: checked loop + BytesIO.write, main-thread CPU"] = time.thread_time() - c
    return out


def _threads_cpu(fn) -> dict[str, float]:
    """Run ``fn`` (a build); seconds of wall, process CPU, and the CPU time of each thread: the
    caller's (``main``), the writer's (``pwritev``) and the hasher's (block digests read back
    from the file)."""
    from unittest import mock

    from mmpack.store.blockwriter import BlockWriter

    acc = {"writer": 0.0, "hasher": 0.0}

    def timed(orig, key):
        def run(*args, **kwargs):
            c = time.thread_time()
            try:
                return orig(*args, **kwargs)
            finally:
                acc[key] += time.thread_time() - c

        return run

    with (
        mock.patch.object(BlockWriter, "_write", timed(BlockWriter._write, "writer")),
        mock.patch.object(BlockWriter, "_write_iov", timed(BlockWriter._write_iov, "writer")),
        mock.patch.object(BlockWriter, "_digest", timed(BlockWriter._digest, "hasher")),
    ):
        w0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        fn()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        main = time.thread_time() - m0
    return {
        "wall": wall,
        "CPU": cpu,
        "main-thread CPU": main,
        **{k + " CPU": v for k, v in acc.items()},
    }


def profile(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Where the time of a list and a generator build goes (see the module docstring)."""
    from unittest import mock

    from mmpack.store.blockwriter import BlockWriter
    from mmpack.store.format import BLOCK_BYTES
    from mmpack.store.integrity import block_digest

    docs, flat = _corpus(20_000_000 if quick else 200_000_000)
    raw = flat.view(np.uint8)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-store-"))

    def gather(gen: bool) -> float:  # the main thread alone: take, check, hand over, offsets
        with (
            mock.patch.object(BlockWriter, "_write", lambda self, pieces, ends, at: pieces.clear()),
            mock.patch.object(
                BlockWriter, "_write_iov", lambda self, iov, keep, at, n: keep.clear()
            ),
        ):
            w = StoreWriter(tmp / "g", overwrite=True, fsync=False, dtype=flat.dtype).__enter__()
            try:
                c = time.thread_time()
                w.add_many((d for d in docs) if gen else docs)
                return time.thread_time() - c
            finally:
                w._cleanup()  # discarded, never committed

    stages: dict[str, list[float]] = {}
    try:
        build(tmp / "warm", docs[:100], fsync=False)
        for _ in range(repeats):
            for name, fn in [
                ("tofile", lambda: flat.tofile(tmp / "raw.bin")),
                (
                    "hash in memory (XXH64, 16 MiB blocks)",
                    lambda: [
                        block_digest("xxh64", raw[a : a + BLOCK_BYTES])
                        for a in range(0, raw.size, BLOCK_BYTES)
                    ],
                ),
            ]:
                wall, cpu = _seconds(fn)
                stages.setdefault(name + ": wall", []).append(wall)
                stages.setdefault(name + ": CPU", []).append(cpu)
            for name, fn in [
                ("build(list)", lambda: build(tmp / "s", docs, overwrite=True, fsync=False)),
                (
                    "build(generator)",
                    lambda: build(tmp / "s", (d for d in docs), overwrite=True, fsync=False),
                ),
            ]:
                for key, value in _threads_cpu(fn).items():
                    stages.setdefault(f"{name}: {key}", []).append(value)
            for gen in (False, True):
                key = f"take+check+hand over ({'generator' if gen else 'list'}), main-thread CPU"
                stages.setdefault(key, []).append(gather(gen))
            for name, floor in _copy_floors(docs).items():
                stages.setdefault(name, []).append(floor)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [{"stage": k, "ms (median)": float(np.median(v)) * 1e3} for k, v in stages.items()]


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    if "--profile" in sys.argv:
        print_table("store build profile", profile(quick="--quick" in sys.argv))
    else:
        print_table("store build", run(quick="--quick" in sys.argv))
