"""Taking documents in chunks for the writer, with as little Python work per document as the
source allows.

From a list or tuple (which nothing can change while it is read), a chunk of 1-D integer numpy
arrays comes back as :class:`Arrays`: the documents themselves (no copy), their lengths and
where they lie in memory, from one pass over the list and array objects themselves
(:func:`mmpack.store.spans.array_iovecs`: ~50 ns a document with the slicing), or, where that
cannot be used (strided arrays, equal dtypes that are not one object), from two C-level passes
(``set(map(type, ...))``, ``np.fromiter(map(len, ...))``: ~60 ns a document); the token file
writes them straight to the file (:meth:`mmpack.store.tokenfile.TokenFile.append_arrays`).  From
an iterator, each array's bytes are written to a reused ``io.BytesIO`` the moment it is yielded
(``map(buf.write, ...)``, the objects kept by ``itertools.tee`` and checked afterwards with one
kernel pass: ~0.29 us a document in all, the generator's own cost included), so a source that
refills and yields one array (or ``array.array``) again cannot change what was taken; an error
of the source's own (even a ``ValueError`` or ``TypeError``, which ``write`` also raises for an
object it refuses) propagates; the first chunk that is not all 1-D contiguous arrays of one
dtype object comes back as a list of the copies taken when each was yielded and switches the
source to a Python loop with a check per document (~0.35 us).  A plain
chunk comes back flat (a view of that buffer; two buffers alternate, so the previous chunk stays
valid while the next is taken).  Anything else (lists of ints, tensors, strided or mixed arrays)
comes back as a list of documents, each one the writer's own copy when it came from an iterator
(:func:`mmpack.store.tokens.snapshot_doc`).
"""

from __future__ import annotations

import array
import io
from collections.abc import Iterable
from itertools import islice, tee
from typing import Any, NamedTuple

import numpy as np

from mmpack.store.spans import array_iovecs, layout_ok
from mmpack.store.tokens import snapshot_doc

__all__ = ["Arrays", "DocChunks"]


class Arrays(NamedTuple):
    """Documents of a list or tuple: numpy arrays whose first is 1-D native integer, and their
    lengths (int64, shape (k,)); the others are checked by whoever copies them."""

    docs: list[np.ndarray]
    lengths: np.ndarray
    iov: np.ndarray | None = None
    """Where they lie in memory when known (:func:`mmpack.store.spans.array_iovecs`)."""

    def flat(self) -> np.ndarray | None:
        """The tokens back to back (one copy), or None unless every document is a 1-D array of
        the first one's dtype."""
        try:
            flat = np.concatenate(self.docs, dtype=self.docs[0].dtype, casting="no")
        except (TypeError, ValueError):
            return None
        return flat if flat.ndim == 1 else None


def _c_buffer(obj: Any) -> bool:
    """Whether ``obj`` exports a C-contiguous buffer (what ``io.BytesIO.write`` takes)."""
    try:
        with memoryview(obj) as view:
            return view.c_contiguous
    except (BufferError, TypeError, ValueError):
        return False


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
            self._plain = layout_ok()  # every document so far a plain array of one dtype

    def take(self, size: int) -> Arrays | tuple[np.ndarray, np.ndarray] | list[Any] | None:
        """The next ``size`` documents at most: :class:`Arrays` (from a list or tuple of arrays),
        ``(flat, lengths)`` (``flat`` 1-D integer, any dtype; ``lengths`` int64, shape (k,))
        when an iterator yields plain arrays of one dtype, else the list of documents; None
        when none are left."""
        if self._seq is None:
            return self._take_from_iterator(size)
        chunk = self._seq[self._pos : self._pos + size]
        self._pos += len(chunk)
        if not chunk:
            return None
        first = chunk[0]
        if (
            type(first) is np.ndarray
            and first.dtype.kind in "iu"
            and first.dtype.isnative
            and first.ndim == 1
        ):
            docs = list(chunk)
            spans = array_iovecs(docs, first.dtype)  # one pass, no Python work per document
            if spans is not None:
                return Arrays(docs, spans[1] // first.dtype.itemsize, spans[0])
        if (
            set(map(type, chunk)) == {np.ndarray}
            and first.dtype.kind in "iu"
            and first.dtype.isnative
            and first.ndim == 1
        ):
            try:
                lens = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
            except TypeError:  # a 0-d array
                return list(chunk)
            return Arrays(list(chunk), lens)
        return list(chunk)

    def _take_plain(
        self, buf: io.BytesIO, size: int
    ) -> tuple[np.ndarray, np.ndarray] | list[Any] | None:
        """:meth:`_take_from_iterator` with no Python work per document: each document's bytes
        are written to ``buf`` the moment it is yielded (``map(buf.write, ...)``), and the
        objects, kept by ``tee``, are checked afterwards in one pass
        (:func:`mmpack.kernels.store.array_spans`).  The first chunk that is not all 1-D
        contiguous arrays of one dtype object ends this path for the source: its documents
        come back as a list, each one the copy taken when it was yielded."""
        seen, taken = tee(islice(self._it, size))
        sizes: list[int] = []
        error: BaseException | None = None
        try:
            sizes.extend(map(buf.write, taken))
        except (BufferError, TypeError, ValueError) as exc:  # not a buffer, or not contiguous
            error = exc  # ... or the source's own error
        failed = error is not None
        docs = list(islice(seen, len(sizes) + failed))  # every object yielded, a failing one last
        if error is not None and (len(docs) == len(sizes) or _c_buffer(docs[-1])):
            raise error  # the source raised it, not ``buf.write``
        if not docs:
            return None
        first = docs[0]
        total = sum(sizes)
        view = np.frombuffer(buf.getbuffer(), dtype=np.uint8, count=total)
        if not failed and type(first) is np.ndarray and first.dtype.kind in "iu":
            from mmpack.kernels.store import array_spans

            dt = first.dtype
            n = len(docs)
            addrs, nbytes = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
            if array_spans(id(docs), id(np.ndarray), id(dt), dt.itemsize, addrs, nbytes) < 0:
                lens = np.array(sizes, dtype=np.int64)
                if (nbytes == lens).all() and dt.isnative:
                    return view.view(dt), lens // dt.itemsize
        self._plain = False
        out: list[Any] = []
        pos = 0
        for d, n in zip(docs, sizes):  # copied when yielded: rebuilt from those bytes
            if isinstance(d, np.ndarray) and n == d.nbytes and not d.dtype.hasobject:
                out.append(
                    np.frombuffer(bytes(view[pos : pos + n]), dtype=d.dtype).reshape(d.shape)
                )
            elif isinstance(d, array.array):  # a buffer the source may refill too
                out.append(array.array(d.typecode, bytes(view[pos : pos + n])))
            else:
                out.append(d if not isinstance(d, np.ndarray) else snapshot_doc(d))
            pos += n
        if failed:
            out.append(snapshot_doc(docs[-1]))  # still as yielded: nothing was taken since
        return out

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
        if self._plain:
            return self._take_plain(buf, size)
        sizes: list[int] = []  # bytes of each document, -1: a document kept in ``others``
        others: list[Any] = []
        write, push, nd = buf.write, sizes.append, np.ndarray
        dt: np.dtype | None = None
        for d in islice(self._it, size):
            if type(d) is nd and d.ndim == 1:
                if dt is None and d.dtype.kind in "iu":
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
