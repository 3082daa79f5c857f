"""Every kernel against its slow twin, from the one table of ``tests/reference.py``; and the check
that the table misses no kernel.

:data:`reference.PAIRS` pairs each kernel (or the public function wrapping it) with its twin and a
random-input generator; hypothesis draws the generator's seed and size, and both sides must
compute the same values.  A numba kernel of :mod:`mmpack._src.kernels` that is neither an entry nor in
:data:`reference.COVERED_BY` fails :func:`test_every_kernel_is_in_the_table`.

Run: ``pytest tests/test_reference.py`` (``make test`` reruns it with ``NUMBA_BOUNDSCHECK=1`` and
with ``NUMBA_DISABLE_JIT=1``, where every kernel runs as plain Python).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import example, given
from hypothesis import strategies as st
from reference import COVERED_BY, PAIRS, Pair, assert_same, xxh64_slow

import mmpack._src.kernels

KERNELS = Path(mmpack._src.kernels.__file__).parent


def _param(pair: Pair):
    return pytest.param(pair, id=pair.kernel.removeprefix("mmpack._src.kernels."),
                        marks=[pytest.mark.slow] if pair.slow else [])  # fmt: skip


@pytest.mark.parametrize("pair", [_param(p) for p in PAIRS])
@given(seed=st.integers(0, 2**63 - 1), size=st.integers(0, 24))
@example(seed=198, size=19)  # CP layout: an empty last segment at the end of the fields
def test_kernel_matches_its_twin(pair: Pair, seed: int, size: int) -> None:
    args = pair.inputs(np.random.default_rng(seed), size)
    assert_same(pair.kernel_values(args), pair.run_reference(*args))


# ----------------------------------------------------------------------------- the table is whole
def _decorated_kernels() -> set[str]:
    """Dotted names of the functions decorated ``@njit`` in every module of mmpack._src.kernels, read
    from the source (so the check sees them with ``NUMBA_DISABLE_JIT=1`` too)."""
    found = set()
    for info in pkgutil.iter_modules([str(KERNELS)]):
        tree = ast.parse((KERNELS / f"{info.name}.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "njit" for d in node.decorator_list
            ):
                found.add(f"mmpack._src.kernels.{info.name}.{node.name}")
    return found


def _dispatchers() -> set[str]:
    """Dotted names of the numba dispatchers (objects with ``py_func``) defined in each module of
    mmpack._src.kernels; empty under ``NUMBA_DISABLE_JIT=1``, where kernels are plain functions."""
    found = set()
    for info in pkgutil.iter_modules([str(KERNELS)]):
        module = importlib.import_module(f"mmpack._src.kernels.{info.name}")
        for name, obj in vars(module).items():
            func = getattr(obj, "py_func", None)
            if func is not None and func.__module__ == module.__name__:
                found.add(f"{module.__name__}.{name}")
    return found


def test_every_kernel_is_in_the_table() -> None:
    kernels = _decorated_kernels()
    dispatchers = _dispatchers()
    if dispatchers:  # compiled: the source's decorated functions are exactly the dispatchers
        assert dispatchers == kernels
    entries = {p.kernel for p in PAIRS}
    assert len(entries) == len(PAIRS), "a kernel has two entries"
    missing = sorted(kernels - entries - set(COVERED_BY))
    assert not missing, (
        f"kernels with no twin in tests/reference.py (PAIRS or COVERED_BY): {missing}"
    )
    assert not sorted((entries | set(COVERED_BY)) - kernels), (
        "the table names a kernel that is gone"
    )
    assert not entries & set(COVERED_BY)
    assert set(COVERED_BY.values()) <= entries


def test_the_coverage_check_sees_a_new_kernel(tmp_path, monkeypatch) -> None:
    """A module of mmpack._src.kernels with a new ``@njit`` function is reported by the check."""
    for path in KERNELS.glob("*.py"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "extra.py").write_text(
        "from mmpack._src.kernels._jit import njit\n\n\n@njit\ndef twice(x):\n    return 2 * x\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "KERNELS", tmp_path)
    assert "mmpack._src.kernels.extra.twice" in _decorated_kernels() - {
        p.kernel for p in PAIRS
    } - set(COVERED_BY)


@given(st.binary(max_size=200), st.integers(0, 2**64 - 1))
def test_the_xxh64_twin_is_the_published_algorithm(data: bytes, seed: int) -> None:
    assert xxh64_slow(data, seed) == xxhash.xxh64_intdigest(data, seed)
