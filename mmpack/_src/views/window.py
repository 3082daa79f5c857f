"""The window view: exact (seqlen, stride) samples over the concatenated stream.

Semantics (the contract).  The virtual stream ``S`` is ``doc0, eot, doc1, eot, ..., eot`` when
the view has an eot (an eot after every document, none stored on disk: by default the one the
store's tokenizer records), else the plain concatenation.
``W = seqlen`` (``seqlen + 1`` with ``labels=True``); window ``i`` is ``S[i*stride : i*stride + W]``
and there are ``max(0, (len(S) - W) // stride + 1)`` of them, in natural order.  With
``drop_last=False`` one more, padded window covers the tail when full windows leave tokens out.
Worked example: documents of lengths 3 and 2 with eot 9 give ``S = a a a 9 b b 9``; seqlen 4,
stride 2 gives 2 windows, ``S[0:4]`` and ``S[2:6]`` (``a 9 b b``, ``cu_seqlens = [0, 2, 4]``).

Loss masks: over a store with a per-token loss mask (``store.loss_mask``), a label whose target
token has mask 0 is ``-100`` (an inserted eot is a target), written in the copy's own pass
(:func:`~mmpack._src.kernels.window.gather_masked_windows`); ``ds[i]`` then takes the batch path.

Cost: O(log n_docs) per window to find its first document (binary search over the mapped
``offsets``), then a copy in a numba kernel that inserts the eot tokens on the fly; a batch is
one kernel call into preallocated arrays.  A single ``ds[i]`` makes one ordinary call of
:func:`~mmpack._src.kernels.window.one_window` into one new buffer and slices the sample out of it.
Against ``raw[s:s+2049].copy()`` of as many tokens, with where the time goes:
``python -m benchmarks.bench_getitem --quick --profile``.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import numpy as np

from mmpack._src.core.constants import IGNORE_INDEX, INT32_MAX
from mmpack._src.core.fingerprints import config_fingerprint
from mmpack._src.core.validation import (
    EpochIndex,
    check_index,
    check_indices,
    check_positive_int,
    check_token_id,
)
from mmpack._src.kernels.window import (
    INDEX_STEP,
    META_FIELDS,
    fill_sampled_index,
    find_doc,
    flat_position,
    gather_masked_windows,
    gather_windows,
    one_window,
    window_ranges,
)
from mmpack._src.store.reader import TokenStore, open_store
from mmpack._src.store.vocab import STORE, check_in_vocab, resolve_special
from mmpack._src.views.attention_cost import window_costs
from mmpack._src.views.batch import SampleBatch
from mmpack._src.views.buffers import BufferPool
from mmpack._src.views.provenance import parent_located, window_provenance
from mmpack._src.views.readahead import ColdReads, flat_start
from mmpack._src.views.window_stats import WindowStats
from mmpack.errors import FormatError

__all__ = ["WindowDataset", "output_dtype"]

_SAMPLED_INDEX_DOCS = 1 << 20
_OUTPUT_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))
_FROM_FIRST = ("position_ids",)  # SampleBatch.from_first: positions 0, 1, ... per segment
_INT32 = np.dtype(np.int32)


def output_dtype(dtype: Any, store: TokenStore, ids: dict[str, int | None]) -> np.dtype:
    """The per-token output type a view was asked for: int64 (the default) or int32.

    int32 needs every value a sample can hold to fit: the store's token type must convert to
    int32 without loss (uint8/16, int8/16/32; not uint32 or 64-bit) and every id in ``ids``
    (``None`` skipped) must lie in ``[-2**31, 2**31)``.  ``TypeError`` for something that is
    not a dtype, ``ValueError`` otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype must be 'int64' or 'int32', got {dtype!r}") from e
    if dt not in _OUTPUT_DTYPES:
        raise ValueError(f"dtype must be 'int64' or 'int32', got {dtype!r}")
    if dt == np.int32:
        if not np.can_cast(store.dtype, np.int32, "safe"):
            raise ValueError(
                f"dtype='int32' cannot hold the store's {store.dtype} tokens without loss; "
                "use dtype='int64'"
            )
        info = np.iinfo(np.int32)
        for name, value in ids.items():
            if value is not None and not info.min <= value <= info.max:
                raise ValueError(f"dtype='int32' cannot hold {name}={value}; use dtype='int64'")
    return dt


