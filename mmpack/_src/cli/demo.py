"""The demo (``mmpack demo``): the whole pipeline on a corpus every Python installation carries.

Builds a store from the Python standard library's own source files (one document per file,
UTF-8 bytes as tokens, eot 256), then prints what it holds, how many window samples each
(seqlen, stride) gives, a few windows decoded, packing statistics (best-fit decreasing and
streaming best fit against plain padding and concatenate-and-chunk) at seqlen 2048 and 8192, a
packed row's ``cu_seqlens``, and how fast random access is.  Nothing is downloaded; the run takes
seconds (the first one also compiles the numba kernels, cached for the next).

:func:`compare_packing` (the table of ``mmpack pack``) lives here too.
"""

from __future__ import annotations

import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = ["compare_packing", "run_demo", "stdlib_sources"]


def stdlib_sources() -> list[Path]:
    """The standard library's ``.py`` files (without site-packages), sorted: a real corpus of
    about 1,800 documents and 30 MB that is always there."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    )


def compare_packing(
    doc_lens: Any,
    seqlen: int,
    *,
    add_eot: bool = True,
    long_docs: str = "split",
    lookahead: int = 1024,
    algorithms: tuple[str, ...] = ("bfd", "online"),
) -> list[dict[str, Any]]:
    """Rows, efficiency and padding of each packing algorithm against two baselines.

    Parameters
    ----------
    doc_lens : array-like of int, shape (n_docs,)
    seqlen : int
    add_eot : bool
        An end-of-text token follows every document (takes a slot).
    long_docs : {"split", "truncate", "drop"}
        Documents longer than a row, for every method alike.
    lookahead : int
        Open rows of ``"online"``.
    algorithms : tuple of str
        Names accepted by :func:`mmpack.packing.build_plan`.

    Returns
    -------
    list of dict
        One per method (the algorithms, then ``"pad"``: one document per row padded to
        ``seqlen``, long ones over several rows, and ``"chunk"``: the concatenation cut every
        ``seqlen`` tokens) with ``method``, ``rows``, ``tokens`` (slots holding data, eots
        included), ``padding``, ``efficiency`` (tokens / (rows * seqlen)), ``docs_cut``
        (documents spread over more than one row) and, for the algorithms, ``seconds``.
    """
    from mmpack._src.packing.plan import build_plan

    lens = np.asarray(doc_lens, dtype=np.int64)
    rows: list[dict[str, Any]] = []
    for algorithm in algorithms:
        kw = {"lookahead": lookahead} if algorithm == "online" else {}
        # Compile (or load from numba's cache) on a toy input so the timing is the packing only.
        build_plan(
            lens[:2], seqlen, add_eot=add_eot, long_docs=long_docs, algorithm=algorithm, **kw
        )
        t0 = time.perf_counter()
        plan = build_plan(
            lens, seqlen, add_eot=add_eot, long_docs=long_docs, algorithm=algorithm, **kw
        )
        seconds = time.perf_counter() - t0
        st = plan.stats
        rows.append(
            {
                "method": algorithm,
                "rows": st.n_bins,
                "tokens": st.n_tokens,
                "docs_cut": st.n_split,
                "seconds": seconds,
            }
        )
    slots = lens + int(add_eot)
    if long_docs == "truncate":
        slots = np.minimum(slots, seqlen)
    elif long_docs == "drop":
        slots = np.where(slots > seqlen, 0, slots)
    tokens = int(slots.sum())
    rows.append(
        {
            "method": "pad",
            "rows": int((-(-slots // seqlen)).sum()),
            "tokens": tokens,
            "docs_cut": int((slots > seqlen).sum()),
        }
    )
    starts = np.cumsum(slots) - slots
    nz = slots > 0
    cut = int((starts[nz] // seqlen != (starts[nz] + slots[nz] - 1) // seqlen).sum())
    rows.append(
        {"method": "chunk", "rows": -(-tokens // seqlen), "tokens": tokens, "docs_cut": cut}
    )
    for r in rows:
        capacity = r["rows"] * seqlen
        r["padding"] = capacity - r["tokens"]
        r["efficiency"] = r["tokens"] / capacity if capacity else 1.0
    return rows


def _p50_us(fn, n: int) -> float:
    times = np.empty(n)
    for k in range(n):
        t0 = time.perf_counter_ns()
        fn(k)
        times[k] = time.perf_counter_ns() - t0
    return float(np.median(times)) / 1e3


def run_demo(
    out: str | Path | None = None, *, overwrite: bool = False, file: TextIO | None = None
) -> dict[str, Any]:
    """Run the demo, printing to ``file`` (default stdout); returns the figures it printed.

    Parameters
    ----------
    out : path, optional
        Keep the store in ``out/stdlib``; default: a temporary folder, removed at the end.
    overwrite : bool
        Replace ``out/stdlib`` if it exists.
    """
    if out is None:
        with tempfile.TemporaryDirectory(prefix="mmpack-demo-") as tmp:
            return _run(Path(tmp) / "stdlib", overwrite, file or sys.stdout)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _run(out / "stdlib", overwrite, file or sys.stdout)


_EOT = 256  # the byte-level tokenizer's end-of-text id


def _run(path: Path, overwrite: bool, f: TextIO) -> dict[str, Any]:
    """The five sections of the demo, in order, printed to ``f``; the figures they print."""

    def say(*lines: str) -> None:
        for line in lines:
            print(line, file=f)
        f.flush()

    t_start = time.perf_counter()
    figures: dict[str, Any] = {}
    rng = np.random.default_rng(0)  # one stream for every random choice: the output repeats
    store, figures["build_seconds"] = _build(path, overwrite, say)
    _describe(store, path, say)
    figures["seed_windows"] = _windows(store, rng, say)
    figures["packing"], figures["packed_rows_2048"] = _packing(store, say)
    figures.update(_random_access(store, rng, say))
    figures["seconds"] = time.perf_counter() - t_start
    say("", f"done in {figures['seconds']:.1f} s; the store was at {path}")
    return figures


def _build(path: Path, overwrite: bool, say: Callable[..., None]) -> tuple[Any, float]:
    """1. Build the store of the standard library's sources at ``path``; it and the seconds."""
    from mmpack._src.ingest.pipeline import ingest

    files = stdlib_sources()
    say(
        f"== 1. Build: {len(files):,} files of the Python {sys.version.split()[0]} standard "
        f"library, one document per file, UTF-8 bytes as tokens (eot {_EOT})"
    )
    issues: list[str] = []
    report = ingest(
        files,
        path,
        format="text",
        workers=1,
        progress=False,
        overwrite=overwrite,
        on_issue=lambda issue: issues.append(str(issue)),
    )
    root = str(Path(sysconfig.get_paths()["stdlib"])) + "/"
    for line in issues:
        say(f"   skipped {line.replace(root, '')}")
    say(f"   {report.summary()}")
    assert report.store is not None  # ingest returns only once the store is written
    return report.store, report.seconds


