"""Output passes of the packing plan: placements to the CSR plan (``bin_ptr``, ``piece_doc``,
``piece_start``, ``piece_len``), each O(n_pieces).

:func:`emit_groups` writes best-fit decreasing's groups of identical bins
(:func:`mmpack.kernels.plan_bestfit.bfd_groups`); :func:`emit_by_rank` writes online best fit's
items bin by bin in emission order (:func:`mmpack.kernels.plan_bestfit.online_place`).  Neither
calls a jitted function of another module.
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = [
    "GROUP_COUNT",
    "GROUP_NODE",
    "NODE_PARENT",
    "NODE_SIZE",
    "NODE_TAKE",
    "emit_by_rank",
    "emit_groups",
]

# Rows of best-fit decreasing's node and group tables (int64, shape (3, capacity)).
NODE_PARENT = 0  # the node before it on the group's path (-1: none)
NODE_SIZE = 1  # item size
NODE_TAKE = 2  # items of that size each bin of the group takes
GROUP_COUNT = 0  # identical bins in the group
GROUP_NODE = 1  # the last node of the group's path


@njit
def emit_groups(
    nodes: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    pool: np.ndarray,
    order: np.ndarray,
    order_start: np.ndarray,
    eot: int,
    nb: int,
    p: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> int:
    """Write the groups' bins after the ``nb`` bins and ``p`` pieces already written, dealing
    each size's documents in document order; returns the number of bins.  O(n_pieces)."""
    path = np.empty(nodes.shape[1], dtype=np.int64)  # a path visits distinct nodes
    for gi in range(n_groups):
        depth = 0
        v = groups[GROUP_NODE, gi]
        while v >= 0:
            path[depth] = v
            depth += 1
            v = nodes[NODE_PARENT, v]
        for _ in range(groups[GROUP_COUNT, gi]):
            bin_ptr[nb] = p
            nb += 1
            for lev in range(depth - 1, -1, -1):
                v = path[lev]
                size = nodes[NODE_SIZE, v]
                k = pool[size]
                for _ in range(nodes[NODE_TAKE, v]):
                    piece_doc[p] = order[k]
                    piece_start[p] = order_start[k]
                    piece_len[p] = size - eot
                    k += 1
                    p += 1
                pool[size] = k
    bin_ptr[nb] = p
    return nb


@njit
def emit_by_rank(
    item_doc: np.ndarray,
    item_start: np.ndarray,
    item_len: np.ndarray,
    item_bin: np.ndarray,
    emit_rank: np.ndarray,
    n_bins: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> int:
    """Write the items bin by bin, bins in emission order (bin ``b`` is output bin
    ``emit_rank[b]``), items of a bin in document order; returns ``n_bins``."""
    n_items = item_bin.shape[0]
    fill = np.empty(n_bins + 1, dtype=np.int64)
    for r in range(n_bins + 1):
        fill[r] = 0
    for i in range(n_items):
        fill[emit_rank[item_bin[i]] + 1] += 1
    for r in range(n_bins):
        fill[r + 1] += fill[r]
    for r in range(n_bins + 1):
        bin_ptr[r] = fill[r]
    for i in range(n_items):
        r = emit_rank[item_bin[i]]
        q = fill[r]
        fill[r] += 1
        piece_doc[q] = item_doc[i]
        piece_start[q] = item_start[i]
        piece_len[q] = item_len[i]
    return n_bins
