"""``MegatronGPTDataset``: the samples megatron-core's ``GPTDataset`` serves, read from a store.

Sample ``i`` is ``GPTDataset``'s sample ``i`` for the same files, seed, sequence length, split
and sample count: sample ``shuffle_index[i]`` of its sample index, read as token ranges of the
store's sequences in its document index order (:mod:`mmpack._src.formats.megatron_order` computes
the three indices; nothing of the corpus is copied or rewritten).  Its fields are
``GPTDataset``'s, renamed: ``input_ids`` (its ``tokens``), ``labels``, ``loss_mask`` and
``position_ids``, with the same values: a sample shorter than ``seqlen + 1`` tokens (the last of
a validation split that keeps it) is padded with ``pad_id``, every ``pad_id`` then takes no
loss and reads as 0, as in ``GPTDataset``.  Its dense ``attention_mask`` is not built; the
causal mask it describes is given as ``cu_seqlens`` (``[0, seqlen]``, or cut after every
``eod`` with ``reset_attention_mask``).  A ``ResumableSampler(len(ds), shuffle=False)`` resumed
at ``consumed_samples`` serves Megatron's pretraining sampler's global batches.

Cost per batch of ``k`` samples: the shuffle lookup and the pieces (one per sequence a sample
touches) in a numba kernel (:mod:`mmpack._src.kernels.megatron_order`), one ``read_ranges`` of the
store, one copy kernel, then O(k * seqlen) numpy for the fields; building the view costs
:func:`~mmpack._src.formats.megatron_order.cached_order` once per parameters (then a mapped file).
Against ``GPTDataset[i]`` and its build: ``python -m benchmarks.bench_megatron_order``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmpack._src.core.options import MegatronSplit, parse_option
from mmpack._src.core.validation import (
    check_bool,
    check_index,
    check_indices,
    check_positive_int,
    check_token_id,
)
from mmpack._src.formats.megatron_order import (
    MegatronOrder,
    StoreSequences,
    cached_order,
    split_sequences,
    store_sequences,
)
from mmpack._src.kernels.megatron_order import copy_pieces, sample_pieces
from mmpack._src.store.reader import TokenStore
from mmpack._src.views.batch import SampleBatch

__all__ = ["MegatronGPTDataset"]

_PAD_TOKEN_ID = -1
"""megatron-core's pad id when the tokenizer has none (or one that collides with eod/eos)."""


