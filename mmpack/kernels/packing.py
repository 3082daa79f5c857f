"""Packing kernels: best-fit bin packing of whole documents into ``seqlen``-token bins, and the
batch gather that turns bins into model inputs.

Items.  Document ``d`` of ``n`` tokens occupies ``T = n + e`` slots (``e = 1`` when an end-of-text
token follows it).  A document longer than a bin is, by ``long_mode``, split (``k = (T-1) // S``
*full* pieces of ``S`` tokens, each a bin of its own, then one remainder item of ``T - k*S`` slots
in ``[1, S]`` that ends the document), truncated (one item of ``S`` slots: the first ``S - e``
tokens and the eot) or dropped.  An empty document is an item of one slot (its eot) with ``e = 1``
and nothing without.  :func:`item_sizes` computes, per document, the remainder item's size
(``0``: nothing placed) and its number of full pieces, in one O(n) pass.

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

Streaming best fit (:func:`stream`).  Items in document order; size-``S`` items are emitted at once
as bins of their own; every other item goes to the best-fitting of at most ``window`` open bins
(ties as above).  When none fits and the window is full, the fullest open bin (ties: the one that
reached its free space first, each bucket being a queue at that end) is closed and emitted before a
new bin opens; a bin left with no free space is emitted at once; at the end the open bins are
emitted in the order they were opened.  Bins are numbered in emission order, so the data order is
kept up to the window.  ``window = 1`` is next fit.  Cost O(n log_64 S + S).

Gather (:func:`select_pieces`, :func:`fill_rows`).  A batch of bins becomes the flat token ranges
of its pieces (validated against the document lengths; a corrupt plan is reported, never read out
of bounds; a piece shorter than ``seqlen`` is its document's last and carries the eot), then one pass per row writes ``input_ids``, ``position_ids``, causal labels, the
attention mask and ``cu_seqlens``.  Cost O(B * seqlen).
"""

from __future__ import annotations

import numpy as np

from mmpack.kernels._jit import njit

__all__ = [
    "IGNORE",
    "LABELS_HF",
    "LABELS_NEXT",
    "LABELS_NONE",
    "LONG_DROP",
    "LONG_SPLIT",
    "LONG_TRUNCATE",
    "N_STATS",
    "ST_DROPPED",
    "ST_EMPTY",
    "ST_FULL_PIECES",
    "ST_LONG",
    "ST_LOST_TOKENS",
    "ST_PLACED_DOCS",
    "ST_SPLIT",
    "ST_TOKENS",
    "ST_TRUNCATED",
    "bfd",
    "fill_rows",
    "item_sizes",
    "n_full_pieces",
    "one_bin",
    "select_pieces",
    "stream",
]

LONG_SPLIT = 0
LONG_TRUNCATE = 1
LONG_DROP = 2

LABELS_NONE = 0
LABELS_NEXT = 1
LABELS_HF = 2

IGNORE = -100

# Slots of the ``stats`` array filled by :func:`item_sizes`.
ST_PLACED_DOCS = 0
ST_EMPTY = 1
ST_LONG = 2
ST_SPLIT = 3
ST_TRUNCATED = 4
ST_DROPPED = 5
ST_TOKENS = 6
ST_LOST_TOKENS = 7
ST_FULL_PIECES = 8
N_STATS = 9

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U63 = np.uint64(63)


