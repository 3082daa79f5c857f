"""Packing-plan helpers for the plan tests: bins of a plan, the validity check, a store stand-in,
plan equality and the twins of the region cuts (``ref_regions``, ``ref_slack``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import ref_bfd


def plan_bins(plan):
    """Bins as lists of (doc, start, n_tokens, slots)."""
    e = plan.piece_has_eot()
    out = []
    for b in range(plan.n_bins):
        out.append(
            [
                (
                    int(plan.piece_doc[p]),
                    int(plan.piece_start[p]),
                    int(plan.piece_len[p]),
                    int(plan.piece_len[p]) + int(e[p]),
                )
                for p in range(plan.bin_ptr[b], plan.bin_ptr[b + 1])
            ]
        )
    return out


def check_valid(plan, doc_lens, seqlen, eot, long_docs):
    """Every token placed once (split), contiguous pieces, no overfull or empty bin, stats."""
    plan.validate(doc_lens)
    bins = plan_bins(plan)
    assert all(bins), "empty bin"
    assert all(sum(p[3] for p in b) <= seqlen for b in bins)
    by_doc = {}
    for b in bins:
        for d, s, n, slots in b:
            by_doc.setdefault(d, []).append((s, n, slots - n))
    e = int(eot)
    tokens = 0
    for d, n in enumerate(doc_lens):
        n = int(n)
        pieces = sorted(by_doc.get(d, []))
        long = n + e > seqlen
        if n + e == 0 or (long and long_docs == "drop"):
            assert not pieces
            continue
        if long and long_docs == "truncate":
            assert pieces == [(0, seqlen - e, e)]
            tokens += seqlen
            continue
        pos = 0
        for s, ln, _has in pieces:
            assert s == pos
            pos += ln
        assert pos == n, "tokens missing or duplicated"
        assert sum(p[2] for p in pieces) == e and (not e or pieces[-1][2] == 1)
        tokens += n + e
    s = plan.stats
    assert s.n_tokens == tokens == sum(p[3] for b in bins for p in b)
    assert s.n_bins == len(bins) and s.n_pieces == plan.n_pieces
    assert s.padding_tokens == s.n_bins * seqlen - tokens
    assert s.lower_bound_bins == -(-tokens // seqlen) <= s.n_bins
    lens = np.asarray(doc_lens, dtype=np.int64)
    assert s.n_empty == int((lens == 0).sum())
    assert s.n_long == int((lens + e > seqlen).sum())
    assert s.n_split == (s.n_long if long_docs == "split" else 0)
    assert s.n_truncated == (s.n_long if long_docs == "truncate" else 0)
    assert s.n_dropped == (s.n_long if long_docs == "drop" else 0)
    assert s.efficiency == pytest.approx(tokens / (s.n_bins * seqlen) if s.n_bins else 1.0)


# ------------------------------------------------------------------------------- cache
class FakeStore:
    def __init__(self, path, lens, fingerprint="0123456789abcdef"):
        self.path = path
        self.cache_dir = Path(path) / "cache"
        self.doc_lens = np.asarray(lens, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.doc_lens)]).astype(np.int64)
        self.fingerprint = fingerprint
        self.mapped_offsets = self.offsets
        self.paged_offsets = self.offsets  # searched and sliced as the store's paged offsets
        self.num_tokens = int(self.offsets[-1])

    def doc_bounds(self, lo: int, hi: int) -> np.ndarray:
        return self.offsets[lo : hi + 1]


def same_plan(a, b):
    return all(
        np.array_equal(getattr(a, n), getattr(b, n))
        for n in ("bin_ptr", "piece_doc", "piece_start", "piece_len", "region_bin", "region_doc")
    ) and (a.seqlen, a.add_eot, a.long_docs, a.algorithm, a.lookahead, a.stats) == (
        b.seqlen,
        b.add_eot,
        b.long_docs,
        b.algorithm,
        b.lookahead,
        b.stats,
    )


def ref_regions(lens, region_tokens, seqlen, eot):
    """Region edges, document by document: slot ``k``'s edge is, among the documents starting in
    ``[k*R - R//2, (k+1)*R - R//2)`` within EDGE_SEARCH_DOCS of the first document starting at or
    after ``k*R`` (the nominal edge), the one whose starting slot plus ``k*sigma`` is smallest mod
    ``seqlen`` (then the nearest to the nominal edge, then the lowest); the nominal edge if none;
    empty slots are not regions."""
    n, r = len(lens), region_tokens
    pos = [sum(int(x) for x in lens[:d]) for d in range(n + 1)]
    k_slots = max(1, -(-pos[n] // r))
    sigma = ref_slack(lens, region_tokens, seqlen, eot)
    edges = [0]
    for k in range(1, k_slots):
        nominal = next((d for d in range(n + 1) if pos[d] >= k * r), n)
        cands = [
            d
            for d in range(n)
            if k * r - r // 2 <= pos[d] < (k + 1) * r - r // 2 and abs(d - nominal) <= 256
        ]
        keys = [((pos[d] + eot * d + k * sigma) % seqlen, abs(d - nominal), d) for d in cands]
        edges.append(min(keys)[2] if keys else nominal)
    edges.append(n)
    out = [e for i, e in enumerate(edges) if i == 0 or e > edges[i - 1]]
    return out if n else [0]


def ref_slack(lens, region_tokens, seqlen, eot):
    """The free slots the edges leave each region: 1.3 times (rounded up) the most free slots of
    all bins but the emptiest in the reference best fit of the documents starting in probe slot
    ``k``'s tokens ``[k*R, (k+1)*R)``, probes ``(2i+1)K // 6`` for ``i < 3``, plus 32; at most
    ``min(0.4 seqlen, max(1024, 5 seqlen / 32))`` (rounded down)."""
    pos = [sum(int(x) for x in lens[:d]) for d in range(len(lens) + 1)]
    k_slots = max(1, -(-pos[-1] // region_tokens))
    most = 0
    for k in {(2 * i + 1) * k_slots // 6 for i in range(3)} if k_slots > 1 else ():
        docs = [
            d for d in range(len(lens)) if k * region_tokens <= pos[d] < (k + 1) * region_tokens
        ]
        free = [
            seqlen - sum(it[3] for it in b)
            for b in ref_bfd([lens[d] for d in docs], seqlen, eot, "split")
        ]
        most = max(most, sum(free) - max(free, default=0))
    return min(2 * seqlen // 5, max(1024, 5 * seqlen // 32), -(-13 * most // 10) + 32)
