"""Documents written in a keyed order at build (``shuffle_docs=``): a block of neighbouring
documents is then already a random sample of the corpus.

Algorithm (exact, O(1) extra memory).  The build writes its input in order into a temporary
store inside its own temporary folder (:data:`UNSHUFFLED`, memmap, never fsynced, never where a
reader looks for a store), then writes the final store by reading the documents in the order of
a keyed permutation of ``range(n_docs)``: document ``j`` of the store is document ``perm[j]`` of
the input, ``perm = Permutation(n_docs, seed=_doc_order_key(shuffle_docs))``
(:mod:`mmpack._src.core.permutation_keys`, evaluated by :mod:`mmpack._src.kernels.permutation`; the key is
``(DOC_ORDER_STREAM, *shuffle_docs)``), and removes the temporary store before publishing.
Documents are read in chunks of at most :data:`CHUNK_DOCS` documents and about a quarter of
the writer's ``buffer_tokens`` tokens (a longer document alone), handed to the writer as views
of the temporary store's mapping (written from place: no copy of the tokens), so memory stays
that of an ordinary build whatever the corpus.

Cost: twice the token bytes on disk while the build runs (the temporary store and the final
one), one more sequential write (the temporary store) and one random read of every document
(from the page cache when the corpus fits in memory; one seek per document from a cold disk),
plus ``ROUNDS`` multiply-xorshift mixes per document for the order.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import numpy as np

from mmpack._src.core.constants import DOC_ORDER_STREAM
from mmpack._src.core.permutation_keys import SeedLike, epoch_keys, feistel_width
from mmpack._src.core.validation import check_seed_parts
from mmpack._src.kernels.permutation import permute_many
from mmpack._src.store.reader import TokenStore

__all__ = [
    "CHUNK_DOCS",
    "ORDER_SECTION",
    "UNSHUFFLED",
    "check_shuffle_docs",
    "doc_order",
    "order_record",
    "rewrite",
    "write_in_order",
]

UNSHUFFLED = "unshuffled"
"""The temporary store's folder, inside the build's temporary folder."""
ORDER_SECTION = "order"
"""The metadata section that records a keyed document order (see :func:`order_record`)."""
CHUNK_DOCS = 8192
"""Documents read per chunk at most."""


def check_shuffle_docs(value: Any) -> SeedLike | None:
    """``shuffle_docs`` checked: None, an int or a tuple of ints, each in ``[0, 2**64)``.

    Raises
    ------
    TypeError
        A part that is not an integer (a bool, a float, a string), naming the value.
    ValueError
        A part out of range (a negative seed), naming the value.
    """
    if value is None:
        return None
    ints = check_seed_parts(value, "shuffle_docs")
    return ints if isinstance(value, tuple) else ints[0]


def _doc_order_key(seed: SeedLike) -> tuple[int, ...]:
    """The permutation key of ``shuffle_docs=seed``: ``(DOC_ORDER_STREAM, *seed)``."""
    return (DOC_ORDER_STREAM, *check_seed_parts(seed, "shuffle_docs"))


def order_record(seed: SeedLike, parts: int | None = None) -> dict[str, Any]:
    """The ``"order"`` metadata section of a store written with ``shuffle_docs=seed``: the
    seed and the permutation's key; for a distributed build of ``parts`` parts, that each part's
    documents are keyed by ``(*seed, part)`` and the parts joined in the keyed order of
    ``seed``."""
    rec: dict[str, Any] = {
        "documents": "keyed" if parts is None else "keyed within each part",
        "seed": list(seed) if isinstance(seed, tuple) else seed,
        "key": list(_doc_order_key(seed)),
    }
    if parts is not None:
        rec["parts"] = "keyed"
        rec["part_count"] = parts
    return rec


def doc_order(n: int, seed: SeedLike, start: int, stop: int) -> np.ndarray:
    """The input documents of store positions ``start..stop-1`` of a build of ``n`` documents
    with ``shuffle_docs=seed``: ``Permutation(n, seed=_doc_order_key(seed)).map(range(start,
    stop))``.

    Returns
    -------
    numpy.ndarray, int64, shape (stop - start,)
    """
    if not 0 <= start <= stop <= n:
        raise ValueError(f"positions [{start}, {stop}) do not lie in [0, {n})")
    out = np.arange(start, stop, dtype=np.int64)
    if n > 1 and out.size:
        half_bits, mask = feistel_width(n)
        keys = epoch_keys(_doc_order_key(seed), np.zeros(1, dtype=np.uint64))[0]
        permute_many(out.copy(), out, n, half_bits, mask, keys)
    return out


def write_in_order(
    src: TokenStore, add: Callable[[list[Any]], None], seed: SeedLike, budget: int
) -> None:
    """Hand every document of ``src`` to ``add`` in the keyed order of ``seed``, in lists of at
    most :data:`CHUNK_DOCS` documents and about ``budget`` tokens (views of ``src``'s tokens,
    valid while ``src`` is open; with a loss mask, ``{"input_ids", "loss_mask"}`` dicts of
    views of both)."""
    n = len(src)
    offsets = src.offsets
    tokens = src.tokens
    if tokens is None:
        raise RuntimeError(f"{src.location}: the temporary store has no token mapping")
    mask = src.loss_mask.tokens if src.loss_mask is not None else None  # same offsets
    if src.loss_mask is not None and mask is None:
        raise RuntimeError(f"{src.location}: the temporary store's loss mask has no mapping")
    pos = 0
    while pos < n:
        ids = doc_order(n, seed, pos, min(n, pos + CHUNK_DOCS))
        starts = offsets[ids].tolist()
        ends = offsets[ids + 1].tolist()
        sizes = np.cumsum(offsets[ids + 1] - offsets[ids])
        lo = 0
        while lo < ids.size:
            done = int(sizes[lo - 1]) if lo else 0
            hi = max(lo + 1, int(np.searchsorted(sizes, done + max(budget, 1), side="right")))
            spans = zip(starts[lo:hi], ends[lo:hi])
            if mask is None:
                add([tokens[a:b] for a, b in spans])
            else:  # each document with its loss mask
                add([{"input_ids": tokens[a:b], "loss_mask": mask[a:b]} for a, b in spans])
            lo = hi
        pos += ids.size


def rewrite(
    inner: Any,
    open_files: Callable[[np.dtype], None],
    add: Callable[[list[Any]], None],
    seed: SeedLike,
    budget: int,
) -> None:
    """The commit of a shuffled build: publish the store of the documents in order that the
    writer ``inner`` (a :class:`~mmpack.store.StoreWriter` inside the build's temporary
    folder) wrote, open the final store's files in its dtype (``open_files``), hand its documents
    to ``add`` in the keyed order of ``seed`` (:func:`write_in_order`), then remove it."""
    inner.__exit__(None, None, None)
    src, inner.store = inner.store, None
    try:
        open_files(src.dtype)
        write_in_order(src, add, seed, budget)
    finally:
        del src
        shutil.rmtree(inner.path, ignore_errors=True)
