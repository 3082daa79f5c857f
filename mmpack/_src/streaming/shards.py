"""Which share of a source a streaming packer packs, and the source as that share presents it.

A packer is one *consumer* among ``S = world_size * num_workers``: the ranks of a run times the
DataLoader workers of each rank.  Consumer ``k = rank * num_workers + worker`` packs shard ``k``:

* a random-access source (a TokenStore, a view, a list, a map-style dataset) is cut into ``S``
  contiguous document ranges, range ``k`` being documents ``[k * n // S, (k + 1) * n // S)``
  (:class:`DocRange`; a TokenStore's range keeps the store's ``read_ranges`` path,
  :class:`StoreDocRange`);
* an opaque iterable is dealt round-robin: consumer ``k`` keeps items ``k, k + S, ...`` of the
  stream (:class:`_RoundRobin`; every consumer reads the whole stream; with incoming batches an
  incoming batch is one unit of the deal).

Every document lands in exactly one shard; shards pack independently (ranks may emit different
numbers of batches).  With ``eot`` every source sequence gets that token appended (a copy per
sequence), so it closes every document as in the views (a document's loss mask gets a 1: the eot
is a target, as in the views).  A masked TokenStore's document range reads its documents' masks with
their tokens (:attr:`StoreDocRange.loss_mask`, or ``{"input_ids", "loss_mask"}`` documents when
the eot is appended).  The consumer is known to the layer that
runs the packer: without one (:func:`set_consumer_provider`, which :mod:`mmpack._src.torch.streaming`
sets to read ``torch.distributed`` and the DataLoader's worker) a packer is the only consumer.
Cost: O(1) per document on top of the source's own reads; none at all for one consumer and no
``eot`` (the source is read as it is).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.streaming.incoming import flat_documents
from mmpack._src.streaming.sources import batch_items, detect_format

__all__ = [
    "Consumer",
    "DocRange",
    "StoreDocRange",
    "consumer_provider",
    "current_consumer",
    "set_consumer_provider",
    "shard_source",
]


@dataclass(frozen=True)
class Consumer:
    """Where a packer runs: rank ``rank`` of ``world_size``, worker ``worker`` of its
    ``num_workers`` DataLoader workers (0 of 1 outside a worker); ``distributed`` when the ranks
    come from an initialised process group (a worker started by "spawn" has none, though its
    parent had)."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    distributed: bool = False

    @property
    def shard(self) -> tuple[int, int]:
        """``(k, S)``: this consumer's shard and the number of shards."""
        return self.rank * self.num_workers + self.worker, self.world_size * self.num_workers


_provider: list[Callable[[], Consumer]] = []


def set_consumer_provider(provider: Callable[[], Consumer] | None) -> None:
    """Make ``provider()`` the consumer a packer asks for at the start of every epoch (None: no
    provider; every packer is then the only consumer).  A module-level function, so that a
    packer pickled into a worker process brings it along by name."""
    _provider[:] = [] if provider is None else [provider]


def consumer_provider() -> Callable[[], Consumer] | None:
    """The provider :func:`set_consumer_provider` set, or None."""
    return _provider[0] if _provider else None


def current_consumer(
    rank: int | None = None,
    world_size: int | None = None,
    inherited: tuple[int, int] | None = None,
) -> Consumer:
    """The consumer the provider reports now, with ``rank`` and ``world_size`` replaced by the
    values given (a packer told its rank), or by ``inherited`` (the parent process's ranks, for a
    worker without a process group of its own); ``ValueError`` unless ``0 <= rank <
    world_size``."""
    found = _provider[0]() if _provider else Consumer()
    if not found.distributed and inherited is not None:
        found = Consumer(*inherited, found.worker, found.num_workers, distributed=True)
    consumer = Consumer(
        found.rank if rank is None else rank,
        found.world_size if world_size is None else world_size,
        found.worker,
        found.num_workers,
        found.distributed or rank is not None or world_size is not None,
    )
    if not 0 <= consumer.rank < consumer.world_size:
        raise ValueError(
            f"rank must satisfy 0 <= rank < world_size, got rank={consumer.rank}, "
            f"world_size={consumer.world_size}"
        )
    return consumer


def shard_source(
    source: Any, k: int, n_shards: int, *, indexed: bool, store_like: bool, eot: int | None
) -> tuple[Any, bool]:
    """Shard ``k`` of ``n_shards`` of ``source`` (with ``eot`` appended to every sequence), and
    whether it is still read through ``read_ranges`` (store-like).  ``source`` itself when there
    is one shard and no ``eot``."""
    if n_shards == 1 and eot is None:
        return source, store_like
    if indexed:
        n = len(source)
        lo, hi = k * n // n_shards, (k + 1) * n // n_shards
        if eot is None and store_like:
            return StoreDocRange(source, lo, hi), True
        mask = source.loss_mask if store_like else None
        return DocRange(source, lo, hi, eot, mask), False
    return _RoundRobin(source, k, n_shards, eot), False


class DocRange:
    """Documents ``[lo, hi)`` of a random-access source (with ``eot`` appended, if given); with
    ``mask`` (the loss mask store of a TokenStore ``source``) each is a document
    ``{"input_ids", "loss_mask"}``."""

    def __init__(self, source: Any, lo: int, hi: int, eot: int | None, mask: Any = None) -> None:
        self.source, self.lo, self.hi, self.eot, self.mask = source, lo, hi, eot, mask

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, j: int) -> Any:
        if not 0 <= j < self.hi - self.lo:
            raise IndexError(j)
        item = self.source[self.lo + j]
        if self.mask is not None:
            item = {"input_ids": item, "loss_mask": self.mask[self.lo + j]}
        return with_eot(item, self.eot, self.lo + j)


class StoreDocRange(DocRange):
    """Documents ``[lo, hi)`` of a TokenStore, still read through ``read_ranges``."""

    def __init__(self, store: Any, lo: int, hi: int) -> None:
        super().__init__(store, lo, hi, None)
        self.offsets = np.asarray(store.offsets[lo : hi + 1])  # flat offsets, a view: no copy

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> Any:
        return self.source.read_ranges(starts, lengths)

    @property
    def loss_mask(self) -> Any:
        """The store's loss mask store (its flat ranges are the store's), or None."""
        return self.source.loss_mask


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
            return [with_eot(x, self.eot) for x in batch_items(item)]
        return with_eot(item, self.eot)


def with_eot(item: Any, eot: int | None, index: int = 0) -> Any:
    """The tokens of ``item`` (a source sequence or a dict with ``input_ids``, checked by the
    build's token rule and named as document ``index`` in its errors) followed by ``eot``, as
    one new int64 array; a document with a ``loss_mask`` becomes ``{"input_ids": that array,
    "loss_mask": its mask followed by 1}`` (an eot is a target).  ``item`` as it is when ``eot``
    is None."""
    if eot is None:
        return item
    flat, _, mask = flat_documents([item], index)
    out = np.empty(flat.shape[0] + 1, dtype=np.int64)
    out[:-1] = flat
    out[-1] = eot
    if mask is None:
        return out
    return {"input_ids": out, "loss_mask": np.append(mask, np.uint8(1))}
