"""Packing-plan helpers for the plan tests: bins of a plan, the validity check, a store stand-in
and plan equality."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


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
