"""The one place that configures every numba kernel in mmpack.

All kernels are compiled with ``cache=True`` (compiled code is kept in ``__pycache__`` so a new
process pays no compile cost after the first) and ``nogil=True`` (DataLoader threads and prefetch
threads run them in parallel).  Set ``NUMBA_DISABLE_JIT=1`` to run every kernel as plain Python
(coverage sees them; tracebacks are readable), and ``NUMBA_BOUNDSCHECK=1`` to make any
out-of-bounds access raise instead of reading garbage.  Kernels never validate: their Python
callers do, before entering them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numba

_F = TypeVar("_F", bound=Callable[..., object])

__all__ = ["njit"]


def njit(func: _F) -> _F:
    """Compile ``func`` as an mmpack kernel (nopython, cached, releases the GIL)."""
    return numba.njit(cache=True, nogil=True)(func)  # type: ignore[return-value]
