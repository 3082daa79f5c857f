"""First-call cost of the packing plan: each plan kernel compiles one specialization.

Numba compiles a jitted function once per argument-type signature; a caller passing a read-only
array here and a writable one there, or a literal constant (typed ``Literal[int](0)``) where a
variable is passed elsewhere, pays a second compile of seconds in a fresh process with numba's
cache empty.  ``python -m benchmarks.bench_first_call`` measures the whole first call.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _paths import ROOT

from mmpack.packing import build_plan


def test_plan_kernels_see_one_signature_whatever_the_input(monkeypatch):
    """A list, a writable int32 array and a store's read-only int64 lengths reach the plan
    kernels as the same read-only int64 array type: each kernel compiles once per process (and
    one numba cache entry serves them all)."""
    import numba

    from mmpack._src.kernels import plan_items as K

    seen = []
    real = K.item_sizes

    def spy(doc_lens, *args):
        seen.append(numba.typeof(doc_lens))
        return real(doc_lens, *args)

    monkeypatch.setattr(K, "item_sizes", spy)
    frozen = np.array([4, 2, 9], dtype=np.int64)
    frozen.flags.writeable = False
    for lens in ([4, 2, 9], np.array([4, 2, 9], dtype=np.int32), np.array([4, 2, 9]), frozen):
        build_plan(lens, 8, add_eot=True)
    assert len(set(seen)) == 1 and seen[0].dtype == numba.int64 and not seen[0].mutable


_ONE_SIGNATURE = r"""
import numpy as np
from mmpack._src.kernels import plan_bestfit, plan_items
from mmpack.packing import build_plan

frozen = np.array([5, 0, 70, 3, 9, 31], dtype=np.int64)
frozen.flags.writeable = False
for lens in ([5, 0, 70, 3, 9, 31], np.array([5, 0, 70, 3, 9, 31], dtype=np.int32), frozen):
    for algorithm in ("bfd", "online", "nextfit"):
        for add_eot in (True, False):
            for long_docs in ("split", "truncate", "drop"):
                build_plan(lens, 16, add_eot=add_eot, long_docs=long_docs, algorithm=algorithm)
counts = {
    f"{mod.__name__}.{name}": len(obj.signatures)
    for mod in (plan_items, plan_bestfit)
    for name, obj in vars(mod).items()
    if hasattr(obj, "signatures") and obj.__module__ == mod.__name__
}
print(counts)
assert counts and all(n <= 1 for n in counts.values()), counts
"""


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="counts numba compilations")
def test_each_plan_kernel_compiles_once(tmp_path):
    """Every jitted function of the plan compiles one specialization, whatever the algorithm,
    options and input (no literal-typed second compile: ``_bfd_step`` was compiled for
    ``Literal[int](0)`` and ``int64``, ``_tree_succ`` for ``Literal[int](1)`` and ``int64``)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = subprocess.run(
        [sys.executable, "-c", _ONE_SIGNATURE], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
