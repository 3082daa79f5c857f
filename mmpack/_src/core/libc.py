"""The C library, for the few system calls Python's standard library does not wrap.

``renameat2(RENAME_EXCHANGE)`` (atomic swaps of store folders), ``fallocate`` (punching holes in
the node cache), ``mincore`` (page residency of cold data) and, before Python 3.13,
``mmap``/``munmap`` without a kept descriptor (:mod:`mmpack._src.store.backends._mapping`).  The
library is the process's own symbols (``ctypes.CDLL(None)``): no ``ldconfig`` run, no path
searched, the same libc the interpreter runs on.  Where it is not a POSIX C library the callers
fall back to the standard library's slower or weaker path.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["libc_function"]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def libc_function(name: str, restype: Any, argtypes: list[Any]) -> Any | None:
    """The C library's function ``name`` with its types set, or None where it has none."""
    lib = _libc()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn
