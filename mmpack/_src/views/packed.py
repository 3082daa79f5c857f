"""The packed view: one sample per bin of a packing plan, whole documents side by side.

Sample ``i`` is bin ``i`` of the plan (:mod:`mmpack._src.packing.plan`, cached in the store folder):
its document pieces in order, each followed by ``eot`` when the piece ends its document, then
``pad_id`` up to ``seqlen``; every piece with its eot, and the padding, is one segment of
``cu_seqlens``, ``position_ids`` and the labels (the contract, causal and MLM: the views guide,
``docs/guide/views.md``).  A store's loss mask (:mod:`mmpack._src.store.lossmask`) turns the labels of
non-target tokens into ``-100``.  MLM corruption is a pure function of ``(seed, epoch, i)``
(:mod:`mmpack._src.packing.masking`), the epoch the index's own
(:class:`~mmpack.store.EpochIndex`) or the dataset's (:meth:`PackedDataset.set_epoch`).

Cost.  ``__getitems__`` gathers a batch with one kernel call into pooled ``(B, seqlen)`` arrays
(a :class:`~mmpack.store.SampleBatch`; collate with :func:`mmpack.torch.collate`):
O(B * seqlen) plus O(pieces), one uniform draw per token for MLM.  Tokens are read through the
store's ``read_ranges`` (a subset's from its parent at its ``parent_doc_starts``).  ``ds[i]`` is
one call of :func:`~mmpack._src.kernels.packed_rows.one_bin` into one new buffer.  Opening over a
cached plan is O(1) in the store's size (:func:`~mmpack.packing.load_plan`); a read
checks, once, the plan chunks of its bins and the offsets pages of their regions
(``FormatError`` before a sample is served).  Pickling keeps the store and the parameters: a
worker maps the cached plan again, or recomputes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import partial
from typing import Any

import numpy as np

from mmpack._src.core.fingerprints import config_fingerprint
from mmpack._src.core.options import DEFAULT_LOOKAHEAD, Mode, PackingAlgorithm, parse_option
from mmpack._src.core.validation import (
    EpochIndex,
    check_index,
    check_indices,
    check_int_range,
    check_seed,
    index_epochs,
)
from mmpack._src.kernels.packed_rows import one_bin
from mmpack._src.packing.masking import corrupt_keyed
from mmpack._src.packing.options import Delegated, PlanSpec, label_mode
from mmpack._src.packing.plan import PackingPlan
from mmpack._src.packing.plan_regions import cached_plan
from mmpack._src.packing.plan_stats import PackingStats
from mmpack._src.packing.region_cuts import region_blocks
from mmpack._src.store.reader import TokenStore, open_store
from mmpack._src.store.subset import token_source
from mmpack._src.store.vocab import STORE
from mmpack._src.views.attention_cost import packed_costs
from mmpack._src.views.batch import SampleBatch
from mmpack._src.views.buffers import BufferPool
from mmpack._src.views.packed_config import SAMPLE_FIELDS, packed_config
from mmpack._src.views.packed_gather import (
    gather_rows,
    mlm_targets,
    piece_ranges,
)
from mmpack._src.views.provenance import PIECE_FIELDS, packed_provenance
from mmpack._src.views.readahead import ColdReads
from mmpack.errors import FormatError

__all__ = ["PackedDataset"]

_INT32 = np.dtype(np.int32)
# SampleBatch.from_first: every segment's positions are 0, 1, ..., its attention mask one value.
_FROM_FIRST = ("position_ids", "attention_mask")


class PackedDataset:
    """Bins of whole documents packed into ``seqlen`` tokens, as training samples.

    Parameters
    ----------
    store : TokenStore, str or os.PathLike
        The store (a path is opened with :func:`mmpack.open`).
    seqlen : int
        Tokens per sample, in ``[1, 2**31 - 1)``.
    eot : int, "store" or None, default "store"
        End-of-text id appended to every document (it takes a slot of the bin).  ``"store"``:
        the eot the store's tokenizer records (stores built from text record their tokenizer);
        a store that records none, or whose documents were built with a special-token template
        (they carry its tokens), gets no eot (what ``eot=None`` asks for).
    pad_id : int or "store", default "store"
        Id of the padding after the last piece; ``"store"``: the pad id the store's tokenizer
        records, else 0.
    mode : {"causal", "mlm"}
    mask_prob : float
        MLM selection probability in ``[0, 1]``.
    mask_id, vocab_size : int
        Required with ``mode="mlm"``.
    special_ids : iterable of int
        Never selected for MLM nor drawn as a random replacement (eot, mask_id and pad_id are
        added automatically).
    seed : int
        Seed of the MLM corruption (>= 0).
    long_docs : {"split", "truncate", "drop"}
        Documents longer than a bin (see :mod:`mmpack._src.packing.plan`).
    algorithm : {"bfd", "online", "nextfit"}
        Packing algorithm (see :mod:`mmpack._src.packing.plan`).
    label_shift : {"next", "hf"}
        Causal label convention (see the module docstring).
    lookahead : int
        Open bins of ``algorithm="online"``.
    region_tokens : int, "auto" or None, default "auto"
        The plan is built per region of about ``R`` tokens of consecutive documents (no
        document cut by a region edge), bins numbered region by region, so the samples of a
        region read one contiguous span of the store (what :meth:`block_bounds` cuts into
        blocks for a block-local sample order); ``"auto"``: ``DEFAULT_REGION_BINS * seqlen``
        tokens (8192 bins a region, within 0.01% of the whole-store plan's bins on lognormal
        corpora: ``docs/benchmarks.md``); None: one plan over the whole store.  See
        :mod:`mmpack._src.packing.plan`; a large store's region plan can be built in parallel
        beforehand (:func:`mmpack.ingest.build_region_plan`).
    cache : bool
        Keep the plan in ``<store>/cache/`` (and reuse it).
    check_vocab : bool
        Refuse an eot, pad_id or mask_id outside the vocabulary the store records; ``mask_id``
        and ``vocab_size`` may also be ``"store"``: the ids the store's tokenizer record gives
        (refused when it has none).
    dtype : {"int64", "int32"}
        Integer type of the per-token arrays (``cu_seqlens`` stays int32).  ``"int32"`` halves
        the bytes written per sample (torch embeddings accept int32 ids); it needs a store whose
        token type fits int32 (uint8/16, int8/16/32) and ids (eot, pad_id, mask_id,
        vocab_size - 1) below ``2**31``, else ``ValueError``.

    Notes
    -----
    ``len(ds)`` is the number of bins; ``ds[i]`` a dict with ``input_ids``, ``labels``,
    ``position_ids``, ``attention_mask`` (``dtype``, (seqlen,)), ``cu_seqlens`` (int32, (m,))
    and ``max_seqlen`` (int).  ``eot``, ``pad_id``, ``mask_id`` and ``vocab_size`` hold the
    ids in use (``"store"`` resolved), ``ignore_index`` the label of no loss (-100),
    ``excluded`` the ids MLM never draws (:class:`~mmpack._src.packing.options.RowOptions`); ``repr``
    shows the eot and pad.
    """

    seqlen: int
    eot: int | None
    pad_id: int
    mode: str
    label_shift: str
    ignore_index: int
    mask_prob: float
    special_ids: tuple[int, ...]
    mask_id: int | None
    vocab_size: int | None
    excluded: np.ndarray
    seed: int
    long_docs: str
    cache: bool
    dtype: np.dtype
    plan_spec: PlanSpec

    def __init__(
        self,
        store: TokenStore | str | os.PathLike[str],
        seqlen: int,
        *,
        eot: int | str | None = STORE,
        pad_id: int | str = STORE,
        mode: str = "causal",
        mask_prob: float = 0.3,
        mask_id: int | str | None = None,
        vocab_size: int | str | None = None,
        special_ids: Iterable[int] = (),
        seed: int = 0,
        long_docs: str = "split",
        algorithm: str = "bfd",
        label_shift: str = "next",
        lookahead: int = DEFAULT_LOOKAHEAD,
        region_tokens: int | str | None = "auto",
        cache: bool = True,
        check_vocab: bool = True,
        dtype: Any = "int64",
    ) -> None:
        algo = parse_option(PackingAlgorithm, algorithm, "algorithm")  # warns at the caller
        if isinstance(store, (str, os.PathLike)):
            store = open_store(store)
        if not isinstance(store, TokenStore):
            raise TypeError(
                f"store must be a TokenStore or a path to one, got {type(store).__name__}"
            )
        self.store = store
        config = packed_config(
            store,
            seqlen=seqlen,
            eot=eot,
            pad_id=pad_id,
            mode=mode,
            mask_prob=mask_prob,
            mask_id=mask_id,
            vocab_size=vocab_size,
            special_ids=special_ids,
            seed=seed,
            long_docs=long_docs,
            algorithm=algo,
            label_shift=label_shift,
            lookahead=lookahead,
            region_tokens=region_tokens,
            cache=cache,
            check_vocab=check_vocab,
            dtype=dtype,
        )
        self.__dict__.update(vars(config))  # seqlen, eot, pad_id, mode, ... (PackedConfig)
        self.epoch: int = 0
        self._setup()

    def _setup(self) -> None:
        """Per-process state, rebuilt after unpickling (never pickled)."""
        # the offsets as mapped: a read checks the pages of its bins' regions (_check_bins)
        self._offsets = self.store.mapped_offsets
        self._src = self.store.tokens  # the mapping (memmap backend) or None
        self._mask = self.store.loss_mask  # the per-token loss mask, or None
        # batches read the stores holding the tokens (a subset's parent) at doc_starts; a
        # mask store has its store's offsets (check_mask_store), so the same doc_starts
        self._source, self._doc_starts = token_source(self.store)
        self._mask_source = None if self._mask is None else token_source(self._mask)[0]
        self._cold = ColdReads()
        self._eot_id = 0 if self.eot is None else self.eot
        self._pool = BufferPool()
        self._mlm = self.mode == Mode.MLM
        self._label_mode = label_mode(self.mode, self.label_shift)
        # One single-sample buffer: 4 * seqlen, + cu_seqlens with int32 output (int64: 2 arrays).
        self._one_buffer = self.dtype == np.int32
        cu_at = 4 * self.seqlen if self._one_buffer else 0  # where one_bin writes cu_seqlens
        eot = (int(self.eot is not None), self._eot_id)
        params = [self.seqlen, *eot, self.pad_id, self._label_mode, cu_at, self.ignore_index]
        self._params = np.array(params, dtype=np.int64)
        self._plan = cached_plan(self.store, self.plan_spec, cache=self.cache)

    @property
    def _plan(self) -> PackingPlan:
        return self._plan_now

    @_plan.setter
    def _plan(self, plan: PackingPlan) -> None:
        """Install ``plan`` and what the single-sample path derives from it."""
        plan.check_shapes()  # O(1): the row kernels index every piece array by bin_ptr's range
        self._plan_now = plan
        self._n = plan.n_bins
        # What reads have not checked yet: the plan's chunks (a reopened plan checks each on
        # first use) and the store's offsets pages of each region's documents.
        self._regions_checked = np.zeros(plan.n_regions, dtype=bool)
        self._unchecked = True
        # Columns of a single sample's cu_seqlens: the most pieces in a bin + 2 (one_bin
        # reports a bin that needs more, e.g. a plan swapped in later, and _gather then reads it).
        self._cu_cols = plan.max_bin_pieces() + 2
        self._buflen = 4 * self.seqlen + self._cu_cols * int(self._one_buffer)
        arrays = (plan.bin_ptr, plan.piece_ref, plan.piece_len, plan.regions, plan.split)
        src = self._src if self._mask is None else None  # with a mask ds[i] takes _gather
        self._fast = (*arrays, self._offsets, src, self._params, self.dtype, self._cold)
        q = self.seqlen  # ds[i]'s views as slices built once (~15 ns a view less per call)
        views = (slice(q), slice(2 * q, 3 * q), slice(q, 2 * q), slice(3 * q, 4 * q))
        cu_at = int(self._params[5])
        self._layout = (self._buflen, self._one_buffer, self._cu_cols, cu_at, *views)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    # ------------------------------------------------------------------------------- facts
    lookahead = Delegated("plan_spec", "int: open bins of ``algorithm='online'``.")
    algorithm = Delegated("plan_spec", "str: the packing algorithm's canonical name.")
    region_tokens = Delegated("plan_spec", "int or None: tokens per region; None: one region.")

    def __len__(self) -> int:
        return self._plan.n_bins

    def __repr__(self) -> str:
        regions = "" if self.region_tokens is None else f", region_tokens={self.region_tokens}"
        return (
            f"PackedDataset({self.store!r}, seqlen={self.seqlen}, eot={self.eot}, "
            f"pad_id={self.pad_id}, mode={self.mode!r}, algorithm={self.algorithm!r}, long_docs={self.long_docs!r}{regions}) "
            f"-> {len(self)} bins, efficiency {self._plan.stats.efficiency:.4f}"
        )

    @property
    def fingerprint(self) -> str:
        """32 hex digits of what decides the samples: the store's fingerprint and every
        parameter of the packing and the labels (not ``cache`` nor the output ``dtype``; the
        MLM epoch comes with the indices).  A sampler given this view records it."""
        params = tuple((name, getattr(self, name)) for name in SAMPLE_FIELDS)
        return config_fingerprint("PackedDataset", self.store.fingerprint, params)

    @property
    def plan(self) -> PackingPlan:
        """The packing plan (read-only arrays; a reopened plan's chunks are checked in full on
        this first use, as ``store.offsets`` checks the offsets)."""
        self._plan.check_all()
        return self._plan

    def _check_bins(self, idx: np.ndarray) -> None:
        """Check (once) what reading bins ``idx`` (int64, (k,), checked) uses: the plan's
        chunks of their pieces and the offsets pages of their regions' documents."""
        if not self._unchecked:
            return
        plan = self._plan
        plan.check_bins(idx)
        regions = np.searchsorted(plan.region_bin, idx, side="right") - 1
        todo = np.unique(regions)
        for r in todo[~self._regions_checked[todo]].tolist():
            self.store.doc_bounds(int(plan.region_doc[r]), int(plan.region_doc[r + 1]))
            self._regions_checked[r] = True
        if self._regions_checked.all() and (plan.pages is None or plan.pages.all_checked()):
            self._unchecked = False

    def stats(self) -> PackingStats:
        """The plan's statistics (bins, efficiency, padding, split/truncated/dropped counts...)."""
        return self._plan.stats

    def set_epoch(self, epoch: int) -> None:
        """Select the MLM corruption of ``epoch`` (>= 0) for plain integer indices; the packing
        does not change.  Indices that carry their epoch (a ``ResumableSampler``'s) use theirs:
        with DataLoader workers, use that sampler's ``set_epoch`` (a dataset's epoch set in the
        main process never reaches persistent workers)."""
        self.epoch = check_seed(epoch, "epoch")

    def locate(self, i: int) -> list[dict[str, int]]:
        """Where sample ``i`` comes from, in the shape of :meth:`WindowDataset.locate
        <mmpack.WindowDataset.locate>`: one dict per piece, in row order, with the
        document index ``"doc"``, the token range ``["start", "stop")`` inside it, ``"eot"`` (1 if
        an eot follows the piece, else 0) and ``"at"``, the row position the piece starts at, so
        it fills ``[at, at + stop - start + eot)`` (these are the row's ``cu_seqlens``).  Padding
        is not listed.  Negative ``i`` counts from the end; ``IndexError`` outside the dataset.
        Over a subset (:mod:`mmpack._src.store.subset`), ``"doc"`` is the parent store's id.

        Example: row ``[1, 2, 3, eot, 10, 11, eot, eot]`` of documents ``[1, 2, 3]`` (0),
        ``[]`` (2) and ``[10, 11]`` (4) is located as ``{"doc": 0, "start": 0, "stop": 3, "eot": 1,
        "at": 0}``, ``{"doc": 4, "start": 0, "stop": 2, "eot": 1, "at": 4}``, ``{"doc": 2,
        "start": 0, "stop": 0, "eot": 1, "at": 7}``.
        """
        idx = np.array([check_index(i, len(self))], np.int64)
        block = packed_provenance(self, idx, self._piece_ranges(idx)).block
        return [dict(zip(PIECE_FIELDS[1:], piece)) for piece in block[1:].T.tolist()]

    def attention_cost(self, indices: Any) -> np.ndarray:
        """``sum(s**2)`` over the segments (pieces with their eot, padding) of each sample of
        ``indices``, from the plan without reading a token (int64, (k,);
        :mod:`mmpack._src.views.attention_cost`): what ``loader(balance="attention")`` deals by."""
        return packed_costs(self, indices)

    def block_bounds(self, block_bytes: int) -> np.ndarray:
        """Bounds of blocks of consecutive samples that each read one contiguous byte span of
        the store's tokens of at most about ``block_bytes``, for
        ``ResumableSampler(shuffle="blocks", block_bounds=...)``.

        A block is a run of whole consecutive regions of the plan (the bins of a region take
        documents from anywhere in it, so no smaller set of bins reads one span): regions join
        the current block while its span stays within ``block_bytes``, and a region larger than
        that is a block of its own (:func:`~mmpack._src.packing.region_cuts.region_blocks`).  With
        ``region_tokens=None`` the whole store is one region, hence one block.  O(n_regions).

        Parameters
        ----------
        block_bytes : int
            ``>= 1``: bytes of tokens (``store.dtype.itemsize`` each) a block may read.

        Returns
        -------
        numpy.ndarray, int64, shape (n_blocks + 1,)
            ``[0, ..., len(self)]``, strictly increasing (``[0]`` for an empty view).
        """
        block_bytes = check_int_range(block_bytes, "block_bytes", 1)
        plan = self._plan
        offsets = self.store.offsets  # an entry on every page: the whole index, checked once
        return region_blocks(
            plan.region_bin, plan.region_doc, offsets, self.store.dtype.itemsize, block_bytes
        )

    # ------------------------------------------------------------------------------- access
    def __getitem__(self, i: int) -> dict[str, Any]:
        # Hot path: an in-range int or EpochIndex skips the checks (one_bin validates the bin).
        n = self._n
        b = i if type(i) is int and 0 <= i < n else None
        if b is None:  # (the epoch, which only MLM reads, is looked up when needed)
            b = int(i) if isinstance(i, EpochIndex) and 0 <= i < n else check_index(i, n)
        bin_ptr, piece_ref, piece_len, regions, split, offsets, src, params, dtype, cold = (
            self._fast
        )
        if src is None:
            return self._gather(np.array([b], np.int64), getattr(i, "epoch", self.epoch))[0]
        if self._unchecked:  # a reopened plan's chunks, the offsets pages, each once
            self._check_bins(np.array([b], np.int64))
        if cold.step():  # cold data: request the sample's pages first (readahead.py)
            self._before_cold_read(b)
        # One buffer: ids, positions, labels, attention mask (and with int32 output cu_seqlens).
        buflen, one_buf, cu_cols, cu_at, ids, lab, pos, att = self._layout
        out = np.empty(buflen, dtype)
        cu = out if one_buf else np.empty(cu_cols, _INT32)  # cu_seqlens at cu[cu_at:]
        n_seg, longest = one_bin(
            bin_ptr, piece_ref, piece_len, regions, split, offsets, src, b, params, out, cu
        )
        if n_seg < 0:  # a bin with more pieces than _cu_cols allows, or a corrupt plan (raises)
            return self._gather(np.array([b], np.int64), getattr(i, "epoch", self.epoch))[0]
        if self._mlm:
            rows = out[: 4 * self.seqlen].reshape(4, 1, self.seqlen)
            epoch = getattr(i, "epoch", self.epoch)
            corrupt_keyed(self, np.array([b], dtype=np.int64), epoch, rows[0], rows[3], rows[2])
        return {
            "input_ids": out[ids],
            "labels": out[lab],
            "position_ids": out[pos],
            "attention_mask": out[att],
            "cu_seqlens": cu[cu_at : cu_at + n_seg + 1],
            "max_seqlen": int(longest),  # an int also where numba does not compile
        }

    def __getitems__(self, indices: Any) -> SampleBatch:
        """A batch in one kernel call: a sequence of per-sample dicts backed by shared
        ``(B, seqlen)`` arrays (collate them with :func:`mmpack.torch.collate`)."""
        return self._gather(check_indices(indices, len(self)), index_epochs(indices, self.epoch))

    def _piece_ranges(
        self, idx: np.ndarray, doc_starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """``(starts, lengths, has_eot, row_ptr, counts)`` of the pieces of bins ``idx``
        (:func:`~mmpack._src.views.packed_gather.piece_ranges`), their reads checked first."""
        self._check_bins(idx)
        eot = self.eot is not None
        return piece_ranges(self._plan, self._offsets, self.seqlen, eot, idx, doc_starts)

    def _gather(self, idx: np.ndarray, epochs: Any) -> SampleBatch:
        ranges = self._piece_ranges(idx, self._doc_starts)
        columns, cu, n_seg = gather_rows(
            self._source,
            ranges,
            self._pool,
            self.seqlen,
            self._eot_id,
            self.pad_id,
            self._label_mode,
            self.ignore_index,
            self.dtype,
            None if self._mlm else self._mask_source,  # causal labels ignored where not a target
        )
        if self._mlm:
            ids, attn, labels = (columns[k] for k in ("input_ids", "attention_mask", "labels"))
            if self._mask is not None:  # MLM selects only target tokens
                attn = mlm_targets(self._mask_source, ranges, attn)
            corrupt_keyed(self, idx, epochs, ids, attn, labels)
        provenance = partial(packed_provenance, self, idx, ranges)
        return SampleBatch(columns, cu, n_seg + 1, provenance, _FROM_FIRST)

    # ------------------------------------------------------------------------------- locality
    def token_span(self, lo: int, hi: int) -> tuple[int, int]:
        """The flat token span ``[start, stop)`` that bins ``lo .. hi - 1`` read together
        (``0 <= lo < hi <= len(self)``; one span for a block of :meth:`block_bounds`: whole
        regions); ``(0, 0)`` for bins that read nothing."""
        starts, lengths = self._ranges(np.arange(lo, hi, dtype=np.int64))
        keep = lengths > 0
        if not keep.any():
            return 0, 0
        return int(starts[keep].min()), int((starts[keep] + lengths[keep]).max())

    def _before_cold_read(self, b: int) -> int:
        """Probe the bin's first token, and request its ranges while cold (readahead.py)."""
        starts, lengths = self._ranges(np.array([b], dtype=np.int64))
        probe = int(starts[0]) if starts.shape[0] else 0
        return self._cold.before_read(
            self.store, probe, lambda: self.store.prefetch(starts, lengths)
        )

    def _ranges(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat token ranges ``(starts, lengths)`` (int64) of the pieces of bins ``idx``; empty
        for a corrupt plan (the read itself reports it: a hint never raises)."""
        try:
            starts, lengths = self._piece_ranges(idx)[:2]
        except FormatError:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return starts, lengths
