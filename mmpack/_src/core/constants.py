"""Numbers every layer agrees on, defined once."""

from __future__ import annotations

__all__ = [
    "DOC_ORDER_STREAM",
    "FETCH_BLOCK_BYTES",
    "IGNORE_INDEX",
    "INT32_MAX",
    "NODE_CACHE_BYTES",
    "SPLIT_STREAM",
    "UINT64_LIMIT",
    "WINDOW_BLOCKS",
]

IGNORE_INDEX = -100
"""Label of a position that takes no loss (PyTorch's ``CrossEntropyLoss`` default)."""

INT32_MAX = 2**31 - 1
"""Largest ``cu_seqlens`` value (FlashAttention takes int32 boundaries)."""

UINT64_LIMIT = 2**64
"""Seeds and epochs are keys in ``[0, UINT64_LIMIT)``."""

WINDOW_BLOCKS = 256
"""Default blocks per window of the block-window order (:mod:`mmpack._src.sampling.block_order`):
two samples of a window then share a block with probability below ``1 / 256``."""

DOC_ORDER_STREAM = 0x646F635F6F726472  # "doc_ordr" in ASCII
"""The first int of the key of a build's document order (``shuffle_docs=``,
:mod:`mmpack._src.store.doc_order`): the order of ``shuffle_docs=s`` is the permutation of the key
``(DOC_ORDER_STREAM, s)``, never one a sampler draws from a plain seed ``s``."""

FETCH_BLOCK_BYTES = 4 << 20
"""Bytes per block of ``loader(shuffle="blocks")`` (``view.block_bounds``): one large read each."""

NODE_CACHE_BYTES = 2 * WINDOW_BLOCKS * FETCH_BLOCK_BYTES
"""Node cache of a remote store opened without ``cache_limit`` (2 GiB): the two windows of the
block-window order at the defaults that the whole-block fetch holds (:mod:`mmpack._src.remote.opener`)."""

SPLIT_STREAM = 0x73706C6974646F63  # "splitdoc" in ASCII
"""The first int of the key of ``store.split(fractions, seed)`` (:mod:`mmpack._src.store.subset`): the
documents' hash keys are drawn from ``(SPLIT_STREAM, seed)``, never from a sampler's plain seed."""
