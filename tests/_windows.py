"""The window view's reference, for the window view and window stats tests: every sample computed
in the most direct way, and the corpora hypothesis draws."""

from __future__ import annotations

from hypothesis import strategies as st
from reference import naive_stream

corpora = st.lists(st.lists(st.integers(0, 70000), max_size=40), max_size=25)


def naive_windows(docs, seqlen, stride, eot, labels, drop_last, pad_id):
    """Every sample of the window view, computed in the most direct way."""
    stream, ends = naive_stream(docs, eot)
    width = seqlen + int(labels)
    starts = list(range(0, max(len(stream) - width + 1, 0), stride))
    if not drop_last:
        covered = starts[-1] + width if starts else 0
        nxt = starts[-1] + stride if starts else 0
        if covered < len(stream) and nxt < len(stream):
            starts.append(nxt)
    out = []
    for s in starts:
        window = stream[s : s + seqlen]
        real = len(window)
        ids = window + [pad_id] * (seqlen - real)
        cuts = sorted(
            {e - s for e in ends if 0 < e - s < seqlen} | ({real} if real < seqlen else set())
        )
        cu = [0] + [c for c in cuts if 0 < c < seqlen] + [seqlen]
        pos = []
        for a, b in zip(cu[:-1], cu[1:]):
            pos.extend(range(b - a))
        sample = {"input_ids": ids, "cu_seqlens": cu, "position_ids": pos}
        if labels:
            nxt_tokens = stream[s + 1 : s + seqlen + 1]
            sample["labels"] = nxt_tokens + [-100] * (seqlen - len(nxt_tokens))
        out.append(sample)
    return out
