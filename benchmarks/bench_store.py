"""Store build: tokens/s writing a store, against ``ndarray.tofile`` of the same tokens.

Corpus: C4-like document lengths, lognormal(mu=5.48, sigma=1.15) (median ~240 tokens), uint16
tokens.  Cases: ``build`` from a list of numpy arrays (slices of one array, as ``np.split``
gives: adjacent in memory), from a list of separately allocated copies of them, from a
generator of the arrays, and ``StoreWriter.add_batch`` of flat tokens; each with
``fsync=False`` so that it is compared with ``tofile`` (which does not fsync either), and
``build`` once with the default ``fsync=True``.  Each pair (``tofile``, case) runs alternately;
``ratio`` is the median of the per-pair wall-clock ratios, ``cpu ratio`` the same with process
CPU time (all threads), which a machine loaded by other work disturbs less.  Memory: tracemalloc
peak of a generator build, against the corpus size.

``--stdlib`` builds a real tokenized corpus instead: the Python standard library's ``.py`` files
(one document each, ~1,800 documents, ~9M tokens) tokenized by a byte-level BPE of 8000 ids
trained locally (``tokenizers``; nothing is downloaded; tokenizing is not timed), built from a
list of uint16 arrays (one allocation each, as a tokenizer's output converted document by
document gives) and from a generator of them, and the same as int64 arrays (what
``np.array(ids)`` gives) with ``dtype=None``; paired with ``tofile`` as above.

``--profile`` prints where a build's time goes, each stage measured alone and alternated with
``tofile`` (medians, ms): XXH64 of every 16 MiB block in memory; the whole build from the list
and from a generator (wall, process CPU, and the CPU time of each thread: the caller's, the
writer's (``pwritev``) and the hasher's (blocks read back from the file)); the caller's thread
alone taking, checking and handing over the documents (writes stubbed out); and two floors of
any per-document copy from Python, main-thread CPU: ``list(map(BytesIO.write, chunk))`` (one
C-level buffer export and copy a document, no check, in 4096-document chunks into a reused
buffer) and the same through a Python ``for`` loop with the checks a generator needs (``type``,
``ndim``, ``dtype``).

Run ``python -m benchmarks.bench_store [--quick] [--profile | --stdlib]``.
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

from mmpack import build
from mmpack.store import StoreWriter


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

    from mmpack._src.store.stripe_writer import StripeWriter

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
        mock.patch.object(StripeWriter, "_write", timed(StripeWriter._write, "writer")),
        mock.patch.object(StripeWriter, "_digest", timed(StripeWriter._digest, "hasher")),
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

    from mmpack._src.store.format import STRIPE_BYTES
    from mmpack._src.store.integrity import stripe_digest
    from mmpack._src.store.stripe_writer import StripeWriter

    docs, flat = _corpus(20_000_000 if quick else 200_000_000)
    raw = flat.view(np.uint8)
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-store-"))

    def gather(gen: bool) -> float:  # the main thread alone: take, check, hand over, offsets
        with mock.patch.object(
            StripeWriter, "_write", lambda self, pieces, ends, at: pieces.clear()
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
                        stripe_digest(raw[a : a + STRIPE_BYTES])
                        for a in range(0, raw.size, STRIPE_BYTES)
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


def _stdlib_corpus(max_bytes: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The standard library's sources (up to ``max_bytes`` of text) tokenized: one uint16 array
    per file, each its own allocation, and the tokens back to back."""
    from tokenizers import Tokenizer

    from benchmarks.bench_ingest import _train
    from mmpack.cli import stdlib_sources

    texts: list[str] = []
    for path in stdlib_sources():
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        if sum(map(len, texts)) >= max_bytes:
            break
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-store-tok-"))
    try:
        tok = Tokenizer.from_file(str(_train(texts, tmp)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    docs = [np.array(e.ids, dtype=np.uint16) for e in tok.encode_batch(texts)]
    return docs, np.concatenate(docs)


def stdlib_rows(quick: bool = False, repeats: int = 7) -> list[dict[str, Any]]:
    """Builds of the tokenized standard library against ``tofile`` (see the module docstring)."""
    docs, flat = _stdlib_corpus(8_000_000 if quick else 1 << 40)
    wide = [d.astype(np.int64) for d in docs]
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-store-"))
    rows: list[dict[str, Any]] = []
    try:
        target = tmp / "s"

        def case(src: list[np.ndarray], gen: bool, dtype: Any):
            def run() -> None:
                items = (d for d in src) if gen else src
                build(target, items, overwrite=True, fsync=False, dtype=dtype)

            return run

        build(tmp / "warm", docs[:100], fsync=False)  # compile the open-time kernel
        for name, fn in [
            ("build(list of uint16 arrays), dtype=uint16", case(docs, False, np.uint16)),
            ("build(generator of uint16 arrays), dtype=uint16", case(docs, True, np.uint16)),
            ("build(list of int64 arrays)", case(wide, False, None)),
            ("build(generator of int64 arrays)", case(wide, True, None)),
        ]:
            fn()  # the first build of a case pays its first-use costs
            t, floor, ratio, cpu_ratio = _paired(fn, lambda: flat.tofile(tmp / "raw.bin"), repeats)
            rows.append(
                {
                    "case": f"stdlib, {len(docs)} documents: {name}",
                    "tokens": flat.size,
                    "ms (median)": t * 1e3,
                    "Mtok/s": flat.size / t / 1e6,
                    "floor Mtok/s (tofile)": flat.size / floor / 1e6,
                    "ratio": ratio,
                    "cpu ratio": cpu_ratio,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    if "--profile" in sys.argv:
        print_table("store build profile", profile(quick="--quick" in sys.argv))
    elif "--stdlib" in sys.argv:
        print_table("store build, tokenized stdlib", stdlib_rows(quick="--quick" in sys.argv))
    else:
        print_table("store build", run(quick="--quick" in sys.argv))