# --------------------------------------------------------------------------------- items
@njit
def item_sizes(
    doc_lens: np.ndarray,
    seqlen: int,
    eot: int,
    long_mode: int,
    rem_occ: np.ndarray,
    stats: np.ndarray,
) -> None:
    """Per document: ``rem_occ[d]`` slots of its last item (0 = not placed; the full pieces
    before it are :func:`n_full_pieces`).  ``doc_lens`` >= 0; ``stats`` (int64, ``N_STATS``) is
    zeroed first."""
    for s in range(stats.shape[0]):
        stats[s] = 0
    for d in range(doc_lens.shape[0]):
        n = doc_lens[d]
        t = n + eot
        k = 0
        r = t
        if n == 0:
            stats[ST_EMPTY] += 1
        if t > seqlen:
            stats[ST_LONG] += 1
            if long_mode == LONG_SPLIT:
                k = (t - 1) // seqlen
                r = t - k * seqlen
                stats[ST_SPLIT] += 1
            elif long_mode == LONG_TRUNCATE:
                r = seqlen
                stats[ST_TRUNCATED] += 1
                stats[ST_LOST_TOKENS] += t - seqlen
            else:
                r = 0
                stats[ST_DROPPED] += 1
                stats[ST_LOST_TOKENS] += n
        rem_occ[d] = r
        stats[ST_FULL_PIECES] += k
        if r > 0:
            stats[ST_PLACED_DOCS] += 1
        stats[ST_TOKENS] += k * seqlen + r


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
def _tree_new(universe: int):
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
    b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    b[: a.shape[0]] = a
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
            if src >= 0 and t == g:
                # The whole group takes q items each and moves down.
                head[f - shift] = grp_next[src]
                if head[f - shift] < 0:
                    _tree_clear(bits, off, f - shift)
                node_parent[n_nodes] = parent
                node_size[n_nodes] = size
                node_take[n_nodes] = q
                grp_node[src] = n_nodes
                n_nodes += 1
                dest = f - q * size - shift
                if dest + shift > 0:
                    if head[dest] < 0:
                        _tree_set(bits, off, dest)
                    grp_next[src] = head[dest]
                    head[dest] = src
                c -= q * g
                continue
            for take, bins in ((q, t), (rest, 1)):
                if take == 0 or bins == 0:
                    continue
                node_parent[n_nodes] = parent
                node_size[n_nodes] = size
                node_take[n_nodes] = take
                grp_count[n_grps] = bins
                grp_node[n_grps] = n_nodes
                n_nodes += 1
                dest = f - take * size - shift
                if dest + shift > 0:
                    if head[dest] < 0:
                        _tree_set(bits, off, dest)
                    grp_next[n_grps] = head[dest]
                    head[dest] = n_grps
                n_grps += 1
            if src >= 0:
                left = g - t - (1 if rest > 0 else 0)
                grp_count[src] = left
                if left == 0:
                    head[f - shift] = grp_next[src]
                    if head[f - shift] < 0:
                        _tree_clear(bits, off, f - shift)
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


# --------------------------------------------------------------------------------- gather
@njit
def select_pieces(
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    offsets: np.ndarray,
    seqlen: int,
    eot: int,
    bins: np.ndarray,
    row_ptr: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
) -> int:
    """Flat token ranges of the pieces of ``bins`` (indices already checked, ``row_ptr`` the
    prefix sum of their piece counts, each bin's piece range inside the piece arrays).

    Returns -1, or the first row whose bin is inconsistent with the documents (a piece outside
    its document, or more than ``seqlen`` slots); nothing is read out of bounds either way.
    """
    n_docs = offsets.shape[0] - 1
    for r in range(bins.shape[0]):
        lo = bin_ptr[bins[r]]
        used = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            p = lo + q - row_ptr[r]
            d = piece_doc[p]
            s = piece_start[p]
            ln = piece_len[p]
            if d < 0 or d >= n_docs or s < 0 or ln < 0:
                return r
            dl = offsets[d + 1] - offsets[d]
            if s > dl or ln > dl - s:
                return r
            e = 0
            if eot != 0 and ln < seqlen:
                e = 1
            used += ln + e
            starts[q] = offsets[d] + s
            lengths[q] = ln
            has_eot[q] = e
        if used > seqlen:
            return r
    return -1


