"""A kernel's compiled code for fixed argument types, called without numba's type dispatch.

Each call of a numba kernel from Python first types every argument (a fingerprint of each array:
dtype, dimensions, layout, flags) and looks the compiled version up; only then does the compiled
wrapper unbox the arguments.  For the single-sample paths (``ds[i]``), whose arguments have the
same types on every call, :func:`entry_point` resolves that version once, and calling it skips
the typing: on random samples of a 0.2 GB store, ``one_window`` 2.35 -> 2.04 us and ``one_bin``
3.96 -> 3.47 us per call (medians, interleaved; ``python -m benchmarks.bench_getitem --quick
--profile``, 2-core VM, load average 4.6).

The contract is strict: every later call must pass arguments of exactly the types of the
example (same dtypes, dimensions, C-contiguity, read-only flag); the wrapper does not check
them, and an array of another dtype would be read as the compiled one.  Callers therefore build
their arrays the same way on every call, and resolve again when one of them is replaced.
Under ``NUMBA_DISABLE_JIT=1`` (or anything numba does not offer) the kernel itself is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba

__all__ = ["entry_point"]


def entry_point(kernel: Callable[..., Any], *example: Any) -> Callable[..., Any]:
    """The compiled entry of ``kernel`` for the types of ``example`` (compiled, or loaded from
    numba's cache, if needed), or ``kernel`` itself when it is not a numba dispatcher.

    Parameters
    ----------
    kernel : numba dispatcher
        An ``mmpack.kernels._jit.njit`` function.
    *example : Any
        Arguments of the types every later call will pass (values are not used; nothing runs).
    """
    compile_ = getattr(kernel, "compile", None)
    overloads = getattr(kernel, "overloads", None)
    if compile_ is None or overloads is None:
        return kernel
    sig = tuple(numba.typeof(a) for a in example)
    compile_(sig)  # loads numba's cached version, or compiles it
    entry = getattr(overloads.get(sig), "entry_point", None)
    return kernel if entry is None else entry