class WindowDataset:
    """Fixed-length windows of the concatenated documents of a store.

    Parameters
    ----------
    store : TokenStore, str or os.PathLike
        The store (a path is opened with :func:`mmpack.open`).
    seqlen : int
        Tokens per sample (>= 1).
    stride : int, optional
        Distance between window starts (default ``seqlen``; larger skips tokens).
    eot : int, "store" or None, default "store"
        End-of-text id inserted after every document (not stored on disk).  ``"store"``: the eot
        the store's tokenizer records (stores built from text record their tokenizer); a store
        that records none, or whose documents were built with a special-token template (they
        carry its tokens), gets no eot: the plain concatenation (what ``eot=None`` asks for).
    labels : bool
        Also return the next tokens as ``labels`` (each window then reads ``seqlen + 1``);
        ``-100`` where the store's loss mask says the next token is not a target.
    drop_last : bool
        ``False`` adds a final window padded with ``pad_id`` (labels ``-100``) so that, with
        ``stride <= seqlen``, no token is left out.
    pad_id : int or "store", default "store"
        Padding id of that final window; ``"store"``: the pad id the store's tokenizer records,
        else 0.
    sampled_index : bool, optional
        Keep every 256th document start in memory as a first search level (8 bytes per 256
        documents, built at construction by one strided read of ``offsets``), so a lookup stays
        in cache on huge stores.  Default: on from 2**20 documents.
    check_vocab : bool
        Refuse an eot or pad_id outside the vocabulary the store records.
    dtype : {"int64", "int32"}
        Integer type of ``input_ids``, ``labels`` and ``position_ids``.  ``"int32"`` halves the
        bytes written per sample and reads a sample into one buffer (torch embeddings accept
        int32 ids); it needs a store whose token type fits int32 (uint8/16, int8/16/32) and
        ``eot``/``pad_id`` below ``2**31``, else ``ValueError``.

    Notes
    -----
    Each sample is a dict of numpy arrays: ``input_ids`` (``dtype``, (seqlen,)), ``labels``
    (``dtype``, (seqlen,), with ``labels=True``), ``position_ids`` (``dtype``, (seqlen,),
    restarting at each cut) and ``cu_seqlens`` (int32, (m,)): 0, every position right after a
    document's last token (its eot when given), and seqlen.  ``eot`` and ``pad_id`` hold the
    ids in use (``"store"`` resolved); ``repr`` shows them.
    """

    def __init__(
        self,
        store: TokenStore | str | os.PathLike[str],
        seqlen: int,
        stride: int | None = None,
        *,
        eot: int | str | None = STORE,
        labels: bool = False,
        drop_last: bool = True,
        pad_id: int | str = STORE,
        sampled_index: bool | None = None,
        check_vocab: bool = True,
        dtype: Any = "int64",
    ) -> None:
        if isinstance(store, (str, os.PathLike)):
            store = open_store(store)
        if not isinstance(store, TokenStore):
            raise TypeError(
                f"store must be a TokenStore or a path to one, got {type(store).__name__}"
            )
        self.store = store
        self.seqlen = check_positive_int(seqlen, "seqlen")
        if self.seqlen > INT32_MAX - 1:
            raise ValueError(f"seqlen={seqlen} does not fit the int32 cu_seqlens")
        self.stride = self.seqlen if stride is None else check_positive_int(stride, "stride")
        eot, pad_id = resolve_special(eot, store, "eot"), resolve_special(pad_id, store, "pad_id")
        self.eot: int | None = None if eot is None else check_token_id(eot, "eot")
        self.labels = bool(labels)
        self.drop_last = bool(drop_last)
        self.pad_id: int = check_token_id(pad_id, "pad_id")
        check_in_vocab(store, {"eot": self.eot, "pad_id": self.pad_id}, not check_vocab)
        self.dtype: np.dtype = output_dtype(dtype, store, {"eot": self.eot, "pad_id": self.pad_id})
        self.sampled_index = (
            len(store) >= _SAMPLED_INDEX_DOCS if sampled_index is None else bool(sampled_index)
        )
        self.width = self.seqlen + int(self.labels)
        self.total = store.num_tokens + (len(store) if self.eot is not None else 0)
        full = (self.total - self.width) // self.stride + 1 if self.total >= self.width else 0
        partial = (
            not self.drop_last
            and full * self.stride < self.total
            and (full == 0 or (full - 1) * self.stride + self.width < self.total)
        )
        self.num_full = full
        self._len = full + int(partial)
        self._setup()

    def _setup(self) -> None:
        """Per-process state, rebuilt after unpickling (never pickled)."""
        self._pool = BufferPool()
        self._src = self.store.tokens  # the mapping (memmap backend) or None
        self._mask = self.store.loss_mask if self.labels else None  # per-token, or None
        self._cold = ColdReads()
        self._offsets = self.store.offsets
        self._use_eot = int(self.eot is not None)
        self._eot = self.eot if self.eot is not None else 0
        n_top = 0
        if self.sampled_index and len(self.store):
            n_top = (len(self.store) - 1) // INDEX_STEP + 1
        # one_window's scalars then the sampled index, in one array (one argument).
        self._meta = np.empty(META_FIELDS + n_top, dtype=np.int64)
        self._top = self._meta[META_FIELDS:]
        if n_top:
            fill_sampled_index(self._offsets, self._use_eot, self._top)
        # The single-sample buffer: the row (width), the positions (seqlen), and with int32
        # output the cu_seqlens too (seqlen + 1): one allocation.  With int64 output
        # cu_seqlens is a second, int32, array.
        self._one_buffer = self.dtype == np.int32
        self._buflen = self.width + self.seqlen + (self.seqlen + 1) * int(self._one_buffer)
        cu_at = self.width + self.seqlen if self._one_buffer else 0
        scalars = [self._use_eot, self._eot, self.seqlen, self.width, self.total, self.pad_id]
        self._meta[:META_FIELDS] = [*scalars, cu_at]
        self._last_full = last = self.total - self.width  # windows after it have -100 labels
        # What ds[i] reads, in one tuple (unpacking it is faster than attribute lookups), with
        # the sample's views as slice objects built once.
        w, sl = self.width, self.seqlen
        labels = slice(1, w) if self.labels else None
        buf = (self.dtype, self._buflen, self._one_buffer, cu_at, sl + 1)
        layout = (*buf, slice(sl), slice(w, w + sl), labels)
        src = self._src if self._mask is None else None  # with a mask ds[i] takes _gather
        self._fast = (src, self._offsets, self._meta, self.stride, last, self._cold, layout)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_") or k == "_len"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (
            f"WindowDataset({self.store!r}, seqlen={self.seqlen}, stride={self.stride}, "
            f"eot={self.eot}, pad_id={self.pad_id}, labels={self.labels}, "
            f"drop_last={self.drop_last}) -> {len(self)} samples"
        )

    @property
    def fingerprint(self) -> str:
        """32 hex digits of what decides the samples: the store's fingerprint, ``seqlen``,
        ``stride``, ``eot``, ``labels``, ``drop_last`` and ``pad_id`` (not the output ``dtype``).
        A sampler given this view records it (:class:`~mmpack.ResumableSampler`)."""
        params = (self.seqlen, self.stride, self.eot, self.labels, self.drop_last, self.pad_id)
        return config_fingerprint("WindowDataset", self.store.fingerprint, params)

    def stats(self) -> WindowStats:
        """What the windows cover, in O(1) (see :class:`WindowStats`)."""
        n, stride, width, total = self._len, self.stride, self.width, self.total
        last = (n - 1) * stride  # where the last window starts
        if n == 0:
            covered = 0
        elif stride <= width:  # windows overlap or touch: one run from 0
            covered = min(last + width, total)
        else:  # disjoint windows, the last one possibly cut by the stream's end
            covered = (n - 1) * width + min(width, total - last)
        partial = n - self.num_full
        return WindowStats(
            seqlen=self.seqlen,
            stride=stride,
            n_samples=n,
            n_full=self.num_full,
            n_partial=partial,
            n_docs=len(self.store),
            n_tokens=self.store.num_tokens,
            eot_tokens=total - self.store.num_tokens,
            stream_tokens=total,
            covered_tokens=covered,
            dropped_tokens=total - covered,
            padding_tokens=max(0, last + self.seqlen - total) if partial else 0,
        )

    # ------------------------------------------------------------------------------- access
    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        # Hot path: an in-range int (or EpochIndex, an int) skips the general checks; what the
        # kernel reads was validated at construction.
        n = self._len
        if not ((type(i) is int or isinstance(i, EpochIndex)) and 0 <= i < n):
            i = check_index(i, n)
        src, offsets, meta, stride, last_full, cold, layout = self._fast
        dtype, buflen, one_buf, cu_at, cu_len, ids, pos, labels = layout
        if src is None:
            return self._gather(np.array([i], dtype=np.int64))[0]
        v = i * stride  # a plain int, also for an EpochIndex
        if cold.step():  # cold data: request the sample's pages first (readahead.py)
            self._before_cold_read(v)
        out = np.empty(buflen, dtype)  # the row, the positions (, cu_seqlens)
        if one_buf:
            cu = out[cu_at : cu_at + one_window(src, offsets, meta, v, out, out)]
        else:
            cu = np.empty(cu_len, _INT32)
            cu = cu[: one_window(src, offsets, meta, v, out, cu)]
        if labels is None:
            return {"input_ids": out[ids], "position_ids": out[pos], "cu_seqlens": cu}
        return {
            "input_ids": out[ids],
            "position_ids": out[pos],
            "cu_seqlens": cu,
            "labels": out[labels] if v <= last_full else self._labels(out[: self.width], v),
        }

    def _labels(self, row: np.ndarray, v: int) -> np.ndarray:
        """``row[1:]`` (a view: labels cost no copy), except in a window that runs past the end
        of the stream, whose missing next tokens are -100."""
        missing = v + self.width - self.total
        if missing <= 0:
            return row[1:]
        labels = row[1:].copy()
        labels[self.seqlen - missing :] = IGNORE_INDEX
        return labels

    def __getitems__(self, indices: Any) -> SampleBatch:
        """A batch in one kernel call: a sequence of the samples' dicts, backed by shared
        ``(k, seqlen)`` arrays (``mmpack._src.torch.collate`` turns them into tensors without a copy)."""
        return self._gather(check_indices(indices, self._len))

    def _gather(self, idx: np.ndarray) -> SampleBatch:
        k = idx.shape[0]
        seqlen = self.seqlen
        vstarts = idx * self.stride
        pool = self._pool
        rows = pool.empty((k, self.width), self.dtype)
        pos = pool.empty((k, seqlen), self.dtype)
        cu = pool.empty((k, seqlen + 1), np.int32)
        ncu = np.empty(k, dtype=np.int64)
        first = np.empty(k, dtype=np.int64)  # each window's first document, for its provenance
        provenance = partial(window_provenance, self, vstarts, first)
        src = self._src
        if src is not None:
            self._prefetch(vstarts)  # cold data: queue the batch's page reads together
            cursors = np.full(1, -1, dtype=np.int64)  # the kernel resolves them in the mapping
        else:
            src, cursors = self.store.read_ranges(*self._ranges(vstarts))
        columns = {"input_ids": rows[:, :seqlen], "position_ids": pos}
        if self.labels and self._mask is not None:
            columns["labels"] = self._masked(src, cursors, vstarts, rows, pos, cu, ncu, first)
            return SampleBatch(columns, cu, ncu, provenance, _FROM_FIRST)
        if k:
            gather_windows(
                src,
                cursors,
                self._offsets,
                self._top,
                self._use_eot,
                self._eot,
                vstarts,
                seqlen,
                self.width,
                self.total,
                self.pad_id,
                rows,
                pos,
                cu,
                ncu,
                first,
            )
        if self.labels:
            labels = rows[:, 1:]
            tail = np.flatnonzero(vstarts + self.width > self.total)
            if tail.size:  # windows past the stream's end (drop_last=False): -100 labels
                labels = labels.copy()
                for r in tail:
                    labels[r] = self._labels(rows[r], int(vstarts[r]))
            columns["labels"] = labels
        return SampleBatch(columns, cu, ncu, provenance, _FROM_FIRST)

    def _masked(self, src, cursors, vstarts, rows, pos, cu, ncu, first) -> np.ndarray:
        """Copy the windows at ``vstarts`` (as :func:`~mmpack._src.kernels.window.gather_windows`,
        from ``src`` at ``cursors``) and write their labels ((k, seqlen)) in the same pass: the
        next tokens, ``-100`` where one is not a target (the loss mask's 0) or lies past the
        stream's end (:func:`~mmpack._src.kernels.window.gather_masked_windows`; an eot is a
        target).  The mask is read from its mapping, or from its ``read_ranges``."""
        assert self._mask is not None
        k = vstarts.shape[0]
        mask = self._mask.tokens
        resolved = cursors.shape[0] > 0 and cursors[0] < 0  # src: the whole mapped tokens
        if mask is not None and mask.shape[0] < self.store.num_tokens:
            raise FormatError(
                f"the loss mask holds {mask.shape[0]} values for {self.store.num_tokens} tokens"
            )
        if mask is not None:  # flat positions index it: shift = flat - src index
            mshift = np.zeros(k, dtype=np.int64)
            if not resolved and k:
                mshift = self._ranges(vstarts)[0] - cursors
        else:
            starts, lengths = self._ranges(vstarts)
            mask, at = self._mask.read_ranges(starts, lengths)
            at = np.asarray(at, dtype=np.int64)
            if k and (at.shape != (k,) or at.min() < 0 or (at + lengths).max() > mask.shape[0]):
                raise FormatError("the loss mask's read_ranges returned ranges outside its buffer")
            mshift = at - (starts if resolved else cursors)
        labels = self._pool.empty((k, self.seqlen), self.dtype)
        if k:
            gather_masked_windows(
                src,
                cursors,
                mask,
                mshift,
                self._offsets,
                self._top,
                self._use_eot,
                self._eot,
                vstarts,
                self.seqlen,
                self.total,
                self.pad_id,
                IGNORE_INDEX,
                rows,
                pos,
                cu,
                ncu,
                labels,
                first,
            )
        return labels

    # ------------------------------------------------------------------------------- cold reads
    def _ranges(self, vstarts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat token ranges ``(starts, lengths)`` (int64, (k,)) of the windows at ``vstarts``."""
        starts = np.empty(vstarts.shape[0], dtype=np.int64)
        lengths = np.empty(vstarts.shape[0], dtype=np.int64)
        if vstarts.shape[0]:
            window_ranges(
                self._offsets,
                self._top,
                self._use_eot,
                vstarts,
                self.width,
                self.total,
                starts,
                lengths,
            )
        return starts, lengths

    def _before_cold_read(self, v: int) -> int:
        probe = flat_start(self._offsets, self._use_eot, v)
        return self._cold.before_read(self.store, probe, lambda: self._prefetch_one(v))

    def _prefetch_one(self, v: int) -> int:
        """Request the flat range of the window at virtual position ``v`` (two kernel calls,
        no arrays: the cold single-read path)."""
        offsets, top, use_eot = self._offsets, self._top, self._use_eot
        a = int(flat_position(offsets, top, use_eot, v))
        b = int(flat_position(offsets, top, use_eot, min(v + self.width, self.total)))
        return self.store.prefetch_range(a, b)

    def _prefetch(self, vstarts: np.ndarray) -> int:
        k = vstarts.shape[0]
        if k == 0:
            return 0
        probe = self._ranges(vstarts[:: max(1, k // 2)][:2])[0]
        if self.store.resident(probe):  # a few windows' first pages are in memory: warm
            return 0
        return self.store.prefetch(*self._ranges(vstarts))

    # ------------------------------------------------------------------------------- locality
    def block_bounds(self, block_bytes: int) -> np.ndarray:
        """Bounds of blocks of consecutive windows that read one contiguous span of at most
        ``block_bytes`` bytes of the store's tokens (for ``ResumableSampler(shuffle="blocks")``).

        Windows ``a .. b - 1`` read the stream ``S[a * stride : (b - 1) * stride + width]``, so
        a block of ``k`` windows reads at most ``(k - 1) * stride + width`` stored tokens (fewer
        when eot tokens, which are not stored, fall inside).  Every block holds
        ``k = max(1, (block_bytes // itemsize - width) // stride + 1)`` windows, the last one
        the rest: blocks of equal size, so the sampler's closed-form quality bound holds as it
        is stated.  A window wider than ``block_bytes`` makes blocks of one window.

        Parameters
        ----------
        block_bytes : int
            ``>= 1``; sizes of a few MiB make one large read per block.

        Returns
        -------
        numpy.ndarray, int64, shape (ceil(len(self) / k) + 1,)
            ``[0, k, 2 k, ..., len(self)]``.
        """
        block_bytes = check_positive_int(block_bytes, "block_bytes")
        tokens = block_bytes // self.store.dtype.itemsize
        per_block = max(1, (tokens - self.width) // self.stride + 1)
        return np.append(np.arange(0, self._len, per_block, dtype=np.int64), np.int64(self._len))

    # ------------------------------------------------------------------------------- debugging
    def token_span(self, lo: int, hi: int) -> tuple[int, int]:
        """The flat token span ``[start, stop)`` that windows ``lo .. hi - 1`` read together
        (``0 <= lo < hi <= len(self)``; one span for a block of :meth:`block_bounds`)."""
        starts, lengths = self._ranges(np.array([lo, hi - 1], dtype=np.int64) * self.stride)
        return int(starts[0]), int(starts[1] + lengths[1])

    def attention_cost(self, indices: Any) -> np.ndarray:
        """``sum(s**2)`` over the segments of each window of ``indices`` (the documents it spans,
        its padding), from the offsets (int64, (k,); :mod:`mmpack._src.views.attention_cost`)."""
        return window_costs(self, indices)

    def locate(self, i: int) -> list[dict[str, int]]:
        """Where sample ``i`` comes from: one entry per document it touches, in order, with the
        document index, the token range ``[start, stop)`` inside it, whether its eot is included,
        and the window positions ``[at, at + stop - start + eot)`` it fills (``labels=True``
        windows include the label token).  Over a subset, ``"doc"`` is the parent store's id."""
        n = self._len
        if type(i) is not int or not 0 <= i < n:
            i = check_index(i, n)
        v = i * self.stride
        end = min(v + self.width, self.total)
        offsets = self.store.offsets
        use_eot = int(self.eot is not None)
        j = int(find_doc(offsets, self._top, use_eot, v))
        pieces = []
        while v < end:
            doc_v0 = int(offsets[j]) + j * use_eot
            dl = int(offsets[j + 1] - offsets[j])
            seg_end = doc_v0 + dl + use_eot
            stop_v = min(seg_end, end)
            if stop_v > v:
                start = v - doc_v0
                pieces.append(
                    {
                        "doc": j,
                        "start": min(start, dl),
                        "stop": min(stop_v - doc_v0, dl),
                        "eot": int(use_eot and stop_v == seg_end),
                        "at": v - i * self.stride,
                    }
                )
            v = max(v, stop_v)
            j += 1
        return parent_located(self.store, pieces)
