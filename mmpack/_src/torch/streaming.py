"""The streaming packer in torch: a DataLoader dataset, its consumers, its tensors.

Importing this module (any ``mmpack.torch`` module does) makes
:class:`~mmpack.StreamingPacker` a torch ``IterableDataset`` (a registered
virtual subclass), so ``DataLoader(packer, batch_size=None, num_workers=...)`` iterates it, and
tells the packer which consumer it runs as (:func:`torch_consumer`: ``torch.distributed``'s rank
and world size, carried along into spawned workers, and the DataLoader's worker id and count):
each packer packs its own shard of the source (:mod:`mmpack._src.streaming.shards`), every document
in exactly one shard.  The DataLoader turns the numpy batches into tensors (zero-copy in the
main process); :func:`as_tensors` does the same for a packer iterated directly.  A torchdata
``StatefulDataLoader`` saves and restores each worker's packer position through
:meth:`~mmpack.StreamingPacker.state_dict` without replaying batches (an opaque
iterable has no position: its ``state_dict`` raises ``TypeError``).

:class:`PackerDataset` is the packer with the views' batch layout, as
:func:`mmpack.torch.collate` lays it out (``input_ids``, ``attention_mask``,
``position_ids`` and ``targets`` as ``(B, seqlen)`` tensors; the flat ``cu_seqlens``,
``cu_seqlens_rows`` and ``max_seqlen``), which :func:`mmpack.torch.hf_inputs` and
:mod:`mmpack._src.torch.attention` take as they take the views'.

Cost: the packer's own (:mod:`mmpack._src.streaming.packer`); :class:`PackerDataset` adds one collate
per batch (an ``O(B * L)`` copy of each field and ``O(B + segments)`` boundary work).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mmpack._src.streaming.packer import StreamingPacker
from mmpack._src.streaming.shards import Consumer, set_consumer_provider
from mmpack._src.torch.collate import collate

__all__ = ["PackerDataset", "as_tensors", "torch_consumer"]


def torch_consumer() -> Consumer:
    """The consumer the calling code runs as: ``torch.distributed``'s rank and world size (0 and
    1 without an initialised process group) and the DataLoader worker (0 of 1 outside one)."""
    dist = torch.distributed
    on = dist.is_available() and dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if on else (0, 1)
    info = get_worker_info()
    worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
    return Consumer(rank, world_size, worker, num_workers, distributed=on)


set_consumer_provider(torch_consumer)
IterableDataset.register(StreamingPacker)


def as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """A packer batch with its arrays as torch tensors (zero-copy ``torch.from_numpy``):
    ``input_ids``, ``attention_mask``, ``targets`` and ``mask_prob`` tensors, ``cu_seqlens`` a list
    of int32 tensors; ``max_seqlen`` (ints) and a ``None`` label as they are."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "cu_seqlens":
            out[key] = [torch.from_numpy(x) for x in value]
        elif key == "max_seqlen" or value is None:
            out[key] = value
        else:  # (np.ascontiguousarray would make the 0-d mask_prob 1-d)
            out[key] = torch.from_numpy(value if value.flags.c_contiguous else value.copy())
    return out


class PackerDataset(IterableDataset):
    """A :class:`StreamingPacker` emitting the views' collate layout, for
    ``DataLoader(ds, batch_size=None, num_workers=...)``.

    Parameters
    ----------
    source : iterable
        As for :class:`StreamingPacker`.
    dtype : torch.dtype, default torch.int64
        Dtype of the per-token tensors (``torch.int32`` halves the transfer from workers).
    **packer_kwargs
        Everything :class:`StreamingPacker` takes (``batch_size``, ``seqlen``, ``buffer_size``,
        ``mode``, ``eot``, ``rank``, ``world_size``, ``shard``, ...), checked at once.

    Notes
    -----
    Epochs, shards and the state are the packer's (:attr:`packer`): every ``iter()`` is the next
    epoch, :meth:`set_epoch` chooses it (call it before every epoch when DataLoader workers
    iterate copies of the dataset), and :meth:`state_dict` / :meth:`load_state_dict` are the
    packer's, so a torchdata ``StatefulDataLoader`` resumes it without replay.
    """

    def __init__(
        self, source: Iterable[Any], *, dtype: torch.dtype = torch.int64, **packer_kwargs: Any
    ) -> None:
        if dtype not in (torch.int64, torch.int32):
            raise ValueError(f"dtype must be torch.int64 or torch.int32, got dtype={dtype}")
        self.dtype = dtype
        self.packer = StreamingPacker(source, **packer_kwargs)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start epoch ``epoch`` (``epoch >= 0``)."""
        self.packer.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The packer's :meth:`~StreamingPacker.state_dict`."""
        return self.packer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The packer's :meth:`~StreamingPacker.load_state_dict`."""
        self.packer.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.packer:
            yield self._format(batch)

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
            if batch.get("targets") is not None:
                row["labels"] = batch["targets"][r]  # a sample's name; collate gives "targets"
            rows.append(row)
        out = collate(rows, dtype=self.dtype)
        if "mask_prob" in batch:
            out["mask_prob"] = torch.as_tensor(batch["mask_prob"])
        return out
