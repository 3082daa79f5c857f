"""Every numba kernel against its slow Python twin, from the one table that the tests use.

``tests/reference.py`` pairs each kernel (or the public function wrapping it: the ``via``
column) with its twin and a random-input generator (:data:`reference.PAIRS`).  For every entry
one input of the entry's ``bench_size`` (a tenth of it with ``--quick``) is drawn with seed 0;
both sides are called once untimed (compilation, caches) and their results compared, then
called alternately, 5 times each (3 with ``--quick``); the table gives both medians and
``speedup`` = twin / kernel.  The kernel side is its adapter's ``run_kernel``: the kernel or its
public wrapper with the outputs it allocates, and one Python call per element where the kernel
takes one element (as ``ds[i]`` does); the conversion of its outputs for the comparison
(``finish``) is not timed.  On a small input that overhead, not the kernel, is most of the time.

The twins are test code: ``tests/`` is put on ``sys.path`` to import them.
Run ``python -m benchmarks.bench_kernels [--quick]`` (or ``python -m benchmarks kernels``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parent.parent / "tests"


def _reference() -> Any:
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import reference

    return reference


def run(quick: bool = False) -> list[dict[str, Any]]:
    reference = _reference()
    repeats = 3 if quick else 5
    rows = []
    for pair in reference.PAIRS:
        size = max(pair.bench_size // 10, 4) if quick else pair.bench_size
        args = pair.inputs(np.random.default_rng(0), size)
        reference.assert_same(pair.kernel_values(args), pair.run_reference(*args))
        kernel, twin = [], []
        for _ in range(repeats):
            for side, out in ((pair.run_kernel, kernel), (pair.run_reference, twin)):
                reference.clear_caches()
                t0 = time.perf_counter()
                side(*args)
                out.append(time.perf_counter() - t0)
        k, t = float(np.median(kernel)), float(np.median(twin))
        rows.append(
            {
                "case": pair.kernel.removeprefix("mmpack._src.kernels."),
                "via": pair.via.removeprefix("mmpack."),
                "reference": pair.reference,
                "size": size,
                "kernel_s": k,
                "twin_s": t,
                "speedup": t / k if k > 0 else float("inf"),
            }
        )
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table("kernels against their twins", run(quick="--quick" in sys.argv))
