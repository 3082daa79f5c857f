"""The token file of a build in progress: one pass that converts and range-checks, written and
hashed on background threads.

:meth:`TokenFile.append` converts flat integer arrays of any dtype into a staging buffer of one
checksum block (``block_bytes``, 16 MiB) in the store's dtype with one numba pass that also
checks every token against the accepted range (:func:`mmpack._src.kernels.store.convert_tokens`); a
full staging block goes to :class:`mmpack._src.store.stripe_writer.StripeWriter`, which writes it on a
writer thread while the next block is converted, and hashes every complete block of the file
(XXH64, :func:`mmpack._src.store.integrity.stripe_digest`) on a hash thread.  Tokens already in the
file's dtype and valid skip the pass: at least ``direct_bytes`` (1 MiB) are written straight from
the caller's array (:meth:`TokenFile.append_arrays`: ``os.pwritev`` of a list of arrays, no copy
in Python; the caller waits with :meth:`TokenFile.sync` before changing them), fewer are copied
into the staging block.  An append is all or nothing: a token out of range (negative, >= 2**63
or beyond a fixed dtype) rolls the file back to where the append began and returns the index of
that token.  Without a fixed dtype the file starts as uint8 and is widened in place (one
sequential rewrite, at most three times a build) when a valid token needs more bits.

Cost: against ``ndarray.tofile`` of the same bytes, with where a build's time goes,
``python -m benchmarks.bench_store [--profile]`` (``--stdlib``: a real tokenized corpus);
results in docs/benchmarks.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import IO

import numpy as np

from mmpack._src.store.format import smallest_token_dtype
from mmpack._src.store.stripe_writer import StripeWriter
from mmpack._src.store.tokens import MAX_TOKEN

__all__ = ["TokenFile"]

_WIDEN_STEP = 1 << 22
_DIRECT_BYTES = 1 << 20
_DTYPE, _NDIM = attrgetter("dtype"), attrgetter("ndim")


class TokenFile:
    """Append-only token file with per-block digests.

    Parameters
    ----------
    path : Path
        The file (created empty by ``opener``).
    opener : callable
        ``opener(path, mode)`` returning a binary file object (the writer's ``open``).
    fixed : numpy.dtype or None
        The store's token dtype when the caller fixed it; None picks the narrowest as tokens come.
    block_bytes : int
        Checksum block size (a multiple of 8).
    """

    def __init__(
        self,
        path: Path,
        opener: Callable[[Path, str], IO[bytes]],
        fixed: np.dtype | None,
        block_bytes: int,
    ) -> None:
        self.path = path
        self._open = opener
        self.fixed = fixed
        self.block_bytes = block_bytes
        self.direct_bytes = min(_DIRECT_BYTES, block_bytes)
        """Appends of at least this many bytes in the file's dtype are written straight from
        the caller's buffers; smaller ones are copied into the staging block."""
        self.valid_max = MAX_TOKEN if fixed is None else min(MAX_TOKEN, int(np.iinfo(fixed).max))
        self.dtype: np.dtype = fixed if fixed is not None else np.dtype("<u1")
        self.file: IO[bytes] = opener(path, "wb")
        try:
            self._out = StripeWriter(self.file.fileno(), path, block_bytes)
            self._buf = np.empty(block_bytes, dtype=np.uint8)  # staging block
        except BaseException:  # (MemoryError, a thread that cannot start): no descriptor leaks
            self.file.close()
            raise
        self._spare: np.ndarray | None = None  # the staging block being written
        self._fill = 0  # bytes held in the staging block (after the bytes handed over)
        self.num_tokens = 0
        self.widen_hook: Callable[[np.dtype], None] | None = None
        """Called instead of :meth:`widen` when set (the writer routes it through its own
        method; :meth:`close` clears it, so no reference cycle outlives the build)."""

    # ------------------------------------------------------------------------------- appending
    def append(self, src: np.ndarray, owned: bool = False) -> int:
        """Append the tokens ``src`` (1-D integer array); return -1, or the index of the first
        token out of range, in which case nothing of ``src`` stays appended.  ``owned``: the
        caller never changes ``src`` again, so it may still be being written on return."""
        if not src.dtype.isnative:
            src = src.astype(src.dtype.newbyteorder("="))
        if (
            src.dtype == self.dtype
            and src.dtype.kind == "u"
            and int(np.iinfo(src.dtype).max) <= self.valid_max
            and src.flags.c_contiguous
        ):
            self._append_same(src, owned)  # every value fits: nothing to convert or check
            return -1
        mark = self.num_tokens
        if src.size:
            p = self._convert(src)
            if p < 0:
                return -1
            value = int(src[p])
            if 0 <= value <= self.valid_max:  # a valid token needing more bits
                rest = self._first_invalid(src[p:])
                if rest < 0:  # never widen for an append that is then refused
                    (self.widen_hook or self.widen)(smallest_token_dtype(value))
                    return self.append(src[p:])  # all valid now: cannot fail
                p += rest
            self._rollback(mark)
            return p
        return -1

    def append_arrays(self, docs: list[np.ndarray], lengths: np.ndarray) -> bool:
        """Append the tokens of ``docs`` back to back when every one is a 1-D array of the
        file's dtype whose every value is valid (an unsigned dtype no wider than the token
        rule allows); ``lengths`` (int64, shape (len(docs),)) are their lengths.  Return whether
        they were appended; on False nothing of them is (the caller converts and checks).

        At least :attr:`direct_bytes` in all are written straight from the documents
        (``os.pwritev`` on the writer thread); the caller must not change them before
        :meth:`sync`.  Fewer are copied into the staging block with
        ``np.concatenate(..., out=, casting="no")``."""
        dt = self.dtype
        if dt.kind != "u" or int(np.iinfo(dt).max) > self.valid_max:
            return False
        if not docs or docs[0].dtype != dt:
            return False
        total = int(lengths.sum())
        if not total:
            return False  # nothing would check the documents
        if total * dt.itemsize < self.direct_bytes:
            return self._copy_arrays(docs, lengths)
        if set(map(_DTYPE, docs)) != {dt} or set(map(_NDIM, docs)) != {1}:
            return False
        self._hand_over()
        # The writer's own list: the arrays live until written, whatever the caller's list does.
        self._out.submit(list(docs), np.cumsum(lengths) * dt.itemsize)
        self.num_tokens += total
        return True

    def _copy_arrays(self, docs: list[np.ndarray], lengths: np.ndarray) -> bool:
        """:meth:`append_arrays` through the staging block: one ``np.concatenate`` per block."""
        dt = self.dtype
        ends = np.cumsum(lengths)
        starts = ends - lengths
        total, n, itemsize = int(ends[-1]), len(docs), dt.itemsize
        mark, pos, i, cut = self.num_tokens, 0, 0, 0  # docs[i][:cut] are in already
        try:
            while pos < total:
                stop = min(total, pos + (self.block_bytes - self._fill) // itemsize)
                k = int(np.searchsorted(ends, stop, "right"))  # docs[i:k] end by ``stop``
                parts = docs[i:k]
                if cut and k > i:
                    parts[0] = parts[0][cut:]
                if k < n and starts[k] < stop:  # docs[k] continues in the next block
                    parts.append(docs[k][(cut if k == i else 0) : stop - starts[k]])
                    i, cut = k, int(stop - starts[k])
                else:
                    i, cut = k, 0
                out = self._buf[self._fill : self._fill + (stop - pos) * itemsize].view(dt)
                np.concatenate(parts, out=out, casting="no")  # checks dtypes and ndim
                self._fill += (stop - pos) * itemsize
                self.num_tokens += stop - pos
                pos = stop
                if self._fill == self.block_bytes:
                    self._hand_over()
        except (TypeError, ValueError):
            self._rollback(mark)
            return False
        return True

    def _convert(self, src: np.ndarray) -> int:
        """Convert ``src`` into the staging block by block; -1, or the index of the first token
        beyond the current dtype (everything before it is appended)."""
        from mmpack._src.kernels.store import convert_tokens

        itemsize = self.dtype.itemsize
        hi = min(self.valid_max, int(np.iinfo(self.dtype).max))
        info = np.iinfo(src.dtype)
        lo_v, hi_v = src.dtype.type(0), src.dtype.type(min(hi, int(info.max)))
        done = 0
        while done < src.size:
            room = (self.block_bytes - self._fill) // itemsize
            part = src[done : done + room]
            out = self._buf[self._fill : self._fill + part.size * itemsize].view(self.dtype)
            got = int(convert_tokens(part, out, lo_v, hi_v))
            self._fill += got * itemsize
            self.num_tokens += got
            if self._fill == self.block_bytes:
                self._hand_over()
            if got < part.size:
                return done + got
            done += got
        return -1

    def _append_same(self, src: np.ndarray, owned: bool) -> None:
        """Append tokens already in the file's dtype: at least :attr:`direct_bytes` are written
        straight from ``src`` (no copy), fewer copied into the staging block."""
        raw = src.view(np.uint8)
        if raw.size >= self.direct_bytes:
            self._hand_over()
            self._out.submit([raw], np.array([raw.size], dtype=np.int64))
            if not owned:
                self._out.sync()  # the caller may change ``src`` once this returns
        else:
            while raw.size:
                take = min(raw.size, self.block_bytes - self._fill)
                self._buf[self._fill : self._fill + take] = raw[:take]
                self._fill += take
                raw = raw[take:]
                if self._fill == self.block_bytes:
                    self._hand_over()
        self.num_tokens += src.size

    def _first_invalid(self, src: np.ndarray) -> int:
        """Index of the first token of ``src`` outside ``[0, valid_max]``, or -1."""
        top = int(np.iinfo(src.dtype).max)
        bad = src < 0 if src.dtype.kind == "i" else np.zeros(src.shape, dtype=bool)
        if self.valid_max < top:
            bad |= src > src.dtype.type(self.valid_max)
        return int(np.argmax(bad)) if bad.any() else -1

    def _hand_over(self) -> None:
        """Hand what the staging block holds to the writer thread, which writes it while the
        next tokens go into the other staging block."""
        if not self._fill:
            return
        full = self._buf
        self._out.submit([full[: self._fill]], np.array([self._fill], dtype=np.int64))
        self._buf = self._spare if self._spare is not None else np.empty_like(full)
        self._spare = full  # reused once the next submit has waited for this one
        self._fill = 0

    def sync(self) -> None:
        """Wait until no buffer of the caller's is being written (its error is raised here)."""
        self._out.sync()

    def _rollback(self, num_tokens: int) -> None:
        """Drop every token from ``num_tokens`` on (it is at most :attr:`num_tokens`)."""
        pos = num_tokens * self.dtype.itemsize
        if pos >= self._out.end:
            self._fill = pos - self._out.end
        else:  # bytes were handed over since: cut the file
            self._out.truncate(pos)
            self._fill = 0
        self.num_tokens = num_tokens

    def widen(self, dtype: np.dtype) -> None:
        """Rewrite the tokens so far as ``dtype`` into a new file through the same pass, then
        replace the file with one rename (the old file stays whole until then)."""
        self._hand_over()
        self._out.sync()
        self._out.close()
        self.file.close()
        old_dtype, count = self.dtype, self.num_tokens
        new_path = self.path.with_name(self.path.name + ".widen")
        self.file = self._open(new_path, "wb")
        self._out = StripeWriter(self.file.fileno(), new_path, self.block_bytes)
        self.dtype, self._fill, self.num_tokens = dtype, 0, 0
        if count:  # an empty file cannot be memory-mapped
            old = np.memmap(self.path, dtype=old_dtype, mode="r", shape=(count,))
            for lo in range(0, count, _WIDEN_STEP):
                assert self._convert(np.asarray(old[lo : lo + _WIDEN_STEP])) < 0  # all fit
            del old
        self._out.sync()
        os.replace(new_path, self.path)

    # ------------------------------------------------------------------------------- finishing
    def finish(self) -> list[int]:
        """Write the last (partial) staging block; the digests of every block."""
        self._hand_over()
        return self._out.digests()

    def close(self) -> None:
        """Wait for the writer threads and close the file (an error of the block in flight is
        dropped: the build is being abandoned or :meth:`finish` already raised it)."""
        self.widen_hook = None
        try:
            self._out.close()
        finally:
            self.file.close()
