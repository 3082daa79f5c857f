"""Scale: a store of ``N`` tiny documents (1-7 tokens, uniform; 10^8 and 10^9, quick: 10^6 and
10^7) built, opened, read as windows and packed into a plan, serially and on a 2-worker Dask
``LocalCluster`` on 127.0.0.1.

Every phase runs in a fresh subprocess (its imports and first calls warmed on a tiny store
outside the timing) while this process samples the ``RssAnon`` of the
subprocess and its children every 10 ms (``peak anon MiB``: the largest sample of one process,
the memory a build holds besides the page cache; ``dask sum MiB``: of all processes at once).
Columns: ``build s`` (``StoreWriter.add_batch`` in chunks of 10^7 documents, no fsync); ``open
s`` and its peak; ``windows s`` (``WindowDataset(store, 2048)`` and 64 random windows read);
``plan s`` and its peak (:func:`~mmpack.packing.cached_plan`, ``seqlen=2048``, an
eot, ``region_tokens="auto"``, nothing cached); ``reopen s`` and its peak (the cached plan);
``packed open s`` and its peak (``PackedDataset`` over the cached plan, from opening the store)
and ``packed reads s`` (64 random samples read after it);
``plan B/doc`` (the plan file's bytes per document); ``dask plan s``, its peaks and ``same
file`` (the Dask-built file is byte for byte the serial one); ``bins``, ``ideal bins``
(``ceil(sum(len + 1) / 2048)``, a lower bound of any packing, the whole-store best fit's bins for
these documents) and ``bin cost`` (``bins / ideal bins - 1``).

Run ``python -m benchmarks.bench_scale [--quick] [--docs N]`` (``--docs``: that size alone): 10^9 documents need about 20 GB of disk and
the full run takes tens of minutes on one core.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

SEQLEN = 2048
CHUNK_DOCS = 10_000_000


def _rss_anon(pid: int) -> int:
    """The ``RssAnon`` of process ``pid`` in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _phase(name: str, *args: str) -> dict[str, Any]:
    """Run phase ``name`` in a subprocess; its JSON answer plus ``peak`` (the largest RssAnon
    of one process of its tree) and ``peak_sum`` (of the whole tree at one time)."""
    import psutil

    cmd = [sys.executable, "-m", "benchmarks.bench_scale", "--phase", name, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peaks = {"one": 0, "sum": 0}
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(proc.pid)
        while not done.wait(0.01):
            try:
                pids = [proc.pid] + [c.pid for c in parent.children(recursive=True)]
            except psutil.Error:
                continue
            sizes = [_rss_anon(p) for p in pids]
            peaks["one"] = max(peaks["one"], max(sizes))
            peaks["sum"] = max(peaks["sum"], sum(sizes))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, _ = proc.communicate()
    done.set()
    thread.join()
    if proc.returncode:
        raise RuntimeError(f"phase {name} failed ({proc.returncode})")
    answer = json.loads(out.strip().splitlines()[-1])
    answer["peak"], answer["peak_sum"] = peaks["one"], peaks["sum"]
    return answer


# ------------------------------------------------------------------------------- phases
def _build(path: str, n: int) -> dict[str, Any]:
    from mmpack.store import StoreWriter

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    slots = 0
    with StoreWriter(path, dtype="uint16", fsync=False, overwrite=True) as w:
        for lo in range(0, n, CHUNK_DOCS):
            lens = rng.integers(1, 8, min(CHUNK_DOCS, n - lo))
            slots += int(lens.sum()) + lens.size
            w.add_batch(rng.integers(1, 60000, int(lens.sum()), dtype=np.uint16), lens)
    return {"s": time.perf_counter() - t0, "ideal_bins": -(-slots // SEQLEN)}


def _open(path: str) -> dict[str, Any]:
    import mmpack

    mmpack.open(_warm_store())  # imports and first calls outside the timing
    t0 = time.perf_counter()
    store = mmpack.open(path)
    return {"s": time.perf_counter() - t0, "docs": len(store)}


def _windows(path: str) -> dict[str, Any]:
    import mmpack
    from mmpack import WindowDataset

    WindowDataset(mmpack.open(_warm_store()), 4)[0]
    t0 = time.perf_counter()
    ds = WindowDataset(mmpack.open(path), SEQLEN)
    for i in np.random.default_rng(1).integers(0, len(ds), 64).tolist():
        ds[i]
    return {"s": time.perf_counter() - t0}


def _plan(path: str) -> dict[str, Any]:
    import mmpack
    from mmpack.packing import PlanSpec, cached_plan

    store = mmpack.open(path)
    shutil.rmtree(store.cache_dir, ignore_errors=True)
    warm = mmpack.open(_warm_store())
    shutil.rmtree(warm.cache_dir, ignore_errors=True)  # packed, not read from its cache
    cached_plan(warm, PlanSpec(SEQLEN, add_eot=True, region_tokens="auto"))
    t0 = time.perf_counter()
    plan = cached_plan(store, PlanSpec(SEQLEN, add_eot=True, region_tokens="auto"))
    seconds = time.perf_counter() - t0
    (file,) = store.cache_dir.glob("plan-*.mmplan")
    return {"s": seconds, "bins": plan.n_bins, "bytes": file.stat().st_size, "sha": _sha(file)}


def _reopen(path: str) -> dict[str, Any]:
    import mmpack
    from mmpack.packing import PlanSpec, cached_plan

    cached_plan(mmpack.open(_warm_store()), PlanSpec(SEQLEN, add_eot=True, region_tokens="auto"))
    t0 = time.perf_counter()
    cached_plan(mmpack.open(path), PlanSpec(SEQLEN, add_eot=True, region_tokens="auto"))
    return {"s": time.perf_counter() - t0}


def _packed(path: str) -> dict[str, Any]:
    import mmpack
    from mmpack import PackedDataset

    PackedDataset(mmpack.open(_warm_store()), SEQLEN, eot=0)[0]
    t0 = time.perf_counter()
    ds = PackedDataset(mmpack.open(path), SEQLEN, eot=0)
    opened = time.perf_counter() - t0
    for i in np.random.default_rng(2).integers(0, len(ds), 64).tolist():
        ds[i]
    return {"s": opened, "reads": time.perf_counter() - t0 - opened}


def _dask_plan(path: str) -> dict[str, Any]:
    import dask.distributed as distributed

    import mmpack
    from mmpack.ingest import build_region_plan

    store = mmpack.open(path)
    shutil.rmtree(store.cache_dir, ignore_errors=True)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        t0 = time.perf_counter()
        build_region_plan(
            store, SEQLEN, add_eot=True, engine="dask", scheduler=cluster.scheduler_address
        )
        seconds = time.perf_counter() - t0
    (file,) = store.cache_dir.glob("plan-*.mmplan")
    return {"s": seconds, "sha": _sha(file)}


def _warm_store() -> str:
    """A tiny store whose plan compiles the kernels outside the timings."""
    import mmpack

    path = Path(tempfile.gettempdir(), "mmpack-bench-scale-warm")
    if not path.exists():
        mmpack.build(path, [[1, 2, 3]] * 100, fsync=False)
    return str(path)


def _sha(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


PHASES = {
    "build": _build,
    "open": _open,
    "windows": _windows,
    "plan": _plan,
    "reopen": _reopen,
    "packed": _packed,
    "dask_plan": _dask_plan,
}


# ------------------------------------------------------------------------------- driver
def _case(n: int, tmp: Path) -> dict[str, Any]:
    path = str(tmp / f"s{n}")
    mib = 1 << 20
    built = _phase("build", path, str(n))
    opened = _phase("open", path)
    windows = _phase("windows", path)
    plan = _phase("plan", path)
    reopen = _phase("reopen", path)
    packed = _phase("packed", path)
    dask = _phase("dask_plan", path)
    shutil.rmtree(path, ignore_errors=True)
    return {
        "docs": n,
        "build s": built["s"],
        "open s": opened["s"],
        "open peak anon MiB": opened["peak"] / mib,
        "windows s": windows["s"],
        "plan s": plan["s"],
        "plan peak anon MiB": plan["peak"] / mib,
        "reopen s": reopen["s"],
        "reopen peak anon MiB": reopen["peak"] / mib,
        "packed open s": packed["s"],
        "packed open peak anon MiB": packed["peak"] / mib,
        "packed reads s": packed["reads"],
        "plan B/doc": plan["bytes"] / n,
        "dask plan s": dask["s"],
        "dask peak anon MiB": dask["peak"] / mib,
        "dask sum MiB": dask["peak_sum"] / mib,
        "same file": dask["sha"] == plan["sha"],
        "bins": plan["bins"],
        "ideal bins": built["ideal_bins"],
        "bin cost": plan["bins"] / built["ideal_bins"] - 1.0,
    }


def run(quick: bool = False, docs: int | None = None) -> list[dict[str, Any]]:
    sizes = [1_000_000, 10_000_000] if quick else [100_000_000, 1_000_000_000]
    if docs is not None:
        sizes = [docs]
    tmp = Path(tempfile.mkdtemp(prefix="mmpack-bench-scale-"))
    try:
        return [_case(n, tmp) for n in sizes]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--phase"]:
        name, *rest = sys.argv[2:]
        args: list[Any] = [rest[0], *(int(v) for v in rest[1:])]
        print(json.dumps(PHASES[name](*args)))
    else:
        from benchmarks.__main__ import print_table

        argv = sys.argv[1:]
        docs = int(float(argv[argv.index("--docs") + 1])) if "--docs" in argv else None
        print_table("scale: build, open, windows, plans", run("--quick" in argv, docs))
