"""Placement kernels of the packing plan: best-fit decreasing (:func:`bfd`) and order-keeping
online best fit (:func:`stream`, the plan algorithm ``"online"``) over a 64-ary bitset tree.

Items and their sizes come from :mod:`mmpack.kernels.plan_items`; a bin holds ``S`` slots.

Free-space index.  Open bins are kept in buckets indexed by their free space ``f`` in
``[1, S)``; a 64-ary bitset tree over ``f`` (one bit per non-empty bucket, one bit per non-zero
word a level up) finds the smallest non-empty bucket ``>= L`` in ``O(log_64 S)`` word operations,
each a shift and a count of trailing zeros.  Memory follows the store, not ``S``: a bin's used
slots ``u = S - f`` never exceed ``T``, the slots of all items smaller than ``S``, so buckets,
tree, size pools and paths are indexed by ``f - D`` with ``D = S - U``, ``U = min(S, T + 1)``
(a monotone shift: every decision, hence every plan, is unchanged).  Three documents at
``S = 2**28`` then take a few words instead of 10 GB.

Best-fit decreasing (:func:`bfd`).  Items of size ``S`` each fill a bin, in document order.  The
others are counting-sorted by size (O(n + S), no comparison sort) and taken in decreasing size;
each goes to the open bin with the smallest free space that holds it, a new bin when none does.
Equal sizes being interchangeable, the kernel works on size classes and on groups of identical
bins (see :func:`bfd`), so its packing loop costs O(steps * log_64 S) with steps bounded by the
number of items but in practice by a function of ``S`` alone; the output pass is sequential,
O(n).  Among bins with equal free space the most recently moved group is chosen (each bucket is a
stack of groups); the number of bins and the multiset of bin fills do not depend on that choice.

Online best fit (:func:`stream`).  Items in document order; size-``S`` items are emitted at once
as bins of their own; every other item goes to the best-fitting of at most ``window`` open bins
(ties as above).  When none fits and the window is full, the fullest open bin (ties: the one that
reached its free space first, each bucket being a queue at that end) is closed and emitted before a
new bin opens; a bin left with no free space is emitted at once; at the end the open bins are
emitted in the order they were opened.  Bins are numbered in emission order, so the data order is
kept up to the window.  ``window = 1`` is next fit.  Cost O(n log_64 S + S).
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit
from mmpack.kernels.plan_items import LONG_SPLIT

__all__ = ["bfd", "n_full_pieces", "stream"]

_U0 = np.uint64(0)
_U1 = np.uint64(1)


@njit
def n_full_pieces(n: int, seqlen: int, eot: int, long_mode: int) -> int:
    """Full pieces a document of ``n`` tokens is split into before its last item."""
    t = n + eot
    if long_mode == LONG_SPLIT and t > seqlen:
        return (t - 1) // seqlen
    return 0


# --------------------------------------------------------------------------------- bitset tree
@njit
def _ctz(v: np.uint64) -> int:
    """Trailing zero bits of a non-zero uint64."""
    n = 0
    if (v & np.uint64(0xFFFFFFFF)) == _U0:
        n += 32
        v >>= np.uint64(32)
    if (v & np.uint64(0xFFFF)) == _U0:
        n += 16
        v >>= np.uint64(16)
    if (v & np.uint64(0xFF)) == _U0:
        n += 8
        v >>= np.uint64(8)
    if (v & np.uint64(0xF)) == _U0:
        n += 4
        v >>= np.uint64(4)
    if (v & np.uint64(0x3)) == _U0:
        n += 2
        v >>= np.uint64(2)
    if (v & _U1) == _U0:
        n += 1
    return n


@njit
def _tree_new(universe: int) -> tuple[np.ndarray, np.ndarray]:
    """A 64-ary bitset tree over ``[0, universe)``: flat words and the offset of each level."""
    nlev = 0
    size = universe
    while True:
        words = (size + 63) >> 6
        nlev += 1
        if words <= 1:
            break
        size = words
    off = np.empty(nlev + 1, dtype=np.int64)
    size = universe
    acc = 0
    for lev in range(nlev):
        words = (size + 63) >> 6
        off[lev] = acc
        acc += words
        size = words
    off[nlev] = acc
    return np.zeros(acc, dtype=np.uint64), off


@njit
def _tree_set(bits: np.ndarray, off: np.ndarray, x: int) -> None:
    for lev in range(off.shape[0] - 1):
        w = x >> 6
        i = off[lev] + w
        old = bits[i]
        bits[i] = old | (_U1 << np.uint64(x & 63))
        if old != _U0:
            return
        x = w


@njit
def _tree_clear(bits: np.ndarray, off: np.ndarray, x: int) -> None:
    for lev in range(off.shape[0] - 1):
        w = x >> 6
        i = off[lev] + w
        v = bits[i] & ~(_U1 << np.uint64(x & 63))
        bits[i] = v
        if v != _U0:
            return
        x = w


@njit
def _tree_succ(bits: np.ndarray, off: np.ndarray, x: int) -> int:
    """The smallest member ``>= x``, or -1."""
    nlev = off.shape[0] - 1
    lev = 0
    found = False
    while lev < nlev:
        w = x >> 6
        if off[lev] + w >= off[lev + 1]:
            return -1
        v = bits[off[lev] + w] >> np.uint64(x & 63)
        if v != _U0:
            x = x + _ctz(v)
            found = True
            break
        x = w + 1
        lev += 1
    if not found:
        return -1
    while lev > 0:
        lev -= 1
        x = x * 64 + _ctz(bits[off[lev] + x])
    return x


# --------------------------------------------------------------------------------- best fit
@njit
def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), dtype=np.int64)
    for i in range(a.shape[0]):  # not ``b[:n] = a``: its shape check compiles a formatted error
        b[i] = a[i]
    return b


@njit
def _universe(rem_occ: np.ndarray, seqlen: int) -> int:
    """``min(seqlen, T + 1)``, ``T`` the slots of all items smaller than ``seqlen``: bounds every
    item size and every open bin's used slots."""
    total = 0
    for d in range(rem_occ.shape[0]):
        r = rem_occ[d]
        if 0 < r < seqlen:
            total += r
            if total >= seqlen:
                return seqlen
    return total + 1


