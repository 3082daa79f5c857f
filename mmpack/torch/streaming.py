"""The streaming packer as a torch ``IterableDataset``: ``DataLoader(PackerDataset(...), batch_size=None)``.

:class:`~mmpack.streaming.packer.StreamingPacker` is a plain iterable (no ``len``), so a
``DataLoader`` given it directly takes it for a map-style dataset and fails on ``len()``; and
several workers or ranks iterating copies of it would each emit the whole stream.
:class:`PackerDataset` is the opt-in wrapper that fixes both (the packer itself is unchanged):

* **Sharding.**  The ``S = world_size * num_workers`` consumers each build their own packer over
  their shard of the source, shard ``k = rank * num_workers + worker_id``.  A random-access source
  (a TokenStore, a view, a list, a map-style dataset) is cut into ``S`` contiguous blocks of
  documents (block ``k`` is documents ``[k * n // S, (k + 1) * n // S)``; a TokenStore block keeps
  the store fast path: one ``read_ranges`` per batch); an opaque iterable is dealt round-robin
  (consumer ``k`` keeps items ``k, k + S, ...``; every consumer reads the whole stream and keeps
  its share).  Every document lands in exactly one shard.  Ranks may emit different numbers of
  batches: the shards pack independently.
* **The views' batch format.**  Each packed batch is laid out as
  :func:`mmpack.torch.collate.collate` lays out the views' batches: ``input_ids``,
  ``attention_mask``, ``position_ids`` (restarting at every segment) and the labels as
  ``targets`` when the mode has them, as int64 (or ``dtype``) ``(B, seqlen)`` tensors; the flat ``cu_seqlens``
  (int32, the whole batch as one sequence), ``cu_seqlens_rows`` and ``max_seqlen`` (int).
  :func:`mmpack.torch.hf.hf_inputs` and :mod:`mmpack.torch.attention` take it as they take
  the views' batches.
* **eot.**  With ``eot=`` an end-of-text token is appended to every source sequence before packing,
  so it closes every document, as in the views (a split document gets it on its last piece only).

Cost: the packer's own (see its module docstring) plus one collate per batch (an ``O(B * L)``
copy of each field and ``O(B + segments)`` boundary work); a TokenStore shard adds no copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mmpack.core.validation import check_token_id
from mmpack.streaming.packer import StreamingPacker
from mmpack.streaming.sources import (
    batch_items,
    detect_format,
    is_indexable,
    is_store_like,
    tokens_of,
)
from mmpack.torch.collate import BATCH_TOKEN_FIELDS, collate

__all__ = ["PackerDataset"]


class PackerDataset(IterableDataset):
    """A sharded :class:`StreamingPacker` for ``DataLoader(ds, batch_size=None, num_workers=...)``.

    Parameters
    ----------
    source : iterable
        As for :class:`StreamingPacker` (sequences, incoming batches of sequences, or a
        random-access source of sequences).  With incoming batches (an opaque iterable), each
        incoming batch is one unit of the round-robin deal.
    rank, world_size : int, optional
        This process's share; default ``torch.distributed``'s rank and world size when a process
        group is initialised, else 0 and 1.
    eot : int, optional
        Token appended to every source sequence before packing.
    dtype : torch.dtype, default torch.int64
        Dtype of the per-token tensors (``torch.int32`` halves the transfer from workers).
    **packer_kwargs
        Everything else :class:`StreamingPacker` takes (``out_batch_size``, ``seqlen``,
        ``buffer_size``, ``mode``, ...); ``return_tensors`` is managed here.  ``world_size`` is
        passed on for the packer's schedules.

    Notes
    -----
    :meth:`set_epoch` before each epoch (the sampler convention); every shard's packer walks
    that epoch (its masks are keyed by it).  A packer's :meth:`~StreamingPacker.state_dict` is
    per shard: this wrapper does not checkpoint.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        eot: int | None = None,
        dtype: torch.dtype = torch.int64,
        **packer_kwargs: Any,
    ) -> None:
        if rank is None or world_size is None:
            dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank = (torch.distributed.get_rank() if dist_on else 0) if rank is None else rank
            world_size = (
                (torch.distributed.get_world_size() if dist_on else 1)
                if world_size is None
                else world_size
            )
        if (
            isinstance(world_size, bool)
            or not isinstance(world_size, (int, np.integer))
            or world_size < 1
        ):
            raise ValueError(f"world_size must be an int >= 1, got world_size={world_size!r}")
        if (
            isinstance(rank, bool)
            or not isinstance(rank, (int, np.integer))
            or not 0 <= rank < world_size
        ):
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size, got rank={rank!r}, world_size={world_size}"
            )
        if dtype not in (torch.int64, torch.int32):
            raise ValueError(f"dtype must be torch.int64 or torch.int32, got dtype={dtype}")
        if "return_tensors" in packer_kwargs:
            raise ValueError(
                "return_tensors is managed by PackerDataset (it emits torch tensors); drop it"
            )
        self.source = source
        self.rank, self.world_size = int(rank), int(world_size)
        self.eot = None if eot is None else check_token_id(eot, "eot")
        self.dtype = dtype
        packer_kwargs.setdefault("world_size", self.world_size)
        self._packer_kwargs = packer_kwargs
        self._epoch = 0
        StreamingPacker(self._source_for(0, 1), **packer_kwargs)  # validate the options now
        self._packer: StreamingPacker | None = None
        self._shard: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_packer"], state["_shard"] = None, None  # each worker builds its own
        return state

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next ``iter()`` (``epoch >= 0``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got epoch={epoch!r}")
        self._epoch = int(epoch)

    def shard(self) -> tuple[int, int]:
        """``(k, S)``: this consumer's shard index and the number of shards."""
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return self.rank * workers + worker, self.world_size * workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = self.shard()
        if self._packer is None or self._shard != shard:
            self._packer = StreamingPacker(self._source_for(*shard), **self._packer_kwargs)
            self._shard = shard
        self._packer.set_epoch(self._epoch)
        for batch in self._packer:
            yield self._format(batch)

    def _source_for(self, k: int, n_shards: int) -> Any:
        source = self.source
        fmt = self._packer_kwargs.get("source_format", "auto")
        if fmt != "batches" and is_indexable(source):
            n = len(source)  # type: ignore[arg-type]  # is_indexable: it has __len__
            lo, hi = k * n // n_shards, (k + 1) * n // n_shards
            if self.eot is None and is_store_like(source):
                return _StoreBlock(source, lo, hi)
            return _Block(source, lo, hi, self.eot)
        return _RoundRobin(source, k, n_shards, self.eot)

    def _format(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["input_ids"]
        n_rows, seqlen = ids.shape
        rows = []
        for r in range(n_rows):
            cu = np.asarray(batch["cu_seqlens"][r], dtype=np.int64)
            positions = np.arange(seqlen, dtype=np.int64) - np.repeat(cu[:-1], np.diff(cu))
            row = {
                "input_ids": ids[r],
                "attention_mask": batch["attention_mask"][r],
                "position_ids": positions,
                "cu_seqlens": batch["cu_seqlens"][r],
            }
            if batch.get("labels") is not None:
                row["labels"] = batch["labels"][r]
            rows.append(row)
        out = collate(rows)
        if self.dtype != torch.int64:
            for key in BATCH_TOKEN_FIELDS:
                if key in out:
                    out[key] = out[key].to(self.dtype)
        if "mask_prob" in batch:
            out["mask_prob"] = torch.as_tensor(batch["mask_prob"])
        return out


class _Block:
    """Documents ``[lo, hi)`` of a random-access source (with ``eot`` appended, if given)."""

    def __init__(self, source: Any, lo: int, hi: int, eot: int | None) -> None:
        self.source, self.lo, self.hi, self.eot = source, lo, hi, eot

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, j: int) -> Any:
        if not 0 <= j < self.hi - self.lo:
            raise IndexError(j)
        return _with_eot(tokens_of(self.source[self.lo + j]), self.eot)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


class _StoreBlock:
    """Documents ``[lo, hi)`` of a TokenStore, still read through ``read_ranges``."""

    def __init__(self, store: Any, lo: int, hi: int) -> None:
        self.store, self.lo, self.hi = store, lo, hi
        self.offsets = np.asarray(store.offsets[lo : hi + 1])  # flat offsets, a view: no copy

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, j: int) -> Any:
        if not 0 <= j < self.hi - self.lo:
            raise IndexError(j)
        return self.store[self.lo + j]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> Any:
        return self.store.read_ranges(starts, lengths)


class _RoundRobin:
    """Items ``k, k + S, ...`` of an opaque iterable (with ``eot`` appended to sequences)."""

    def __init__(self, source: Iterable[Any], k: int, n_shards: int, eot: int | None) -> None:
        self.source, self.k, self.n_shards, self.eot = source, k, n_shards, eot

    def __iter__(self) -> Iterator[Any]:
        items = itertools.islice(self.source, self.k, None, self.n_shards)
        if self.eot is None:
            return items
        return (self._eot_item(x) for x in items)

    def _eot_item(self, item: Any) -> Any:
        if detect_format([item]) == "batches":  # an incoming batch: eot after each sequence
            return [_with_eot(tokens_of(x), self.eot) for x in batch_items(item)]
        return _with_eot(tokens_of(item), self.eot)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def _with_eot(tokens: Any, eot: int | None) -> Any:
    if eot is None:
        return tokens
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.numpy()
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"eot= needs 1-D source sequences, got shape {tokens.shape}")
    out = np.empty(tokens.shape[0] + 1, dtype=np.int64)
    out[:-1] = tokens
    out[-1] = eot
    return out
