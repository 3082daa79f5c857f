"""Placement kernels over one free-space index, a 64-ary bitset tree: best-fit decreasing
(:func:`bfd_groups`, output pass :func:`emit_groups`), order-keeping online best fit
(:func:`online_place`, output pass :func:`emit_by_rank`) and the streaming packer's best fit over a batch's rows
(:func:`place_batch`).  Jitted functions here call only this module's.

Index.  Open bins sit in buckets by free space ``f`` in ``[1, S)``; a bitset tree (a bit per
non-empty bucket, a bit per non-zero word a level up) finds the smallest bucket ``>= L`` in
``O(log_64 S)`` word operations.  Buckets are indexed by ``f - D``, ``D = S - U``, ``U = min(S,
T + 1)`` (``T``: the slots of all items smaller than ``S``), so memory follows the store, not
``S``; the shift is monotone, so no decision changes.

Best-fit decreasing.  Size-``S`` items fill a bin each, in document order; the others are
counting-sorted (O(n + S)) and taken in decreasing size into the open bin of smallest fitting
free space (a new bin when none fits), by size class and groups of identical bins
(:func:`bfd_groups`): O(steps * log_64 S), ties to the most recently moved group.
Online best fit.  Items in document order into the best-fitting of at most ``window`` open bins;
when none fits and the window is full, the fullest (first to reach its free space) is emitted;
a full bin is emitted at once, the open ones at the end in opening order.  O(n log_64 S + S);
``window = 1`` is next fit.  Streaming rows: row ``r`` with remaining space ``s`` is key ``s *
stride + r`` in the same tree (:func:`row_index`); the row for a piece of length ``L`` (smallest
space ``>= L``, ties to the lowest row) is the successor of ``L * stride``: O(log_64(rows *
row_len)), ``(row_len + 1) * stride / 8`` bytes.
"""

from __future__ import annotations

import numpy as np

from mmpack._src.kernels._jit import njit

__all__ = [
    "bfd_groups",
    "emit_by_rank",
    "emit_groups",
    "online_place",
    "place_batch",
    "row_index",
]

_U0 = np.uint64(0)
_U1 = np.uint64(1)
# Rows of best-fit decreasing's node and group tables (int64, shape (3, capacity)), written by
# :func:`bfd_groups` and read by :func:`emit_groups`.
_PARENT = 0  # node table: the node before it on the group's path (-1: none)
_SIZE = 1  # node table: item size
_TAKE = 2  # node table: items of that size each bin of the group takes
_COUNT = 0  # group table: identical bins in the group
_NODE = 1  # group table: the last node of the group's path
_NEXT = 2  # group table: the next group in the same bucket (-1: none)


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
    bits = np.empty(acc, dtype=np.uint64)
    for i in range(acc):
        bits[i] = _U0
    return bits, off


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
def _filled(n: int, value: int) -> np.ndarray:
    """int64, shape (n,), every entry ``value`` (``np.full`` compiles one more overload)."""
    a = np.empty(n, dtype=np.int64)
    for i in range(n):
        a[i] = value
    return a