@njit
def _push_group(
    head: np.ndarray, bits: np.ndarray, off: np.ndarray, grp_next: np.ndarray, gi: int, i: int
) -> None:
    """Put group ``gi`` on top of bucket ``i`` (a stack of groups)."""
    if head[i] < 0:
        _tree_set(bits, off, i)
    grp_next[gi] = head[i]
    head[i] = gi


@njit
def _pop_group(
    head: np.ndarray, bits: np.ndarray, off: np.ndarray, grp_next: np.ndarray, i: int
) -> None:
    """Take the top group off bucket ``i``."""
    head[i] = grp_next[head[i]]
    if head[i] < 0:
        _tree_clear(bits, off, i)


@njit
def bfd(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> int:
    """Best-fit decreasing over size classes; writes the CSR plan, returns the number of bins.

    ``bin_ptr`` needs room for n_items + 1 entries, the piece arrays for n_items, where
    n_items = (full pieces) + count(rem_occ > 0); ``rem_occ`` comes from :func:`item_sizes`.

    Items of one size are interchangeable and best fit gives a chosen bin of free space ``f``
    ``f // L`` items of size ``L`` in a row, so bins are handled in *groups* of identical bins
    (same sizes placed, same free space): each step moves or splits a whole group, and the steps
    per size are the groups it exhausts plus one.  A group's contents are a path in a tree of
    ``(size, count)`` nodes.  At the end groups are emitted in creation order, and the documents
    of each size are dealt, in document order, to the bins in output order.
    """
    n = rem_occ.shape[0]
    nb = 0
    p = 0
    for d in range(n):
        k = n_full_pieces(doc_lens[d], seqlen, eot, long_mode)
        for j in range(k):
            bin_ptr[nb] = p
            piece_doc[p] = d
            piece_start[p] = j * seqlen
            piece_len[p] = seqlen
            p += 1
            nb += 1
        if rem_occ[d] == seqlen:
            bin_ptr[nb] = p
            piece_doc[p] = d
            piece_start[p] = k * seqlen
            piece_len[p] = seqlen - eot
            p += 1
            nb += 1

    # Index universe: sizes and used slots of open bins are < U (see the module docstring).
    univ = _universe(rem_occ, seqlen)
    shift = seqlen - univ
    # Counting sort of the other items: pool of size L is order[pool[L]:pool[L] + count[L]].
    count = np.zeros(univ + 1, dtype=np.int64)
    for d in range(n):
        r = rem_occ[d]
        if 0 < r < seqlen:
            count[r] += 1
    pool = np.zeros(univ + 1, dtype=np.int64)
    m = 0
    for size in range(1, univ):
        pool[size] = m
        m += count[size]
    cursor = pool.copy()
    order = np.empty(m, dtype=np.int64)
    order_start = np.empty(m, dtype=np.int64)
    for d in range(n):
        r = rem_occ[d]
        if 0 < r < seqlen:
            order[cursor[r]] = d
            order_start[cursor[r]] = n_full_pieces(doc_lens[d], seqlen, eot, long_mode) * seqlen
            cursor[r] += 1

    cap = 1024
    node_parent = np.empty(cap, dtype=np.int64)
    node_size = np.empty(cap, dtype=np.int64)
    node_take = np.empty(cap, dtype=np.int64)
    grp_count = np.empty(cap, dtype=np.int64)
    grp_node = np.empty(cap, dtype=np.int64)
    grp_next = np.empty(cap, dtype=np.int64)
    n_nodes = 0
    n_grps = 0
    head = np.full(univ, -1, dtype=np.int64)  # by free space - shift
    bits, off = _tree_new(univ)
    for size in range(univ - 1, 0, -1):
        c = count[size]
        while c > 0:
            # At most two new nodes and groups per step.
            if n_nodes + 2 > node_parent.shape[0]:
                node_parent = _grow(node_parent, n_nodes + 2)
                node_size = _grow(node_size, n_nodes + 2)
                node_take = _grow(node_take, n_nodes + 2)
            if n_grps + 2 > grp_count.shape[0]:
                grp_count = _grow(grp_count, n_grps + 2)
                grp_node = _grow(grp_node, n_grps + 2)
                grp_next = _grow(grp_next, n_grps + 2)
            f = _tree_succ(bits, off, max(0, size - shift))
            if f < 0:
                parent = -1
                f = seqlen
                g = c  # as many fresh bins as needed
                src = -1
            else:
                f += shift
                src = head[f - shift]
                parent = grp_node[src]
                g = grp_count[src]
            q = f // size
            t = min(g, c // q)
            rest = c - t * q if t < g else 0
            # The whole group takes q items each and moves down (it stays one group), or
            # t fresh or split-off bins take q items each and one more bin takes the rest.
            move = src >= 0 and t == g
            if move:
                _pop_group(head, bits, off, grp_next, f - shift)
            for take, bins in ((q, t), (rest, 1)):
                if take == 0 or bins == 0:
                    continue
                gi = src if move else n_grps
                if not move:
                    grp_count[gi] = bins
                    n_grps += 1
                node_parent[n_nodes] = parent
                node_size[n_nodes] = size
                node_take[n_nodes] = take
                grp_node[gi] = n_nodes
                n_nodes += 1
                dest = f - take * size - shift
                if dest + shift > 0:
                    _push_group(head, bits, off, grp_next, gi, dest)
            if move:
                c -= q * g
                continue
            if src >= 0:
                left = g - t - (1 if rest > 0 else 0)
                grp_count[src] = left
                if left == 0:
                    _pop_group(head, bits, off, grp_next, f - shift)
            c = 0

    path = np.empty(univ, dtype=np.int64)  # a bin holds at most u <= univ - 1 items
    for gi in range(n_grps):
        depth = 0
        v = grp_node[gi]
        while v >= 0:
            path[depth] = v
            depth += 1
            v = node_parent[v]
        for _ in range(grp_count[gi]):
            bin_ptr[nb] = p
            nb += 1
            for lev in range(depth - 1, -1, -1):
                v = path[lev]
                size = node_size[v]
                k = pool[size]
                for _ in range(node_take[v]):
                    piece_doc[p] = order[k]
                    piece_start[p] = order_start[k]
                    piece_len[p] = size - eot
                    k += 1
                    p += 1
                pool[size] = k
    bin_ptr[nb] = p
    return nb


@njit
def stream(
    doc_lens: np.ndarray,
    rem_occ: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    window: int,
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
) -> int:
    """Order-preserving best fit over at most ``window`` (>= 1) open bins; same contract as
    :func:`bfd`, bins numbered in emission order."""
    n = rem_occ.shape[0]
    n_items = 0
    for d in range(n):
        n_items += n_full_pieces(doc_lens[d], seqlen, eot, long_mode) + (1 if rem_occ[d] > 0 else 0)
    item_doc = np.empty(n_items, dtype=np.int64)
    item_start = np.empty(n_items, dtype=np.int64)
    item_len = np.empty(n_items, dtype=np.int64)
    item_bin = np.empty(n_items, dtype=np.int64)
    emit_rank = np.full(n_items, -1, dtype=np.int64)
    nxt = np.empty(n_items, dtype=np.int64)
    prv = np.empty(n_items, dtype=np.int64)
    univ = _universe(rem_occ, seqlen)  # buckets by free space - shift (module docstring)
    shift = seqlen - univ
    head = np.full(univ, -1, dtype=np.int64)
    tail = np.full(univ, -1, dtype=np.int64)
    bits, off = _tree_new(univ)
    nbins = 0
    nemit = 0
    nopen = 0
    k = 0
    for d in range(n):
        nf = n_full_pieces(doc_lens[d], seqlen, eot, long_mode)
        for j in range(nf + (1 if rem_occ[d] > 0 else 0)):
            if j < nf:
                size = seqlen
                item_start[k] = j * seqlen
                item_len[k] = seqlen
            else:
                size = rem_occ[d]
                item_start[k] = nf * seqlen
                item_len[k] = size - eot
            item_doc[k] = d
            if size == seqlen:
                item_bin[k] = nbins
                emit_rank[nbins] = nemit
                nemit += 1
                nbins += 1
                k += 1
                continue
            i = _tree_succ(bits, off, max(0, size - shift))
            if i >= 0:
                f = i + shift
                b = head[i]
                # unlink the head of bucket f
                q = nxt[b]
                head[i] = q
                if q >= 0:
                    prv[q] = -1
                else:
                    tail[i] = -1
                    _tree_clear(bits, off, i)
            else:
                if nopen == window:
                    g0 = _tree_succ(bits, off, 1)
                    c = tail[g0]
                    pc = prv[c]
                    tail[g0] = pc
                    if pc >= 0:
                        nxt[pc] = -1
                    else:
                        head[g0] = -1
                        _tree_clear(bits, off, g0)
                    emit_rank[c] = nemit
                    nemit += 1
                    nopen -= 1
                b = nbins
                nbins += 1
                nopen += 1
                f = seqlen
            item_bin[k] = b
            g = f - size
            if g == 0:
                emit_rank[b] = nemit
                nemit += 1
                nopen -= 1
            else:
                g -= shift
                h = head[g]
                nxt[b] = h
                prv[b] = -1
                if h >= 0:
                    prv[h] = b
                else:
                    tail[g] = b
                    _tree_set(bits, off, g)
                head[g] = b
            k += 1
    for b in range(nbins):
        if emit_rank[b] < 0:
            emit_rank[b] = nemit
            nemit += 1

    fill = np.zeros(nbins + 1, dtype=np.int64)
    for i in range(n_items):
        fill[emit_rank[item_bin[i]] + 1] += 1
    for r in range(nbins):
        fill[r + 1] += fill[r]
    for r in range(nbins + 1):
        bin_ptr[r] = fill[r]
    for i in range(n_items):
        r = emit_rank[item_bin[i]]
        q = fill[r]
        fill[r] += 1
        piece_doc[q] = item_doc[i]
        piece_start[q] = item_start[i]
        piece_len[q] = item_len[i]
    return nbins
