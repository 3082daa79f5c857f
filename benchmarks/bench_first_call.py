"""First-call cost: a fresh interpreter from ``import mmpack`` to the first window sample and to the
first packed plan and sample, with numba's cache empty (cold) and filled (warm).

Each case runs ``REPEATS`` fresh interpreters, one with ``--quick`` (a new empty
``NUMBA_CACHE_DIR`` per cold run, the cache it filled for the warm run after it) over a C4-like store (lognormal(5.48, 1.15) lengths,
uint16; 2.3M documents in the full run, 50k in ``--quick``), and prints the median of each phase:
``import mmpack`` (numba, zarr and torch are not imported), ``import numba`` (what the first
kernel use pays; reported apart so the kernel phases show mmpack's own cost), ``open``, the first
``WindowDataset(store, 2048, eot=50256, labels=True)[0]``, the ``PackedDataset(store, 2048,
eot=50256, cache=False)`` plan and its first sample.  ``compile <kernel> s`` rows give, per
kernel called from Python, the median seconds numba spent compiling it (its jitted callees and
the numpy overloads first compiled for it included) in the cold runs, from numba's
``numba:compile`` events; ``for scale``: ``python -c pass``, ``import numpy``, ``import numba``.

Run ``python -m benchmarks.bench_first_call [--quick]`` (or ``python -m benchmarks first_call``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_window import _lengths, _make_store

REPEATS = 3

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import mmpack
t1 = time.perf_counter()
eager = sorted(m for m in ("numba", "zarr", "torch") if m in sys.modules)
import numba
from numba.core import event
t2 = time.perf_counter()
compiles, stack = {}, []

class Listener(event.Listener):
    def on_start(self, ev):
        stack.append(time.perf_counter())

    def on_end(self, ev):
        seconds = time.perf_counter() - stack.pop()
        if not stack:  # a kernel called from Python: its callees are inside its time
            f = ev.data["dispatcher"].py_func
            name = f.__module__.replace("mmpack._src.kernels.", "") + "." + f.__qualname__
            compiles[name] = compiles.get(name, 0.0) + seconds

event.register("numba:compile", Listener())
store = mmpack.open(sys.argv[1])
t3 = time.perf_counter()
ds = mmpack.WindowDataset(store, 2048, eot=50256, labels=True)
ds[0]
t4 = time.perf_counter()
pk = mmpack.PackedDataset(store, 2048, eot=50256, cache=False)
t5 = time.perf_counter()
pk[0]
t6 = time.perf_counter()
print(json.dumps({
    "phases": {"import mmpack": t1 - t0, "import numba": t2 - t1, "open": t3 - t2,
               "first window sample": t4 - t3, "packed plan": t5 - t4,
               "first packed sample": t6 - t5, "total": t6 - t0},
    "compiles": compiles, "eager": eager}))
"""


def _child(store: Path, cache: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store)],
        env=dict(env, NUMBA_CACHE_DIR=str(cache)),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _seconds(code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def first_call_rows(store: Path, tmp: Path, repeats: int = REPEATS) -> list[dict[str, Any]]:
    """Medians over ``repeats`` fresh interpreters of each phase, cold and warm, and of each
    kernel's compile seconds (cold)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("NUMBA_DISABLE_JIT", None)
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    for i in range(repeats):
        cache = tmp / f"numba-cache-{i}"
        shutil.rmtree(cache, ignore_errors=True)
        runs["cold"].append(_child(store, cache, env))  # fills the cache ...
        runs["warm"].append(_child(store, cache, env))  # ... that this run loads
        shutil.rmtree(cache, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    for label, results in runs.items():
        phases = {
            f"{k} s": statistics.median(r["phases"][k] for r in results)
            for k in results[0]["phases"]
        }
        eager = sorted({m for r in results for m in r["eager"]})
        rows.append(
            {
                "case": f"first call, numba cache {label}",
                **phases,
                "imported by `import mmpack`": ", ".join(eager) or "none of numba/zarr/torch",
            }
        )
    kernels = sorted({k for r in runs["cold"] for k in r["compiles"]})
    for k in kernels:
        values = [r["compiles"].get(k, 0.0) for r in runs["cold"]]
        rows.append({"case": f"compile {k} (cold)", "seconds": statistics.median(values)})
    rows.append(
        {
            "case": "first call, for scale",
            "python -c pass s": statistics.median(_seconds("pass", env) for _ in range(repeats)),
            "import numpy s": statistics.median(
                _seconds("import numpy", env) for _ in range(repeats)
            ),
            "import numba s": statistics.median(
                _seconds("import numba", env) for _ in range(repeats)
            ),
        }
    )
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-first-call-"))
    try:
        n_docs = 50_000 if quick else 2_300_000
        store = _make_store(tmp / "c4", _lengths(n_docs, 5.48, 1.15))
        rows = [{"case": f"store: {n_docs:,} C4-like docs, {store.num_tokens / 1e9:.2f}B tokens"}]
        return rows + first_call_rows(store.path, tmp, repeats=1 if quick else REPEATS)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from benchmarks.__main__ import print_table
    from benchmarks.timing import load_average

    print(f"load average: {load_average()}")
    print_table("first call", run(quick="--quick" in sys.argv[1:]))
