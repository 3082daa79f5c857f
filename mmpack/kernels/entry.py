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

Unboxing an array argument costs ~40 ns a call (numba wraps each one in a reference-counted
record); an integer ~5 ns.  A single-sample kernel whose big arrays are fixed for the view's
lifetime (the token and offsets mappings) can take them as addresses inside its ``meta`` array
instead and rebuild them with :func:`address` and ``numba.carray``: ``one_window_at`` takes
two arrays where ``one_window`` takes four (random windows of a 2M-document store, the
kernel alone through its entry: -70 ns with offsets by address, -100 ns with both; an A/B in
one process at load average 1.9 whose script was not kept).  The caller keeps the arrays alive (a view holds them for its
lifetime) and validates their dtype, contiguity and length before writing their addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numba
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["address", "entry_point"]


def _address(typingctx: Any, addr: Any) -> Any:
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


address = cast(Callable[[Any], Any], intrinsic(_address))
"""``address(a)`` inside a kernel: the integer ``a`` (an ``ndarray.ctypes.data``) as a
``voidptr`` for ``numba.carray(address(a), n, dtype)``.  Compiled code only (an intrinsic has no
Python version): callers fall back to array arguments under ``NUMBA_DISABLE_JIT``."""


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