def _describe(store: Any, path: Path, say: Callable[..., None]) -> None:
    """2. What the store holds: counts, size on disk, document length quantiles."""
    lens = store.doc_lens
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    q = np.quantile(lens, [0.1, 0.5, 0.9, 0.99])
    say(
        "",
        "== 2. The store",
        f"   {store!r}",
        f"   {len(store):,} documents, {store.num_tokens:,} tokens ({store.dtype.name}), "
        f"{size / 2**20:.1f} MiB on disk, fingerprint {store.fingerprint}",
        f"   document length: min {lens.min():,}  p10 {q[0]:,.0f}  p50 {q[1]:,.0f}  "
        f"p90 {q[2]:,.0f}  p99 {q[3]:,.0f}  max {lens.max():,}",
    )


def _windows(store: Any, rng: np.random.Generator, say: Callable[..., None]) -> int:
    """3. Window counts for a few (seqlen, stride), the count over ModernBERT's packer's ten
    documents, and three windows decoded; returns that count."""
    import mmpack
    from mmpack._src.ingest.tokenizer import ByteTokenizer
    from mmpack._src.views.window import WindowDataset

    total = store.num_tokens + len(store)
    say(
        "",
        f"== 3. Windows over the stream doc0 eot doc1 eot ... ({total:,} tokens with the "
        "eots): (total - seqlen) // stride + 1 samples",
    )
    for seqlen, stride in ((64, 64), (64, 32), (2048, 2048), (2048, 1024), (8192, 8192)):
        ds = WindowDataset(store, seqlen, stride, eot=_EOT)
        assert len(ds) == (total - seqlen) // stride + 1
        say(f"   seqlen {seqlen:>5}, stride {stride:>5}: {len(ds):>10,} samples")
    with tempfile.TemporaryDirectory(prefix="mmpack-seed-") as tmp:
        seed_lens = [15, 13, 11, 13, 15, 8, 14, 8, 11, 10]  # with their eot
        seed = mmpack.build(Path(tmp) / "seed", [list(range(n - 1)) for n in seed_lens])
        n_seed = len(WindowDataset(seed, 8, 4, eot=420))
    say(
        f"   the seed's ten documents (118 tokens with eot 420), seqlen 8, stride 4: "
        f"{n_seed} samples"
    )
    ds = WindowDataset(store, 64, eot=_EOT)
    tok = ByteTokenizer()
    say("", f"   three of the {len(ds):,} windows of 64 tokens, decoded:")
    for i in sorted(rng.choice(len(ds), 3, replace=False).tolist()):
        sample = ds[i]
        src = ", ".join(
            f"doc {p['doc']} [{p['start']}:{p['stop']}]" + (" + eot" if p["eot"] else "")
            for p in ds.locate(i)
        )
        say(
            f"   [{i}] from {src}: cu_seqlens {sample['cu_seqlens'].tolist()}",
            f"        {tok.decode(sample['input_ids'])!r}",
        )
    return n_seed


