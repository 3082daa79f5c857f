"""Taking documents in chunks for the writer, with as little Python work per document as the
source allows.

A chunk of 1-D integer numpy arrays of one dtype becomes one flat array of their bytes and their
lengths: from a list or tuple (which nothing can change while it is read) with C-level passes
only (``set(map(type, ...))`` and friends, one ``b"".join``, ``np.fromiter(map(len, ...))``:
~0.15 us a document); from an iterator, each array's bytes are appended to the chunk's buffer
the moment it is yielded (one ``bytearray.extend``, ~0.3 us a document), so a source that refills
and yields one array again cannot change what was taken.  Anything else (lists of ints, tensors,
strided or mixed arrays) comes back as a list of documents, each one the writer's own copy when
it came from an iterator (:func:`mmpack.store.tokens.snapshot_doc`).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from operator import attrgetter
from typing import Any

import numpy as np

from mmpack.store.tokens import snapshot_doc

__all__ = ["DocChunks"]

_dtype_of = attrgetter("dtype")
_ndim_of = attrgetter("ndim")


class DocChunks:
    """The documents of ``docs`` in chunks (see :meth:`take`)."""

    def __init__(self, docs: Iterable[Any]) -> None:
        self._seq: list[Any] | tuple[Any, ...] | None = None
        if type(docs) is list or type(docs) is tuple:
            self._seq, self._pos = docs, 0
        else:
            self._it = iter(docs)

    def take(self, size: int) -> tuple[np.ndarray, np.ndarray] | list[Any] | None:
        """The next ``size`` documents at most: ``(flat, lengths)`` (``flat`` 1-D integer, any
        dtype; ``lengths`` int64, shape (k,)) when they are plain arrays of one dtype, else the
        list of documents; None when none are left."""
        if self._seq is not None:
            chunk = self._seq[self._pos : self._pos + size]
            self._pos += len(chunk)
            if not chunk:
                return None
            flat = _join_arrays(chunk)
            if flat is None:
                return list(chunk)
            return flat, np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
        return self._take_from_iterator(size)

    def _take_from_iterator(self, size: int) -> tuple[np.ndarray, np.ndarray] | list[Any] | None:
        buf = bytearray()
        lens: list[int] = []  # -1: a document kept in ``others``
        others: list[Any] = []
        extend, push, nd = buf.extend, lens.append, np.ndarray
        dt: np.dtype | None = None
        for d in islice(self._it, size):
            if type(d) is nd and d.ndim == 1:
                if dt is None and d.dtype.kind in "iu":
                    dt = d.dtype
                if d.dtype is dt:
                    try:
                        extend(d)  # the bytes as they are now (an error: not contiguous)
                    except (BufferError, TypeError):
                        pass
                    else:
                        push(len(d))
                        continue
            others.append(snapshot_doc(d))
            push(-1)
        if not lens:
            return None
        if not others:
            assert dt is not None
            return np.frombuffer(buf, dtype=dt), np.array(lens, dtype=np.int64)
        docs: list[Any] = []
        pos = k = 0
        for n in lens:
            if n < 0:
                docs.append(others[k])
                k += 1
            else:
                assert dt is not None
                docs.append(np.frombuffer(buf, dtype=dt, count=n, offset=pos))
                pos += n * dt.itemsize
        return docs


def _join_arrays(chunk: list[Any] | tuple[Any, ...]) -> np.ndarray | None:
    """The chunk's tokens back to back if every document is a contiguous 1-D integer
    ``numpy.ndarray`` of one dtype, else None."""
    if set(map(type, chunk)) != {np.ndarray}:
        return None
    dtypes = set(map(_dtype_of, chunk))
    if len(dtypes) != 1 or set(map(_ndim_of, chunk)) != {1}:
        return None
    dt = dtypes.pop()
    if dt.kind not in "iu":
        return None
    try:
        return np.frombuffer(b"".join(chunk), dtype=dt)
    except (BufferError, TypeError):  # a strided view
        return None
