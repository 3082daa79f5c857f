"""Specification of :mod:`mmpack._src.streaming.admission`: admission is transactional (a state
taken after the source raised loses no sequence), a long document is admitted lazily (at most
``buffer_size + readahead`` pieces held, a state inside it resumes) and how many pieces are
admitted at a time never changes a placement, through :class:`mmpack.StreamingPacker`.

Run: ``.venv/bin/python -m pytest tests/streaming/test_admission.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _packer import STATE_KW, assert_same_batch, expected_rows, make_docs, take
from reference import ref_pack, rows_of

from mmpack import StreamingPacker


class _Flaky:
    """A random-access source whose ``__getitem__`` raises once at ``fail_at`` once armed."""

    def __init__(self, docs, fail_at):
        self.docs, self.fail_at, self.armed = docs, fail_at, False

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, j):
        if self.armed and j == self.fail_at:
            self.armed = False
            raise OSError(f"transient read error at {j}")
        return self.docs[j]


@pytest.mark.parametrize("fail_at", [7, 37, 80])
def test_state_after_a_transient_source_error_loses_nothing(fail_at):
    """Admission is transactional: the position does not pass a sequence before it is held, so
    a state taken after the source raised resumes with every sequence (the old code had already
    advanced past the whole read-ahead chunk: e.g. sequences 37-40 were lost)."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(4, 90, size=int(n)) for n in rng.integers(0, 90, size=120)]
    full = list(StreamingPacker(docs, **STATE_KW))
    flaky = _Flaky(docs, fail_at)
    packer = StreamingPacker(flaky, **STATE_KW)
    flaky.armed = True
    seen = []
    with pytest.raises(OSError, match="transient"):
        for batch in packer:  # interrupted by the source's error: keep what came before
            seen.append(batch)
    state = packer.state_dict()
    assert state["next_index"] <= fail_at
    resumed = StreamingPacker(docs, **STATE_KW)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(seen) + len(rest) == len(full)
    for x, y in zip(seen + rest, full):
        assert_same_batch(x, y)


@pytest.mark.parametrize("kind", ["list", "store"])
def test_one_long_document_is_admitted_lazily(kind, tmp_path):
    """A document of 2**16 tokens split into 1024 pieces of 64: the packer holds at most
    buffer_size + readahead pieces (the old code admitted all 1024 at once and copied them at
    every batch), emits the pieces in order, and a state taken inside the document resumes."""
    doc = np.arange(2**16, dtype=np.int64) % 50_000 + 1
    docs = [np.array([7, 8, 9]), doc, np.array([5, 6])]
    source = docs
    if kind == "store":
        from mmpack import build

        source = build(tmp_path / "s", docs)
    kw = {
        "batch_size": 4,
        "seqlen": 64,
        "buffer_size": 8,
        "readahead": 3,
        "drop_last": False,
    }
    bound = kw["buffer_size"] + kw["readahead"]
    packer = StreamingPacker(source, **kw)
    batches, held = [], []
    for batch in packer:
        batches.append(batch)
        held.append(packer.stats().n_held)
    assert max(held) <= bound, max(held)
    assert [rows_of(b) for b in batches] == expected_rows(docs, **{**kw, "readahead": 1000})
    pieces = [s for b in batches for row in rows_of(b) for s in row]
    assert [t for s in pieces for t in s] == [7, 8, 9, *doc.tolist(), 5, 6]
    assert packer.stats().n_split == 1 and packer.stats().n_docs == 3

    mid = StreamingPacker(source, **kw)
    it = iter(mid)
    head = take(it, 100)
    state = mid.state_dict()
    assert state["next_index"] == 1 and state["next_offset"] > 0
    resumed = StreamingPacker(source, **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(batches)
    for x, y in zip(head + rest, batches):
        assert_same_batch(x, y)


@pytest.mark.parametrize("readahead", [1, 2, 5, 64])
def test_lazy_admission_does_not_change_placements(readahead):
    """How many pieces are admitted at a time never changes a decision: mixed long and short
    documents give the seed twin's rows for every readahead."""
    rng = np.random.default_rng(readahead)
    lengths = [int(n) for n in rng.integers(0, 200, size=150)]
    docs = make_docs(lengths)
    want = ref_pack(docs, 3, 24, 7, "split", False)
    got = [
        rows_of(b)
        for b in StreamingPacker(
            docs,
            batch_size=3,
            seqlen=24,
            buffer_size=7,
            readahead=readahead,
            drop_last=False,
        )
    ]
    assert got == want
