"""Read-only file mappings that hold no file descriptor.

Python's ``mmap.mmap`` (and so ``numpy.memmap``) duplicates the file's descriptor and keeps the
copy open for the life of the mapping, so a process holding many stores (a join of thousands of
parts) runs out of descriptors long before it runs out of mappings.  A mapping needs no
descriptor once made (POSIX: closing the file does not unmap it).  From Python 3.13 on,
:func:`map_file` is ``mmap.mmap(..., trackfd=False)``; before, it calls the C library's ``mmap``
directly (through ``ctypes``, :mod:`mmpack._src.core.libc`), closes nothing of the caller's, and
returns a read-only numpy array whose ``base`` is a :class:`FileMapping`: the mapping is unmapped
when the last array over it is freed.  Cost: one ``mmap`` call; no data is read.  Where the C
library cannot be reached this falls back to ``mmap.mmap`` (one descriptor per mapping).

A mapping still counts against ``vm.max_map_count`` (65530 by default on Linux): a store maps two
files, so a join can hold tens of thousands of memmap parts.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

import numpy as np

from mmpack._src.core.libc import libc_function

__all__ = ["FileMapping", "map_file"]


def _load_libc() -> Any:
    if _TRACKFD:  # Python 3.13+: the standard library maps without keeping a descriptor
        return None
    fns = (
        libc_function(
            "mmap",
            ctypes.c_void_p,
            [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int64,
            ],
        ),
        libc_function("munmap", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
        libc_function("madvise", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    )
    return None if None in fns else fns  # not a POSIX C library: fall back to mmap.mmap


_TRACKFD = sys.version_info >= (3, 13)
_LIBC = _load_libc()
_MAP_FAILED = ctypes.c_void_p(-1).value


class FileMapping:
    """A read-only shared mapping of ``length`` bytes at ``address``, unmapped when collected.

    Exposes the bytes to numpy (``np.asarray(mapping)``: uint8, read-only) and ``madvise`` with
    the signature of ``mmap.mmap.madvise`` (``start`` relative to the mapping)."""

    def __init__(self, address: int, length: int) -> None:
        self.address = address
        self.length = length
        self.__array_interface__ = {
            "shape": (length,),
            "typestr": "|u1",
            "data": (address, True),  # read-only
            "version": 3,
        }

    def madvise(self, option: int, start: int = 0, length: int | None = None) -> None:
        if length is None:
            length = self.length - start
        if _LIBC[2](self.address + start, length, option) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def __del__(self) -> None:
        munmap = _LIBC[1] if _LIBC is not None else None
        if munmap is not None and self.length:
            munmap(self.address, self.length)


def map_file(fd: int, offset: int, nbytes: int) -> np.ndarray:
    """Map bytes ``[offset, offset + nbytes)`` of the open file ``fd`` read-only.

    Returns
    -------
    numpy.ndarray
        uint8, shape (nbytes,), read-only; its ``base`` chain holds the mapping (a
        :class:`FileMapping`, or an ``mmap.mmap`` in the fallback).  ``fd`` may be closed at
        once (the :class:`FileMapping` keeps no descriptor).

    Raises
    ------
    OSError
        ``mmap`` failed (``ENOMEM`` past ``vm.max_map_count``, ``ENODEV`` for a file that cannot
        be mapped, ...).
    """
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    skip = offset % mmap.ALLOCATIONGRANULARITY
    start, length = offset - skip, nbytes + skip
    if _LIBC is None:
        extra = {"trackfd": False} if _TRACKFD else {}  # 3.13+: no descriptor kept
        mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=start, **extra)
        return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=skip)
    address = _LIBC[0](None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if address is None or address == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    whole = np.asarray(FileMapping(address, length))
    return whole[skip:] if skip else whole