class MegatronGPTDataset:
    """megatron-core ``GPTDataset``'s samples, in its order, over a store.

    Parameters
    ----------
    store : TokenStore
        Usually a Megatron ``PREFIX.bin/.idx`` opened in place (``mmpack.open(PREFIX)``): its
        sequences are the ``.idx``'s (sentences with ``--split-sentences``).  Any other store
        counts each document as one sequence.
    seqlen : int
        Megatron's ``--seq-length`` (``sequence_length``).
    seed : int
        Megatron's ``--seed`` (``random_seed``), ``0 <= seed < 2**32``.
    num_samples : int, optional
        The split's sample count as Megatron asked it (``train_iters * global_batch_size`` for
        the training split; megatron-core logs them as the datasets' target sizes); None: one
        epoch.  The view holds at least that many samples (whole epochs' worth, like
        ``GPTDataset``).
    split : str, optional
        Megatron's ``--split`` (``"969,30,1"``): the view covers split ``index_split``'s range
        of sequences, as ``BlendedMegatronDatasetBuilder`` cuts it for a single ``--data-path``
        without a weight.  None (the default): every sequence.
    index_split : {"train", "valid", "test"}
    sequences : array of int, optional
        The sequences themselves (``GPTDataset``'s ``indexed_indices``), instead of ``split``.
    add_extra_token : bool
        ``add_extra_token_to_sequence`` (default True: each sample reads ``seqlen + 1`` tokens).
    drop_last_partial_validation_sequence : bool
        As megatron-core's option of that name (the validation split only).
    pad_id : int
        The pad id ``GPTDataset`` uses: the tokenizer's ``pad``, or -1 when it has none or when
        it equals its ``eod``/``eos`` (megatron-core then falls back to -1).
    eot : int, optional
        The tokenizer's end-of-document id (what Megatron calls ``eod``), needed by the three
        options below.
    reset_position_ids, reset_attention_mask, eod_mask_loss : bool
        As megatron-core's options of those names.
    cache : bool
        Keep the order in the store's cache folder (see
        :func:`~mmpack._src.formats.megatron_order.cached_order`).

    Notes
    -----
    Each sample is a dict of numpy arrays of length ``seqlen``: ``input_ids``, ``labels``,
    ``position_ids`` (int64), ``loss_mask`` (float32) and ``cu_seqlens`` (int32).

    To continue a Megatron run from its checkpoint's ``consumed_train_samples`` (``c``), resume
    a non-shuffling sampler at position ``c``: with ``s = ResumableSampler(len(ds),
    shuffle=False)``, ``s.load_state_dict({**s.state_dict(), "position": c})`` (a state of world
    size 1; loaded by a sampler of ``world_size`` ranks, the ranks share positions ``c, c + 1,
    ...`` out between them).  Each step then serves Megatron's global batch of that step;
    Megatron gives rank ``r`` a contiguous block of each batch where the sampler deals them
    round-robin, which data-parallel training averages alike.
    """

    def __init__(
        self,
        store: TokenStore,
        seqlen: int,
        *,
        seed: int,
        num_samples: int | None = None,
        split: str | None = None,
        index_split: Any = "train",
        sequences: Any = None,
        add_extra_token: bool = True,
        drop_last_partial_validation_sequence: bool = True,
        pad_id: int = _PAD_TOKEN_ID,
        eot: int | None = None,
        reset_position_ids: bool = False,
        reset_attention_mask: bool = False,
        eod_mask_loss: bool = False,
        cache: bool = True,
    ) -> None:
        if not isinstance(store, TokenStore):
            raise TypeError(f"store must be a TokenStore (mmpack.open), got {type(store).__name__}")
        self.store = store
        self.seqlen = check_positive_int(seqlen, "seqlen")
        self.index_split = parse_option(MegatronSplit, index_split, "index_split")
        if split is not None and sequences is not None:
            raise ValueError("give split= or sequences=, not both")
        self.split = split
        self.pad_id = check_token_id(pad_id, "pad_id")
        self.eot = None if eot is None else check_token_id(eot, "eot")
        self.reset_position_ids = check_bool(reset_position_ids, "reset_position_ids")
        self.reset_attention_mask = check_bool(reset_attention_mask, "reset_attention_mask")
        self.eod_mask_loss = check_bool(eod_mask_loss, "eod_mask_loss")
        if self.eot is None and (reset_position_ids or reset_attention_mask or eod_mask_loss):
            raise ValueError(
                "reset_position_ids, reset_attention_mask and eod_mask_loss need eot= "
                "(the tokenizer's end-of-document id)"
            )
        self.cache = check_bool(cache, "cache")
        self._options = {
            "seed": seed,
            "num_samples": num_samples,
            "index_split": self.index_split,
            "add_extra_token": add_extra_token,
            "drop_last_partial_validation_sequence": drop_last_partial_validation_sequence,
        }
        self._given = None if sequences is None else np.asarray(sequences)
        self._setup()

    def _setup(self) -> None:
        """Per-process state, rebuilt after unpickling (the order is mapped from the cache or
        computed again, never pickled)."""
        self._seqs: StoreSequences = store_sequences(self.store)
        if self._given is not None:
            chosen = self._given
        elif self.split is not None:
            chosen = split_sequences(self.split, self.index_split, len(self._seqs))
        else:
            chosen = np.arange(len(self._seqs), dtype=np.int32)
        self.order: MegatronOrder = cached_order(
            self.store, self._seqs, chosen, self.seqlen, cache=self.cache, **self._options
        )
        self.sequences = chosen
        self.extra = self.order.extra
        self.width = self.seqlen + self.extra

    def __getstate__(self) -> dict[str, Any]:
        keep = ("store", "seqlen", "index_split", "split", "pad_id", "eot", "cache", "_options")
        state = {k: self.__dict__[k] for k in keep}
        state.update(
            {k: self.__dict__[k] for k in self.__dict__ if k.startswith(("reset_", "eod_"))}
        )
        state["_given"] = self._given
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __len__(self) -> int:
        return len(self.order)

    def __repr__(self) -> str:
        return (
            f"MegatronGPTDataset({self.store!r}, seqlen={self.seqlen}, "
            f"seed={self._options['seed']}, num_samples={self._options['num_samples']}, "
            f"index_split={self.index_split.value!r}) -> {len(self)} samples"
        )

    # ------------------------------------------------------------------------------- access
    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self._gather(np.array([check_index(i, len(self))], dtype=np.int64))[0]

    def __getitems__(self, indices: Any) -> SampleBatch:
        """A batch: a sequence of the samples' dicts backed by ``(k, seqlen)`` arrays."""
        return self._gather(check_indices(indices, len(self)))

    def _pieces(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(piece_ptr, piece_start, piece_len)`` of samples ``idx`` (validated)."""
        order, seqs = self.order, self._seqs
        picks = order.shuffle_index[idx].astype(np.int64)
        si = order.sample_index
        ptr = np.zeros(idx.shape[0] + 1, dtype=np.int64)
        np.cumsum(si[picks + 1, 0].astype(np.int64) - si[picks, 0] + 1, out=ptr[1:])
        starts = np.empty(int(ptr[-1]), dtype=np.int64)
        lens = np.empty(int(ptr[-1]), dtype=np.int64)
        if idx.shape[0]:
            sample_pieces(
                seqs.pointers,
                seqs.itemsize,
                seqs.sizes,
                order.document_index,
                si,
                picks,
                self.extra,
                self.width,
                ptr,
                starts,
                lens,
            )
        return ptr, starts, lens

    def _gather(self, idx: np.ndarray) -> SampleBatch:
        ptr, starts, lens = self._pieces(idx)
        src, cursors = self.store.read_ranges(starts, lens)
        rows = np.empty((idx.shape[0], self.width), dtype=np.int64)
        if idx.shape[0]:
            copy_pieces(src, cursors, ptr, lens, self.pad_id, rows)
        return self._fields(rows)

    def _fields(self, rows: np.ndarray) -> SampleBatch:
        """``GPTDataset.__getitem__``'s fields for a batch of raw rows (``seqlen + extra``
        tokens each, padded with ``pad_id``), in its order of steps."""
        k, n, pad = rows.shape[0], self.seqlen, self.pad_id
        tokens = rows[:, :n]
        if self.extra:
            labels = rows[:, 1:]
        else:
            labels = np.empty_like(tokens)
            labels[:, :-1] = rows[:, 1:]
            labels[:, -1] = pad
        loss_mask = np.ones((k, n), dtype=np.float32)
        eods = tokens == self.eot if self.eot is not None else None
        if self.eod_mask_loss and eods is not None:
            loss_mask[eods] = 0.0
        positions = np.broadcast_to(np.arange(n, dtype=np.int64), (k, n))
        if self.reset_position_ids and eods is not None:
            after = np.zeros((k, n), dtype=np.int64)  # t + 1 right after an eod at t
            after[:, 1:] = np.where(eods[:, :-1], np.arange(1, n), 0)
            positions = positions - np.maximum.accumulate(after, axis=1)
        cu = np.zeros((k, n + 1), dtype=np.int32)
        ncu = np.full(k, 2, dtype=np.int64)
        cu[:, 1] = n
        if self.reset_attention_mask and eods is not None:
            for r in range(k):
                cuts = np.flatnonzero(eods[r, : n - 1]) + 1
                ncu[r] = cuts.shape[0] + 2
                cu[r, 1 : cuts.shape[0] + 1] = cuts
                cu[r, cuts.shape[0] + 1] = n
        loss_mask[labels == pad] = 0.0
        rows[rows == pad] = 0
        if not self.extra:
            labels[labels == pad] = 0
        columns = {
            "input_ids": tokens,
            "labels": labels,
            "loss_mask": loss_mask,
            "position_ids": np.ascontiguousarray(positions),
        }
        return SampleBatch(columns, cu, ncu)

    # ------------------------------------------------------------------------------- debugging
    def locate(self, i: int) -> list[dict[str, int]]:
        """Where sample ``i`` comes from: one entry per sequence it reads, in order, with the
        sequence index (the ``.idx``'s) and the token range ``[start, stop)`` inside it."""
        j = check_index(i, len(self))
        ptr, starts, lens = self._pieces(np.array([j], dtype=np.int64))
        order = self.order
        pick = int(order.shuffle_index[j])
        kb = int(order.sample_index[pick, 0])
        out = []
        for q in range(int(ptr[0]), int(ptr[1])):
            s = int(order.document_index[kb + q])
            first = int(self._seqs.pointers[s]) // self._seqs.itemsize
            lo = int(starts[q]) - first
            out.append({"sequence": s, "start": lo, "stop": lo + int(lens[q])})
        return out
