"""Taking documents in chunks for the writer, each as it was when the source gave it.

From a list or tuple (which nothing changes while the build reads it), a chunk of 1-D native
integer numpy arrays comes back as :class:`Arrays`: the documents themselves (no copy) and their
lengths, from two C-level passes (``set(map(type, ...))``, ``np.fromiter(map(len, ...))``); the
token file checks their dtypes and writes them straight from the arrays
(:meth:`mmpack._src.store.tokenfile.TokenFile.append_arrays`).  Anything else comes back as the list
of documents, for the writer's checks (:mod:`mmpack._src.store.tokens`).

From an iterator, each document is taken the moment it is yielded, so a source that refills one
buffer and yields it (or a view of it) again cannot change what was taken: a 1-D numpy array of
the chunk's integer dtype has its bytes written to a reused ``io.BytesIO`` (one buffer export and
copy, in C); every other object is copied by :func:`mmpack._src.store.tokens.snapshot_doc` (numpy
arrays and their subclasses, ``memoryview``, ctypes arrays and any other buffer-protocol object,
lists, ``array.array``, tensors).  A chunk of plain arrays comes back flat (a view of that buffer;
two buffers alternate, so the previous chunk stays valid while the next is taken), a mixed one as
the list of documents.  An error the source raises propagates as it is.  The first chunk of an
iterator holds at most :data:`FIRST_TAKE` documents: the writer sizes the later ones from the
documents' average length so far (about a quarter of its ``buffer_tokens``), and before any is
known its guess could take a whole corpus of long documents into one buffer.

Cost per document: a list, ~60 ns of C-level checks (no copy); an iterator, one Python loop
step with a few checks and a copy (~0.35 us with the generator's own resume).  Measured with the
whole build: ``python -m benchmarks.bench_store``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from itertools import islice
from typing import Any, NamedTuple

import numpy as np

from mmpack._src.store.tokens import snapshot_doc

__all__ = ["Arrays", "DocChunks", "FIRST_TAKE"]

FIRST_TAKE = 16
"""Documents in the first chunk taken from an iterator, at most."""


class Arrays(NamedTuple):
    """Documents of a list or tuple: numpy arrays whose first is 1-D native integer, and their
    lengths (int64, shape (k,)); the others are checked by whoever copies them."""

    docs: list[np.ndarray]
    lengths: np.ndarray

    def flat(self) -> np.ndarray | None:
        """The tokens back to back (one copy), or None unless every document is a 1-D array of
        the first one's dtype."""
        try:
            flat = np.concatenate(self.docs, dtype=self.docs[0].dtype, casting="no")
        except (TypeError, ValueError):
            return None
        return flat if flat.ndim == 1 else None


def _plain_array(doc: Any) -> bool:
    """Whether ``doc`` is exactly a 1-D numpy array of native integers."""
    return (
        type(doc) is np.ndarray and doc.ndim == 1 and doc.dtype.kind in "iu" and doc.dtype.isnative
    )


class DocChunks:
    """The documents of ``docs`` in chunks (see :meth:`take`)."""

    def __init__(self, docs: Iterable[Any]) -> None:
        self._seq: list[Any] | tuple[Any, ...] | None = None
        if type(docs) is list or type(docs) is tuple:
            self._seq, self._pos = docs, 0
        else:
            self._it = iter(docs)
            self._bufs = [io.BytesIO(), io.BytesIO()]
            self._flip = 0
            self._first = True

    def take(self, size: int) -> Arrays | tuple[np.ndarray, np.ndarray] | list[Any] | None:
        """The next ``size`` documents at most: :class:`Arrays` (from a list or tuple of arrays),
        ``(flat, lengths)`` (``flat`` 1-D integer, any dtype; ``lengths`` int64, shape (k,))
        when an iterator yields plain arrays of one dtype, else the list of documents; None
        when none are left."""
        if self._seq is None:
            if self._first:
                self._first = False
                size = min(size, FIRST_TAKE)
            return self._take_from_iterator(size)
        chunk = self._seq[self._pos : self._pos + size]
        self._pos += len(chunk)
        if not chunk:
            return None
        if _plain_array(chunk[0]) and set(map(type, chunk)) == {np.ndarray}:
            try:
                lens = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
            except TypeError:  # a 0-d array
                return list(chunk)
            return Arrays(list(chunk), lens)
        return list(chunk)

    def _buffer(self) -> io.BytesIO:
        """The buffer of the chunk being taken (the other one may still be in use)."""
        self._flip ^= 1
        buf = self._bufs[self._flip]
        buf.seek(0)
        try:
            buf.write(b"")  # raises while a view of it is alive
        except BufferError:
            buf = self._bufs[self._flip] = io.BytesIO()
        return buf

    def _take_from_iterator(self, size: int) -> tuple[np.ndarray, np.ndarray] | list[Any] | None:
        buf = self._buffer()
        sizes: list[int] = []  # bytes of each document, -1: a document kept in ``others``
        others: list[Any] = []
        write, push, nd = buf.write, sizes.append, np.ndarray
        dt: np.dtype | None = None
        for d in islice(self._it, size):
            if type(d) is nd and d.ndim == 1:
                if dt is None and d.dtype.kind in "iu" and d.dtype.isnative:
                    dt = d.dtype
                if d.dtype is dt:
                    try:  # the bytes as they are now (an error: not contiguous)
                        push(write(d))  # type: ignore[arg-type]  # numpy stubs: no __buffer__
                    except (BufferError, TypeError, ValueError):
                        pass
                    else:
                        continue
            others.append(snapshot_doc(d))
            push(-1)
        if not sizes:
            return None
        lens = np.array(sizes, dtype=np.int64)
        total = int(lens.sum()) + len(others)
        flat = np.frombuffer(buf.getbuffer(), dtype=np.uint8, count=total)
        if not others:
            assert dt is not None
            return flat.view(dt), lens // dt.itemsize
        docs: list[Any] = []
        pos = k = 0
        for n in sizes:
            if n < 0:
                docs.append(others[k])
                k += 1
            else:
                assert dt is not None
                docs.append(flat[pos : pos + n].view(dt))
                pos += n
        return docs
