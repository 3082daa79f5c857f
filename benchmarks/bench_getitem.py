"""Single-sample reads (``ds[i]``) against the raw slice copy, side by side, and where the time goes.

For a window view (seqlen 2048 + 1 label token, eot inserted) and a packed view (2048-token bins,
causal labels), int64 and int32 outputs, on a small store (200k C4-like documents,
lognormal(5.48, 1.15), ~92M tokens) and a large one (2M documents in ``--quick``, ~0.9B tokens,
1.9 GB; 10M in the full run, 4.6B tokens, 9.3 GB): ``ds[i]`` at random ``i`` against
``raw[s:s+W].copy()`` of the same number of tokens at random ``s`` on a plain ``np.frombuffer``
view of the same file, after one untimed pass over every sample and every floor slice (so
neither pays first-touch page faults), **interleaved**: rounds of a few hundred calls of each
case in turn, so load on the machine hits all cases alike.  Reported: median and p99 per call,
the floor's median, the ratio of medians (target <= 3).

``--profile`` adds where the nanoseconds of one call go: the same loop over the stages of the
call, each on top of the previous (the kernel alone on preallocated buffers, + the output
allocation, + the sample dict's views, the whole ``ds[i]``; and for comparison the cost of only
writing as many bytes as the sample holds), and a cProfile of the calls (whose absolute times
include the profiler's own overhead).

Run ``python -m benchmarks.bench_getitem [--quick] [--profile]``.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_window import EOT, SEQLEN, _lengths, _make_store, _raw_view, side_by_side
from mmpack import PackedDataset, WindowDataset
from mmpack._src.kernels.packed_rows import one_bin
from mmpack._src.kernels.window import one_window

Case = tuple[Callable[[Any], Any], Sequence[Any]]


def _views(store: Any) -> dict[str, Any]:
    return {
        f"window {dt}": WindowDataset(store, SEQLEN, eot=EOT, labels=True, dtype=dt)
        for dt in ("int64", "int32")
    } | {
        f"packed {dt}": PackedDataset(store, SEQLEN, eot=EOT, pad_id=EOT + 1, dtype=dt)
        for dt in ("int64", "int32")
    }


def single_rows(store: Any, label: str, n: int) -> list[dict[str, Any]]:
    """One row per view and dtype: ``ds[i]`` against the raw copy of as many tokens."""
    raw = _raw_view(store)
    rng = np.random.default_rng(0)
    views = _views(store)
    cases: dict[str, Case] = {}
    for name, ds in views.items():
        cases[name] = (ds.__getitem__, rng.integers(0, len(ds), n).tolist())
    for width in (SEQLEN + 1, SEQLEN):
        starts = rng.integers(0, raw.size - width, n).tolist()
        cases[f"floor {width}"] = (lambda s, w=width: raw[s : s + w].copy(), starts)
    secs = side_by_side(cases)
    rows = []
    for name in views:
        width = SEQLEN + 1 if name.startswith("window") else SEQLEN
        t, f = secs[name], secs[f"floor {width}"]
        ratio = float(np.median(t) / np.median(f))
        rows.append(
            {
                "case": f"{name} ds[i] ({label})",
                "p50 us": float(np.median(t)) * 1e6,
                "p99 us": float(np.percentile(t, 99)) * 1e6,
                "floor p50 us": float(np.median(f)) * 1e6,
                "floor p99 us": float(np.percentile(f, 99)) * 1e6,
                "floor": f"raw[s:s+{width}].copy()",
                "ratio": ratio,
                "target": "<= 3",
                "met": ratio <= 3,
            }
        )
    return rows


def _stages(name: str, ds: Any, draw: Callable[[], list[int]]) -> dict[str, Case]:
    """``ds[i]`` rebuilt stage by stage from the view's single-sample state (see the module
    docstring); each stage includes the ones before it.  Every stage reads its own random
    samples (``draw()``): in an interleaved round, a stage given the samples another stage just
    read would find them in the cache."""
    seqlen = ds.seqlen
    if name.startswith("window"):
        src, offsets, meta, stride, _, _, layout = ds._fast
        dtype, buflen, one, cu_at, cu_len = layout[:5]
        width = ds.width
        buf = np.empty(buflen, dtype)
        cu0 = buf if one else np.empty(cu_len, np.int32)  # int32: cu_seqlens in the same buffer

        written = width + seqlen  # the row and the positions

        def k_only(i: int) -> Any:
            return one_window(src, offsets, meta, i * stride, buf, cu0)

        def k_alloc(i: int) -> Any:
            out = np.empty(buflen, dtype)
            if one:
                return out, out[
                    cu_at : cu_at + one_window(src, offsets, meta, i * stride, out, out)
                ]
            cu = np.empty(cu_len, np.int32)
            return out, cu[: one_window(src, offsets, meta, i * stride, out, cu)]

        def k_dict(i: int) -> Any:
            out, cu = k_alloc(i)
            return {
                "input_ids": out[:seqlen],
                "position_ids": out[width : width + seqlen],
                "cu_seqlens": cu,
                "labels": out[1:width],
            }

    else:
        *arrays, params, dtype, _ = ds._fast
        buflen, cols, one = ds._buflen, ds._cu_cols, ds._one_buffer
        cu_at = int(params[5])  # one_bin writes cu_seqlens at cu[cu_at:] (int32: cu is out)
        buf = np.empty(buflen, dtype)
        cu0 = buf if one else np.empty(cols, np.int32)

        written = 4 * seqlen  # ids, positions, labels, attention mask

        def k_only(i: int) -> Any:
            return one_bin(*arrays[:7], i, params, buf, cu0)

        def k_alloc(i: int) -> Any:
            out = np.empty(buflen, dtype)
            cu = out if one else np.empty(cols, np.int32)
            return out, cu, one_bin(*arrays[:7], i, params, out, cu)

        def k_dict(i: int) -> Any:
            out, cu, (n_seg, longest) = k_alloc(i)
            return {
                "input_ids": out[:seqlen],
                "labels": out[2 * seqlen : 3 * seqlen],
                "position_ids": out[seqlen : 2 * seqlen],
                "attention_mask": out[3 * seqlen : 4 * seqlen],
                "cu_seqlens": cu[cu_at : cu_at + n_seg + 1],
                "max_seqlen": longest,
            }

    return {
        "loop only": (lambda i: None, draw()),
        "kernel (preallocated)": (k_only, draw()),
        "+ output allocation": (k_alloc, draw()),
        "+ sample dict of views": (k_dict, draw()),
        "ds[i]": (ds.__getitem__, draw()),
        "(apart) writing the sample's bytes: np.empty(n).fill(1)": (
            lambda i: np.empty(written, dtype).fill(1),
            draw(),
        ),
    }


def profile_rows(store: Any, label: str, n: int) -> list[dict[str, Any]]:
    """Where one call's time goes, per view and dtype (see the module docstring)."""
    raw = _raw_view(store)
    rng = np.random.default_rng(1)
    rows = []
    for name, ds in _views(store).items():

        def draw(ds: Any = ds) -> list[int]:
            return rng.integers(0, len(ds), n).tolist()

        items = draw()
        width = SEQLEN + 1 if name.startswith("window") else SEQLEN
        starts = rng.integers(0, raw.size - width, n).tolist()
        cases = _stages(name, ds, draw)
        cases["floor"] = (lambda s, w=width: raw[s : s + w].copy(), starts)
        secs = side_by_side(cases)
        row: dict[str, Any] = {"case": f"{name} ds[i] stages, ns ({label})"}
        for stage, t in secs.items():
            row[stage] = float(np.median(t)) * 1e9
        prof = cProfile.Profile()
        prof.runcall(lambda: [ds[i] for i in items[:20000]])
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(6)
        row["_cprofile"] = text.getvalue()
        rows.append(row)
    return rows


def run(quick: bool = False, profile: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-getitem-"))
    rows: list[dict[str, Any]] = []
    try:
        for n_docs in (200_000, 2_000_000 if quick else 10_000_000):
            store = _make_store(tmp / f"c4-{n_docs}", _lengths(n_docs, 5.48, 1.15))
            label = f"{n_docs:.0e} docs, {store.num_tokens / 1e9:.2f}B tokens"
            rows += single_rows(store, label, 20_000 if quick else 100_000)
            if profile:
                rows += profile_rows(store, label, 20_000)
            del store
            shutil.rmtree(tmp / f"c4-{n_docs}", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table
    from benchmarks.timing import load_average

    print("load average before:", load_average())
    result = run(quick="--quick" in sys.argv, profile="--profile" in sys.argv)
    print("load average after:", load_average())
    print_table("single ds[i] against the raw slice copy", [r for r in result if "ratio" in r])
    stages = [r for r in result if "ratio" not in r]
    if stages:
        print_table("where one ds[i] goes (medians, each stage includes the previous)", stages)
        for r in stages:
            print(f"\n{r['case']} -- cProfile, 20,000 calls:\n{r['_cprofile']}")