@njit
def fill_rows(
    src: np.ndarray,
    src_starts: np.ndarray,
    lengths: np.ndarray,
    has_eot: np.ndarray,
    row_ptr: np.ndarray,
    eot_id: int,
    pad_id: int,
    label_mode: int,
    input_ids: np.ndarray,
    position_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
    cu_seqlens: np.ndarray,
    n_segments: np.ndarray,
    max_seqlen: np.ndarray,
) -> None:
    """Write rows ``r`` of the (B, seqlen) outputs from pieces ``row_ptr[r]:row_ptr[r+1]``.

    ``src[src_starts[q]:src_starts[q]+lengths[q]]`` must be in bounds and each row's pieces
    (plus their eot) must fit in seqlen (both checked by the caller).  ``cu_seqlens`` is (B, C)
    with C >= pieces + 2; row r's boundaries are ``cu_seqlens[r, :n_segments[r] + 1]``, padding
    (if any) being the last segment.
    """
    # Work on 1-D row and segment views: LLVM vectorises these loops (not the 2-D indexing).
    seqlen = input_ids.shape[1]
    for r in range(input_ids.shape[0]):
        ids = input_ids[r]
        pos = position_ids[r]
        lab = labels[r]
        att = attention_mask[r]
        t = 0
        seg = 0
        longest = 0
        cu_seqlens[r, 0] = 0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            s0 = t
            n = lengths[q]
            a = src_starts[q]
            seg_src = src[a : a + n]
            seg_ids = ids[s0 : s0 + n]
            for i in range(n):
                seg_ids[i] = seg_src[i]
            t += n
            if has_eot[q] != 0:
                ids[t] = eot_id
                t += 1
            m = t - s0
            seg_pos = pos[s0:t]
            seg_att = att[s0:t]
            for i in range(m):
                seg_pos[i] = i
                seg_att[i] = 1
            seg_lab = lab[s0:t]
            if m > 0:
                if label_mode == LABELS_NEXT:
                    nxt = ids[s0 + 1 : t]
                    for i in range(m - 1):
                        seg_lab[i] = nxt[i]
                    seg_lab[m - 1] = IGNORE
                elif label_mode == LABELS_HF:
                    cur = ids[s0:t]
                    seg_lab[0] = IGNORE
                    for i in range(1, m):
                        seg_lab[i] = cur[i]
                else:
                    for i in range(m):
                        seg_lab[i] = IGNORE
            seg += 1
            cu_seqlens[r, seg] = t
            if m > longest:
                longest = m
        if t < seqlen:
            for i in range(t, seqlen):
                ids[i] = pad_id
                pos[i] = i - t
                lab[i] = IGNORE
                att[i] = 0
            seg += 1
            cu_seqlens[r, seg] = seqlen
            if seqlen - t > longest:
                longest = seqlen - t
        n_segments[r] = seg
        max_seqlen[r] = longest


@njit
def one_bin(
    bin_ptr: np.ndarray,
    piece_doc: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    offsets: np.ndarray,
    src: np.ndarray,
    b: int,
    params: np.ndarray,
    rows: np.ndarray,
    cu_seqlens: np.ndarray,
    scalars: np.ndarray,
) -> int:
    """:func:`select_pieces` then :func:`fill_rows` for the single bin ``b``, reading straight
    from the whole flat token array ``src``.  ``params`` is ``[seqlen, eot, eot_id, pad_id,
    label_mode]``; ``rows`` (4, 1, seqlen) receives ids, positions, labels, attention mask;
    ``scalars`` (2, 1) the segment count and the longest segment (few arguments: numba's
    dispatch cost grows with each one, and this is the single-sample path).  Returns -1, or 0 when the bin is
    inconsistent with the documents (nothing is read then)."""
    seqlen, eot, eot_id, pad_id, label_mode = params[0], params[1], params[2], params[3], params[4]
    bins = np.empty(1, dtype=np.int64)
    bins[0] = b
    n = bin_ptr[b + 1] - bin_ptr[b]
    row_ptr = np.zeros(2, dtype=np.int64)
    row_ptr[1] = n
    starts = np.empty(n, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    has_eot = np.empty(n, dtype=np.uint8)
    bad = select_pieces(
        bin_ptr,
        piece_doc,
        piece_start,
        piece_len,
        offsets,
        seqlen,
        eot,
        bins,
        row_ptr,
        starts,
        lengths,
        has_eot,
    )
    if bad >= 0:
        return bad
    fill_rows(
        src,
        starts,
        lengths,
        has_eot,
        row_ptr,
        eot_id,
        pad_id,
        label_mode,
        rows[0],
        rows[1],
        rows[2],
        rows[3],
        cu_seqlens,
        scalars[0],
        scalars[1],
    )
    return -1
