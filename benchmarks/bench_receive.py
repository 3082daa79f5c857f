"""Receiving large parts: the client's CPU per GB of 4 MiB range GETs from S3 (SeaweedFS on
loopback, no proxy), each part returned as a new ``bytes`` (``Transport.get_ranges``, urllib3's
``.data``) against written into a buffer each fetch thread reuses (``Transport.get_range_into``,
urllib3's ``readinto`` in 256 KiB pieces: what the span fetcher does).

A 512 MiB object (128 MiB with ``--quick``) is fetched whole in parts, 16 at a time, by each path
in turn, five times each (alternating); the rows give the medians.  Columns: ``CPU s/GB client``
this process's CPU seconds per GB received, ``CPU s/GB server`` the server's, ``MB/s`` the
throughput, ``vs new bytes`` the client's CPU per GB over that of the first row (lower is
cheaper).  A new buffer per part costs new pages every time; on a machine where touching new
memory is dear (a VM whose host backs it on first touch), that is most of what receiving costs.

Run: ``python -m benchmarks.bench_receive`` (``--quick``: under 20 s).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_remote import _cpu_seconds, _server_helpers

PART = 4 << 20
THREADS = 16
REPEATS = 5


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _paths(transport: Any) -> dict[str, Any]:
    local = threading.local()

    def new_bytes(r: tuple[int, int]) -> None:
        transport.get_ranges("obj", [r])

    def into_buffer(r: tuple[int, int]) -> None:
        if getattr(local, "buf", None) is None:
            local.buf = bytearray(PART)
        transport.get_range_into("obj", r[0], memoryview(local.buf)[: r[1] - r[0]])

    return {"new bytes per part (get_ranges)": new_bytes,
            "reused buffer (get_range_into)": into_buffer}  # fmt: skip


def run(quick: bool = False) -> list[dict[str, Any]]:
    from mmpack.remote.transport import make_transport

    s3 = _server_helpers()
    size = (128 if quick else 512) << 20
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mmpack-bench-receive-") as tmp:
        server = s3.S3Server.start(Path(tmp) / "server")
        try:
            transport = make_transport(f"s3://{s3.BUCKET}/bench/receive", server.options)
            data = np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes()
            transport.put("obj", data)
            del data
            parts = [(a, min(a + PART, size)) for a in range(0, size, PART)]
            paths = _paths(transport)
            got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
            for fn in paths.values():  # warm-up: connections, imports
                fn(parts[0])
            for _ in range(REPEATS):
                for name, fn in paths.items():
                    c0, s0 = _self_cpu(), _cpu_seconds(server.proc.pid)
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(THREADS) as pool:
                        list(pool.map(fn, parts))
                    secs = time.perf_counter() - t0
                    gb = size / 1e9
                    client = (_self_cpu() - c0) / gb
                    got[name].append((client, (_cpu_seconds(server.proc.pid) - s0) / gb, secs))
        finally:
            server.stop()
    base = statistics.median(c for c, _, _ in next(iter(got.values())))
    for name, runs in got.items():
        client = statistics.median(c for c, _, _ in runs)
        rows.append({
            "case": name,
            "CPU s/GB client": client,
            "CPU s/GB server": statistics.median(s for _, s, _ in runs),
            "MB/s": size / statistics.median(t for _, _, t in runs) / 1e6,
            "vs new bytes": client / base,
        })  # fmt: skip
    rows.append({"case": f"load average {os.getloadavg()[0]:.1f} at the end"})
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("receiving large parts", run(quick="--quick" in sys.argv))
