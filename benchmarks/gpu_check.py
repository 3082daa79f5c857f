"""GPU check: packed-document attention through every path agrees with per-document attention.

Builds a packed batch with numpy (documents of random lengths filled row by row, each row's tail
a padding segment), collates it with :func:`mmpack.torch.collate`, and runs causal attention
over it five ways on CUDA:

* reference: SDPA on each document alone (float32, from the same bf16-rounded inputs);
* SDPA over whole rows with :func:`mmpack.torch.batched_block_causal_mask` (bf16);
* compiled FlexAttention with :func:`mmpack.torch.flex_document_mask` (bf16 and float32);
* a varlen kernel over the flattened batch with ``batch["cu_seqlens"]``: ``flash_attn``'s
  ``flash_attn_varlen_func`` if installed, else ``torch.nn.attention.varlen.varlen_attn`` if
  this torch has it (else that path is reported as unavailable);
* SDPA with plain ``is_causal=True`` over whole rows (timing baseline only: it ignores document
  boundaries, so its output is *not* checked).

Then a second, small case whose row length is no multiple of 128, non-causal (MLM-style).  Then
context parallelism: ``collate(..., cp_size=C)`` for ``C`` in 2, 4, 8, and on every rank's share
causal varlen attention as ring attention ends up computing it (each zigzag chunk's queries
against the keys and values of its document up to the chunk's end: ``flash_attn_varlen_func``
with ``cu_seqlens_q != cu_seqlens_k``, bottom-right causal; without flash_attn an SDPA loop with
that mask), scattered back by the shares' positions and compared with causal attention over the
whole padded batch at ``cu_seqlens_padded``.
Prints max abs differences and milliseconds per call (CUDA events, after warm-up; compile time
excluded), writes ``$OUT/gpu_check.json`` when ``OUT`` is set, and exits 1 on any mismatch.

Run on a machine with CUDA torch (no mmpack store, zarr or numba needed)::

    python benchmarks/gpu_check.py            # about a minute on an H200, mostly compilation
    python benchmarks/gpu_check.py --device cpu   # small smoke run, FlexAttention eager

Not a test module: pytest collects ``tests/`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _import_mmpack() -> tuple[types.ModuleType, types.ModuleType]:
    """``mmpack._src.torch.collate`` and ``mmpack._src.torch.attention``; they need only numpy and torch, so when the
    package ``__init__`` cannot import (no zarr/numba on the GPU image) load them without it."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("mmpack._src.torch.collate"), importlib.import_module(
            "mmpack._src.torch.attention"
        )
    except ImportError as exc:
        for name in [m for m in sys.modules if m == "mmpack" or m.startswith("mmpack.")]:
            del sys.modules[name]
        pkg = types.ModuleType("mmpack")
        pkg.__path__ = [str(ROOT / "mmpack")]  # a bare namespace: skips mmpack/__init__.py
        sys.modules["mmpack"] = pkg
        warnings.warn(
            f"loading mmpack._src.torch.collate/attention without mmpack/__init__.py ({exc})",
            stacklevel=2,
        )
        return importlib.import_module("mmpack._src.torch.collate"), importlib.import_module(
            "mmpack._src.torch.attention"
        )


mm_collate, mm_attention = _import_mmpack()


def _packed_samples(rng: np.random.Generator, rows: int, seqlen: int) -> list[dict]:
    """Rows filled with whole documents (lognormal lengths, some of one token), tail padded."""
    samples = []
    for _ in range(rows):
        lengths: list[int] = []
        while True:
            n = 1 if rng.random() < 0.05 else int(np.clip(rng.lognormal(5.5, 1.0), 2, seqlen))
            if sum(lengths) + n > seqlen:
                break
            lengths.append(n)
        if not lengths:
            lengths = [seqlen]
        pad = seqlen - sum(lengths)
        seg = lengths + ([pad] if pad else [])
        cu = np.concatenate([[0], np.cumsum(seg)]).astype(np.int32)
        ids = rng.integers(1, 50_000, seqlen)
        labels = ids.copy()
        labels[seqlen - pad :] = -100
        samples.append(
            {
                "input_ids": ids,
                "position_ids": np.concatenate([np.arange(n) for n in seg]),
                "labels": labels,
                "cu_seqlens": cu,
                "max_seqlen": int(max(seg)),
            }
        )
    return samples


