"""The one place that configures every numba kernel in mmpack.

All kernels are compiled with ``cache=True`` (compiled code is kept in ``__pycache__`` so a new
process pays no compile cost after the first) and ``nogil=True`` (DataLoader threads and prefetch
threads run them in parallel).  Set ``NUMBA_DISABLE_JIT=1`` to run every kernel as plain Python
(coverage sees them; tracebacks are readable), and ``NUMBA_BOUNDSCHECK=1`` to make any
out-of-bounds access raise instead of reading garbage.  Kernels never validate: their Python
callers do, before entering them.

Fork: numba compiles (and loads from its cache) under one process-wide lock.  A thread that
holds it when another forks leaves it held for ever in the child, whose first kernel call then
waits for ever (a DataLoader worker forked while a fetch thread compiles).  So ``fork`` waits
for the lock and holds it across: no thread holds it in the child (held by the forking thread
there, released at once).  Cost: none unless a thread compiles at the fork, then the wait for
that compile to end.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import numba
from numba.core.compiler_lock import global_compiler_lock

_F = TypeVar("_F", bound=Callable[..., object])

__all__ = ["njit"]


def njit(func: _F) -> _F:
    """Compile ``func`` as an mmpack kernel (nopython, cached, releases the GIL)."""
    return numba.njit(cache=True, nogil=True)(func)  # type: ignore[return-value]


def _hold_compiler() -> None:
    global_compiler_lock.acquire()


def _release_compiler() -> None:
    global_compiler_lock.release()


os.register_at_fork(
    before=_hold_compiler, after_in_parent=_release_compiler, after_in_child=_release_compiler
)