@njit
def _grow(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` (int64, shape (3, cap)) with room for ``need`` columns."""
    if need <= a.shape[1]:
        return a
    b = np.empty((3, max(need, 2 * a.shape[1])), dtype=np.int64)
    for r in range(3):  # not ``b[:, :n] = a``: its shape check compiles a formatted error
        for i in range(a.shape[1]):
            b[r, i] = a[r, i]
    return b


@njit
def bfd_groups(count: np.ndarray, seqlen: int, univ: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing's packing loop over size classes (``count[L]`` items of size ``L``,
    largest first), on groups of identical bins.  Items of one size are interchangeable and best
    fit gives a chosen bin of free space ``f`` ``f // L`` items of size ``L`` in a row, so each
    step moves or splits a whole group (same sizes placed, same free space), and the steps per
    size are the groups it exhausts plus one.  A group's contents are a path in a tree of
    ``(size, count)`` nodes; :func:`emit_groups` emits the groups in creation order, dealing the
    documents of each size, in document order, to the bins in output order.

    Returns the node table and the group table (int64, shape (3, capacity); rows ``_PARENT,
    _SIZE, _TAKE`` and ``_COUNT, _NODE, _NEXT``) and the number of groups, in creation order.
    """
    shift = seqlen - univ
    nodes = np.empty((3, 1024), dtype=np.int64)
    groups = np.empty((3, 1024), dtype=np.int64)
    # Not literal zeros: a Literal[int](0) argument would compile _bfd_step a second time.
    n_nodes = int(np.int64(0))
    n_groups = int(np.int64(0))
    head = _filled(univ, -1)  # top group of each bucket, by free space - shift
    bits, off = _tree_new(univ)
    for size in range(univ - 1, 0, -1):
        c = count[size]
        while c > 0:
            nodes = _grow(nodes, n_nodes + 2)  # at most two new nodes and groups per step
            groups = _grow(groups, n_groups + 2)
            c, n_nodes, n_groups = _bfd_step(
                nodes, groups, n_nodes, n_groups, head, bits, off, size, c, seqlen, shift
            )
    return nodes, groups, n_groups


@njit
def _bfd_step(
    nodes: np.ndarray,
    groups: np.ndarray,
    n_nodes: int,
    n_groups: int,
    head: np.ndarray,
    bits: np.ndarray,
    off: np.ndarray,
    size: int,
    c: int,
    seqlen: int,
    shift: int,
) -> tuple[int, int, int]:
    """The ``c`` items of ``size`` left go to the best-fitting group (fresh bins if none fits):
    the whole group takes ``q`` items each and moves down (it stays one group), or ``t`` fresh
    or split-off bins take ``q`` items each and one more bin takes the rest.  Returns the items
    still to place and the node and group counts."""
    f = _tree_succ(bits, off, max(0, size - shift))
    if f < 0:
        parent = -1
        f = seqlen
        g = c  # as many fresh bins as needed
        src = -1
    else:
        f += shift
        src = head[f - shift]
        parent = groups[_NODE, src]
        g = groups[_COUNT, src]
    q = f // size
    t = min(g, c // q)
    rest = c - t * q if t < g else 0
    move = src >= 0 and t == g
    left = g - t - (1 if rest > 0 else 0)  # source bins taking nothing (0 when it moves)
    if src >= 0 and not move:
        groups[_COUNT, src] = left
    if src >= 0 and left == 0:  # the source group leaves its bucket (top of its stack)
        head[f - shift] = groups[_NEXT, src]
        if head[f - shift] < 0:
            _tree_clear(bits, off, f - shift)
    for take, bins in ((q, t), (rest, 1)):
        if take == 0 or bins == 0:
            continue
        gi = src if move else n_groups
        if not move:
            groups[_COUNT, gi] = bins
            n_groups += 1
        nodes[_PARENT, n_nodes] = parent
        nodes[_SIZE, n_nodes] = size
        nodes[_TAKE, n_nodes] = take
        groups[_NODE, gi] = n_nodes
        n_nodes += 1
        dest = f - take * size - shift
        if dest + shift > 0:  # on top of the stack of bucket dest
            if head[dest] < 0:
                _tree_set(bits, off, dest)
            groups[_NEXT, gi] = head[dest]
            head[dest] = gi
    return (c - q * g if move else 0), n_nodes, n_groups


# --------------------------------------------------------------------------------- online
@njit
def online_place(
    item_len: np.ndarray, eot: int, seqlen: int, univ: int, window: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Online best fit of items (tokens, int64, document order; an item takes ``min(seqlen,
    tokens + eot)`` slots) over at most ``window`` open bins (see the module docstring).  Returns each item's bin, each bin's emission rank (int64,
    n_items; bins are numbered ``0..n_bins`` in the order they opened) and ``n_bins``."""
    n_items = item_len.shape[0]
    item_bin = np.empty(n_items, dtype=np.int64)
    emit_rank = _filled(n_items, -1)
    nxt = np.empty(n_items, dtype=np.int64)  # buckets are doubly linked lists of bins
    prv = np.empty(n_items, dtype=np.int64)
    shift = seqlen - univ  # buckets by free space - shift (module docstring)
    head = _filled(univ, -1)
    tail = _filled(univ, -1)
    bits, off = _tree_new(univ)
    nbins = 0
    nemit = 0
    nopen = 0
    for k in range(n_items):
        size = min(seqlen, item_len[k] + eot)  # slots
        if size == seqlen:
            item_bin[k] = nbins
            emit_rank[nbins] = nemit
            nemit += 1
            nbins += 1
            continue
        i = _tree_succ(bits, off, max(0, size - shift))
        if i >= 0:  # the head of bucket i: the bin that reached that free space last
            f = i + shift
            b = head[i]
            head[i] = nxt[b]
            if head[i] >= 0:
                prv[head[i]] = -1
            else:
                tail[i] = -1
                _tree_clear(bits, off, i)
        else:
            if nopen == window:  # close the fullest open bin: the tail of its bucket
                i = _tree_succ(bits, off, int(np.int64(1)))  # a literal 1: a second compile
                c = tail[i]
                tail[i] = prv[c]
                if tail[i] >= 0:
                    nxt[tail[i]] = -1
                else:
                    head[i] = -1
                    _tree_clear(bits, off, i)
                emit_rank[c] = nemit
                nemit += 1
                nopen -= 1
            b = nbins
            nbins += 1
            nopen += 1
            f = seqlen
        item_bin[k] = b
        if f == size:
            emit_rank[b] = nemit
            nemit += 1
            nopen -= 1
        else:  # b goes to the head of bucket g
            g = f - size - shift
            nxt[b] = head[g]
            prv[b] = -1
            if head[g] >= 0:
                prv[head[g]] = b
            else:
                tail[g] = b
                _tree_set(bits, off, g)
            head[g] = b
    for b in range(nbins):
        if emit_rank[b] < 0:
            emit_rank[b] = nemit
            nemit += 1
    return item_bin, emit_rank, nbins


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


# --------------------------------------------------------------------------------- streaming rows
@njit
def row_index(n_rows: int, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The free-space index of up to ``n_rows`` rows of ``row_len`` tokens, empty: the tree over
    ``(row_len + 1) * n_rows`` keys (uint64 words, int64 level offsets)."""
    return _tree_new((row_len + 1) * n_rows)


@njit
def place_batch(
    held: np.ndarray,
    start: int,
    stop: int,
    budget: int,
    bits: np.ndarray,
    off: np.ndarray,
    remaining: np.ndarray,
    counts: np.ndarray,
    row_len: int,
    n_rows: int,
    out: np.ndarray,
) -> tuple[int, int]:
    """Place the held pieces ``start:stop`` of a batch in order by best fit, stopping *before*
    the next piece once ``budget`` of them have been deferred in this call.

    ``start == 0`` starts the batch: ``n_rows`` empty rows of ``row_len`` tokens (the keys of
    the previous batch's rows leave the index).  ``held`` is int64 of shape (>= 1, >= stop)
    whose row 0 holds the piece lengths, each in ``[1, row_len]``; ``bits``, ``off`` the rows'
    free-space index (:func:`row_index`); ``remaining`` and ``counts`` (int64, shape (stride,))
    each row's remaining space (-1 for rows not in the batch) and pieces, updated in place;
    ``out`` is int64 of shape (2, >= stop): the row and start column of each piece looked at,
    -1 and -1 when it fits nowhere.  Returns the pieces processed so far in the batch
    (``start`` plus those looked at) and those deferred in this call.
    """
    stride = remaining.shape[0]
    if start == 0:
        for r in range(stride):
            if remaining[r] >= 0:
                _tree_clear(bits, off, remaining[r] * stride + r)
                remaining[r] = -1
            counts[r] = 0
        for r in range(n_rows):
            remaining[r] = row_len
            _tree_set(bits, off, row_len * stride + r)
    deferred = 0
    # The largest free space: a piece longer than it is deferred without a lookup (most of
    # the scan once the rows are nearly full); it only shrinks, and is rescanned (O(rows))
    # when its row takes a piece.
    widest = _widest(remaining)
    for i in range(start, stop):
        if deferred >= budget:
            return i, deferred
        length = held[0, i]
        if length > widest:
            out[0, i] = -1
            out[1, i] = -1
            deferred += 1
            continue
        key = _tree_succ(bits, off, length * stride)
        r = key % stride
        space = key // stride
        _tree_clear(bits, off, key)
        space_left = space - length
        _tree_set(bits, off, space_left * stride + r)
        remaining[r] = space_left
        counts[r] += 1
        out[0, i] = r
        out[1, i] = row_len - space
        if space == widest:
            widest = _widest(remaining)
    return max(start, stop), deferred


@njit
def _widest(remaining: np.ndarray) -> int:
    widest = -1
    for r in range(remaining.shape[0]):
        widest = max(widest, remaining[r])
    return widest


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
        v = groups[_NODE, gi]
        while v >= 0:
            path[depth] = v
            depth += 1
            v = nodes[_PARENT, v]
        for _ in range(groups[_COUNT, gi]):
            bin_ptr[nb] = p
            nb += 1
            for lev in range(depth - 1, -1, -1):
                v = path[lev]
                size = nodes[_SIZE, v]
                k = pool[size]
                for _ in range(nodes[_TAKE, v]):
                    piece_doc[p] = order[k]
                    piece_start[p] = order_start[k]
                    piece_len[p] = size - eot
                    k += 1
                    p += 1
                pool[size] = k
    bin_ptr[nb] = p
    return nb