def _per_document(q, k, v, rows_cu: list[list[int]], causal: bool) -> torch.Tensor:
    """Reference, float32: SDPA on each segment alone.  ``q, k, v``: (B, H, S, D)."""
    q, k, v = (t.float() for t in (q, k, v))
    out = torch.empty_like(q)
    for b, cu in enumerate(rows_cu):
        for s, e in zip(cu[:-1], cu[1:]):
            out[b, :, s:e] = F.scaled_dot_product_attention(
                q[b, :, s:e], k[b, :, s:e], v[b, :, s:e], is_causal=causal
            )
    return out


def _timed(fn: Callable[[], Any], device: str, iters: int = 20, warmup: int = 3) -> float:
    """Milliseconds per call."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def _varlen_kernel() -> tuple[str, Callable | None]:
    """The varlen attention available here: ``fn(q, k, v, cu, max_seqlen) -> out``, (T, H, D)."""
    try:
        from flash_attn import flash_attn_varlen_func

        def run(q, k, v, cu, m):
            return flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)

        return "flash_attn.flash_attn_varlen_func", run
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return "unavailable (no flash_attn, no torch.nn.attention.varlen)", None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        kwargs = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        kwargs = {"is_causal": True}
    else:
        return "unavailable (torch varlen_attn takes no causal option)", None

    def run(q, k, v, cu, m):
        return varlen_attn(q, k, v, cu, cu, m, m, **kwargs)

    return f"torch.nn.attention.varlen.varlen_attn({kwargs})", run


def _varlen_pair() -> tuple[str, Callable]:
    """Causal varlen attention with queries and keys of their own boundaries, bottom-right
    aligned: ``fn(q, k, v, cu_q, cu_k, max_q, max_k) -> out`` over (T, H, D) tensors."""
    try:
        from flash_attn import flash_attn_varlen_func

        def flash(q, k, v, cu_q, cu_k, mq, mk):
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)

        return "flash_attn.flash_attn_varlen_func", flash
    except ImportError:
        pass

    def sdpa(q, k, v, cu_q, cu_k, mq, mk):
        out = torch.empty_like(q)
        for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(),
                              cu_k[1:].tolist()):  # fmt: skip
            lq, lk = b - a, d - c
            if lq == 0:
                continue
            rows = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
            mask = torch.arange(lk, device=q.device)[None, :] <= rows
            out[a:b] = F.scaled_dot_product_attention(
                q[a:b].transpose(0, 1),
                k[c:d].transpose(0, 1),
                v[c:d].transpose(0, 1),
                attn_mask=mask,
            ).transpose(0, 1)
        return out

    return "sdpa loop, bottom-right causal mask (no flash_attn)", sdpa


def cp_ring_result(q, k, v, batch: dict, cp_size: int, attend: Callable) -> torch.Tensor:
    """Every rank's share of a ``collate(cp_size=...)`` batch attended as ring attention ends
    up computing it, scattered back to the padded positions: (T, H, D).  Checks that the
    chunks' queries are exactly each rank's ``cp_indices``."""
    cu = batch["cu_seqlens_padded"].long().tolist()
    starts, lens = cu[:-1], [b - a for a, b in zip(cu[:-1], cu[1:])]
    chunk = [n // (2 * cp_size) for n in lens]
    out = torch.zeros_like(q)
    for r in range(cp_size):
        took = []
        for part in (r, 2 * cp_size - 1 - r):
            qi = [i for o, c in zip(starts, chunk) for i in range(o + part * c, o + (part + 1) * c)]
            ki = [i for o, c in zip(starts, chunk) for i in range(o, o + (part + 1) * c)]
            cu_q = torch.tensor([0, *np.cumsum(chunk)], dtype=torch.int32, device=q.device)
            cu_k = torch.tensor([0, *np.cumsum([(part + 1) * c for c in chunk])],
                                dtype=torch.int32, device=q.device)  # fmt: skip
            qi_t, ki_t = (torch.tensor(x, dtype=torch.long, device=q.device) for x in (qi, ki))
            mk = max((part + 1) * c for c in chunk)
            out[qi_t] = attend(q[qi_t], k[ki_t], v[ki_t], cu_q, cu_k, max(chunk), mk)
            took += qi
        if sorted(took) != sorted(batch["cp_indices"][r].tolist()):
            raise AssertionError(f"rank {r}'s chunks are not its cp_indices")
    return out


def check_context_parallel(report: Report, rng, g, device: str, on_gpu: bool) -> None:
    """Context-parallel shares attended chunk by chunk against the whole padded batch."""
    name_kernel, attend = _varlen_pair()
    rows, seqlen, heads, dim = (4, 4096, 8, 64) if on_gpu else (2, 256, 2, 16)
    samples = _packed_samples(rng, rows, seqlen)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    tol = {"atol": 2e-2, "rtol": 2e-2} if on_gpu else {"atol": 1e-5, "rtol": 1e-5}
    for cp_size in (2, 4, 8):
        name = f"context parallel C={cp_size}, ring vs full ({dtype})"
        with report.guard(name):
            batch = mm_collate.collate(samples, cp_size=cp_size)
            total = int(batch["cu_seqlens_padded"][-1])
            q, k, v = (torch.randn(total, heads, dim, generator=g, device=device, dtype=dtype)
                       for _ in range(3))  # fmt: skip
            cu = batch["cu_seqlens_padded"].to(device)
            full = attend(q, k, v, cu, cu, batch["max_seqlen"], batch["max_seqlen"]).float()
            ring = cp_ring_result(q, k, v, batch, cp_size, attend)
            report.check(name, ring, full, kernel=name_kernel, padding=batch["cp_padding"], **tol)


class Report:
    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}
        self.failures: list[str] = []

    def check(
        self,
        name: str,
        out: torch.Tensor,
        ref: torch.Tensor,
        atol: float,
        rtol: float,
        ms: float | None = None,
        **extra: Any,
    ) -> None:
        out = out.float()
        diff = (out - ref).abs()
        bad = diff > atol + rtol * ref.abs()
        ok = bool(not out.isnan().any() and not bad.any())
        self.results[name] = {
            "max_abs_diff": float(diff.max()),
            "atol": atol,
            "rtol": rtol,
            "ok": ok,
            "ms": ms,
            **extra,
        }
        timing = "" if ms is None else f"  {ms:8.3f} ms"
        print(f"{'ok ' if ok else 'BAD'} {name:<40} max|diff| {float(diff.max()):.3e}{timing}")
        if not ok:
            self.failures.append(name)

    @contextlib.contextmanager
    def guard(self, name: str) -> Iterator[None]:
        """A step that raises is a failure, reported, and the remaining steps still run."""
        try:
            yield
        except Exception as exc:
            traceback.print_exc()
            self.results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            self.failures.append(name)
            print(f"BAD {name:<40} raised {type(exc).__name__}: {exc}")

    def timing(self, name: str, ms: float, **extra: Any) -> None:
        self.results[name] = {"ms": ms, **extra}
        print(f"    {name:<40} {'':>20}  {ms:8.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available to this torch; nothing checked", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 check compares to 5e-3
    torch.backends.cudnn.allow_tf32 = False
    from torch.nn.attention.flex_attention import flex_attention

    on_gpu = device == "cuda"
    flex = torch.compile(flex_attention, dynamic=False) if on_gpu else flex_attention
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
    rows, seqlen, heads, dim = (8, 4096, 16, 64) if on_gpu else (2, 512, 2, 32)
    rng = np.random.default_rng(args.seed)
    g = torch.Generator(device=device).manual_seed(args.seed)
    report = Report()
    meta = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "rows": rows,
        "seqlen": seqlen,
        "heads": heads,
        "head_dim": dim,
    }

    # --- main case: causal, row length a multiple of 128 ---------------------------------------
    samples = _packed_samples(rng, rows, seqlen)
    batch = mm_collate.collate(samples)
    rows_cu = [r.tolist() for r in batch["cu_seqlens_rows"]]
    meta["documents_per_row"] = [len(c) - 1 for c in rows_cu]
    meta["max_seqlen"] = batch["max_seqlen"]
    report.timing(
        "collate (numpy -> torch, CPU)", _timed(lambda: mm_collate.collate(samples), "cpu")
    )
    q, k, v = (
        torch.randn(rows, heads, seqlen, dim, generator=g, device=device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    ref = _per_document(q, k, v, rows_cu, causal=True)
    bf16_tol = {"atol": 2e-2, "rtol": 2e-2}
    cu_rows = batch["cu_seqlens_rows"]

    with report.guard("sdpa + dense block mask (bf16)"):
        dense = mm_attention.batched_block_causal_mask(cu_rows, seqlen, device=device)
        report.timing(
            "batched_block_causal_mask",
            _timed(
                lambda: mm_attention.batched_block_causal_mask(cu_rows, seqlen, device=device),
                device,
                iters=5,
            ),
        )
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)  # noqa: E731
        report.check(
            "sdpa + dense block mask (bf16)", sdpa(), ref, ms=_timed(sdpa, device), **bf16_tol
        )
        sdpa = dense = None  # free the mask before the next check

    with report.guard("flex_attention + document BlockMask"):
        block_mask = mm_attention.flex_document_mask(cu_rows, seqlen, device=device)
        meta["block_mask_sparsity_pct"] = float(block_mask.sparsity())
        report.timing(
            "flex_document_mask (create_block_mask)",
            _timed(
                lambda: mm_attention.flex_document_mask(cu_rows, seqlen, device=device),
                device,
                iters=5,
            ),
        )
        t0 = time.perf_counter()
        out = flex(q, k, v, block_mask=block_mask)
        if on_gpu:
            torch.cuda.synchronize()
        meta["flex_first_call_s_bf16"] = time.perf_counter() - t0
        run_flex = lambda: flex(q, k, v, block_mask=block_mask)  # noqa: E731
        report.check(
            "flex_attention + document BlockMask (bf16)",
            out,
            ref,
            ms=_timed(run_flex, device),
            compiled=on_gpu,
            **bf16_tol,
        )
        q32, k32, v32 = (t.float() for t in (q, k, v))
        report.check(
            "flex_attention + document BlockMask (fp32)",
            flex(q32, k32, v32, block_mask=block_mask),
            ref,
            atol=5e-3,
            rtol=5e-3,
            compiled=on_gpu,
        )
        del q32, k32, v32

    kernel_name, kernel = _varlen_kernel()
    meta["varlen_kernel"] = kernel_name
    print(f"    varlen kernel: {kernel_name}")
    if kernel is not None and on_gpu:
        with report.guard("varlen attention over batch cu_seqlens (bf16)"):
            # (B, H, S, D) -> the flat (B * S, H, D) layout that batch["cu_seqlens"] indexes.
            qf, kf, vf = (
                t.transpose(1, 2).reshape(rows * seqlen, heads, dim).contiguous() for t in (q, k, v)
            )
            cu = batch["cu_seqlens"].to(device)
            m = batch["max_seqlen"]
            run_varlen = lambda: kernel(qf, kf, vf, cu, m)  # noqa: E731
            out_rows = run_varlen().view(rows, seqlen, heads, dim).transpose(1, 2)
            report.check(
                "varlen attention over batch cu_seqlens (bf16)",
                out_rows,
                ref,
                ms=_timed(run_varlen, device),
                **bf16_tol,
            )
    with report.guard("sdpa is_causal baseline"):
        causal_only = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q, k, v, is_causal=True
        )
        report.timing(
            "sdpa is_causal, no document mask (bf16)",
            _timed(causal_only, device),
            note="baseline; crosses document boundaries, not checked",
        )

    # --- odd case: non-causal, row length not a multiple of 128 --------------------------------
    rows2, seqlen2 = (3, 1000) if on_gpu else (2, 200)
    samples2 = _packed_samples(rng, rows2, seqlen2)
    batch2 = mm_collate.collate(samples2)
    rows_cu2 = [r.tolist() for r in batch2["cu_seqlens_rows"]]
    q2, k2, v2 = (
        torch.randn(rows2, heads, seqlen2, dim, generator=g, device=device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    ref2 = _per_document(q2, k2, v2, rows_cu2, causal=False)
    name = f"flex non-causal, seqlen {seqlen2} (bf16)"
    with report.guard(name):
        bm2 = mm_attention.flex_document_mask(
            batch2["cu_seqlens_rows"], seqlen2, causal=False, device=device
        )
        report.check(name, flex(q2, k2, v2, block_mask=bm2), ref2, **bf16_tol)
    name = f"sdpa non-causal, seqlen {seqlen2} (bf16)"
    with report.guard(name):
        dense2 = mm_attention.batched_block_causal_mask(
            batch2["cu_seqlens_rows"], seqlen2, causal=False, device=device
        )
        report.check(
            name, F.scaled_dot_product_attention(q2, k2, v2, attn_mask=dense2), ref2, **bf16_tol
        )

    check_context_parallel(report, rng, g, device, on_gpu)

    summary = {
        "meta": meta,
        "results": report.results,
        "failures": report.failures,
        "ok": not report.failures,
    }
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "gpu_check.json").write_text(json.dumps(summary, indent=2))
    if report.failures:
        print(f"FAILED: {report.failures}", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