def _packing(store: Any, say: Callable[..., None]) -> tuple[dict[int, dict[str, float]], int]:
    """4. The packing table at seqlen 2048 and 8192 and one packed row shown; the efficiency
    of each method per seqlen and the number of packed rows at 2048."""
    from mmpack._src.views.packed import PackedDataset

    say("", "== 4. Packing whole documents into rows (an eot after each; long documents split)")
    efficiency: dict[int, dict[str, float]] = {}
    for seqlen in (2048, 8192):
        rows = compare_packing(store.doc_lens, seqlen, add_eot=True)
        efficiency[seqlen] = {r["method"]: r["efficiency"] for r in rows}
        say(
            f"   seqlen {seqlen}:  {'method':<8}{'rows':>9}{'efficiency':>12}{'padding':>14}"
            f"{'docs cut':>10}"
        )
        for r in rows:
            t = f"  ({r['seconds'] * 1e3:.1f} ms)" if "seconds" in r else ""
            say(
                f"   {'':14}{r['method']:<8}{r['rows']:>9,}{r['efficiency']:>11.1%}"
                f"{r['padding']:>14,}{r['docs_cut']:>10,}{t}"
            )
    say(
        "   bfd: best-fit decreasing over the whole store; online: best fit in store order over "
        "1024 open rows;",
        "   pad: one document per row; chunk: concatenate and cut (no padding, but documents "
        "cut at row edges).",
    )
    pk = PackedDataset(store, 2048, eot=_EOT)
    pieces = np.diff(pk.plan.bin_ptr)
    i = int(np.argmax(pieces >= 4)) if (pieces >= 4).any() else int(np.argmax(pieces))
    row = pk[i]
    cu = np.asarray(row["cu_seqlens"]).tolist()
    say(
        f"   packed row {i:,} of {len(pk):,} (seqlen 2048, bfd): {len(cu) - 1} segments, "
        f"cu_seqlens {cu},",
        "   from "
        + ", ".join(f"doc {p['doc']} [{p['start']}:{p['stop']}]" for p in pk.locate(i))
        + f"; {int(row['attention_mask'].sum()):,} real tokens",
    )
    return efficiency, len(pk)


def _random_access(
    store: Any, rng: np.random.Generator, say: Callable[..., None]
) -> dict[str, float]:
    """5. Median time of a random window against a raw slice copy of the mapping, and the
    token rate of random batches; those three figures."""
    from mmpack._src.views.window import WindowDataset

    seqlen, n = 2048, 2000
    ds = WindowDataset(store, seqlen, eot=_EOT)
    idx = rng.integers(0, len(ds), n)
    tokens = store.tokens
    assert tokens is not None  # a memmap store read without verify_reads maps its tokens
    starts = rng.integers(0, store.num_tokens - seqlen, n)
    ds[0]  # compile / warm up
    window_us = _p50_us(lambda k: ds[int(idx[k])], n)
    raw_us = _p50_us(lambda k: np.array(tokens[starts[k] : starts[k] + seqlen]), n)
    batch = 64
    ds.__getitems__(idx[:batch])
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        ds.__getitems__(rng.integers(0, len(ds), batch))
    tps = reps * batch * seqlen / (time.perf_counter() - t0)
    say(
        "",
        f"== 5. Random access (seqlen {seqlen}, {n} random samples, page cache warm)",
        f"   window ds[i]:           p50 {window_us:7.1f} us  (input_ids, position_ids, "
        "cu_seqlens)",
        f"   raw memmap slice copy:  p50 {raw_us:7.1f} us  (the same number of tokens, nothing "
        "else)",
        f"   batches of {batch} windows: {tps / 1e6:,.0f}M tokens/s",
    )
    return {"window_p50_us": window_us, "raw_p50_us": raw_us, "batch_tokens_per_s": tps}
