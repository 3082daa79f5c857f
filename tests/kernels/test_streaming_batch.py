"""The streaming packer's batch kernels against slow twins, and the one-pass conversion of an
incoming batch (numpy arrays and Python lists) against the token rule and the seed's packer."""

from __future__ import annotations

import numpy as np
import pytest
from _packer import make_docs
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_gather_pieces, ref_layout, ref_pack, ref_place, rows_of

import mmpack
import mmpack._src.streaming.placement as placement_module
from mmpack import StreamingPacker
from mmpack._src.kernels.packed_rows import LABELS_NEXT, LABELS_NONE, fill_rows, stream_rows
from mmpack._src.kernels.plan_bestfit import place_batch, row_index
from mmpack._src.kernels.streaming_batch import gather_pieces, layout_batch

# =========================================================================== slow twins
IGNORE = -100


def _streamed_rows(tokens, masks, pieces, row_len, pad_id, labelled):
    """The rows of a streamed batch in plain Python: each row's pieces (tokens, loss masks)
    one after the other from column 0, then padding; causal labels inside each piece (the next
    token when it is a target, else and at the piece's end and on padding ``IGNORE``)."""
    ids, att, lab = [], [], []
    for row in pieces:
        r_ids, r_lab = [], []
        for k in row:
            seg, ok = tokens[k], masks[k]
            r_ids += seg
            r_lab += [v if t else IGNORE for v, t in zip(seg[1:], ok[1:])] + [IGNORE] * bool(seg)
        pad = row_len - len(r_ids)
        att.append([1] * len(r_ids) + [0] * pad)
        ids.append(r_ids + [pad_id] * pad)
        lab.append(r_lab + [IGNORE] * pad)
    return ids, att, lab if labelled else None


@settings(max_examples=80)
@given(
    n_rows=st.integers(1, 5),
    row_len=st.integers(1, 40),
    masked=st.booleans(),
    labelled=st.booleans(),
    data=st.data(),
)
def test_fill_rows_writes_a_streamed_placement(n_rows, row_len, masked, labelled, data):
    """layout_batch orders a best-fit placement row by row and compacts the held pieces;
    gather_pieces then fill_rows, the one row writer, write its rows (no positions; labels
    only when asked for) as the streaming packer's batch: ids, attention mask, cu_seqlens,
    longest segment (padding included) and causal labels, against the twins."""
    n = data.draw(st.integers(0, 40))
    lens = data.draw(st.lists(st.integers(1, row_len), min_size=n, max_size=n))
    budget = data.draw(st.integers(0, 45))
    extra = data.draw(st.integers(0, 5))  # held pieces beyond the scanned ones
    rows, offs, _, remaining, _ = ref_place(lens, budget, [row_len] * n_rows, row_len)
    processed = len(rows)
    n_held = n + extra
    all_lens = lens + [1] * extra
    positions = np.concatenate([[0], np.cumsum(all_lens)]).astype(np.int64)
    chunk = np.array(data.draw(st.lists(st.integers(0, 2**40), min_size=int(positions[-1]),
                                        max_size=int(positions[-1]))), dtype=np.int64)  # fmt: skip
    chunk_mask = np.array(
        data.draw(st.lists(st.integers(0, 1), min_size=chunk.size, max_size=chunk.size)),
        dtype=np.uint8,
    )
    held = np.zeros((4, n_held + 3), dtype=np.int64)
    held[0, :n_held] = all_lens
    held[1, :n_held] = np.arange(n_held) * 7 + 3  # source index
    held[2, :n_held] = np.arange(n_held) % 5  # offset in the source
    held[3, :n_held] = positions[:-1]
    before = held.copy()
    out = np.full((2, n_held + 2), -9, dtype=np.int64)
    out[0, :processed] = rows
    out[1, :processed] = offs
    n_placed = sum(r >= 0 for r in rows)
    placed = np.empty((5, n_placed), dtype=np.int64)
    row_ptr = np.full(n_rows + 1, -5, dtype=np.int64)
    n_left, total, empty, most = layout_batch(out, processed, held, n_held, n_rows, placed, row_ptr)

    w_placed, w_cu, w_longest, w_used = ref_layout(rows, offs, lens, remaining, n_rows, row_len)
    assert placed[:4].tolist() == before[:, w_placed].tolist()
    assert placed[4].tolist() == [sum(lens[i] for i in w_placed[:k]) for k in range(n_placed)]
    per_row = [sum(1 for r in rows if r == row) for row in range(n_rows)]
    assert row_ptr.tolist() == np.concatenate([[0], np.cumsum(per_row)]).tolist()
    assert total == sum(w_used) and empty == per_row.count(0) and most == max(per_row)
    stay = [i for i in range(n_held) if i >= processed or rows[i] < 0]
    assert n_left == len(stay)
    assert held[:, :n_left].tolist() == before[:, stay].tolist()
    for r in range(n_rows):  # a row's pieces lie one after another from column 0
        mine = w_placed[row_ptr[r] : row_ptr[r + 1]]
        assert [offs[i] for i in mine] == [sum(lens[j] for j in mine[:k]) for k in range(len(mine))]

    starts = placed[4]
    src = np.full(total, -1, dtype=np.int64)
    assert gather_pieces(chunk, 0, placed[3], placed[0], starts, src) >= 0
    mask = np.zeros(total, dtype=np.uint8)
    gather_pieces(chunk_mask, 0, placed[3], placed[0], starts, mask)
    pad_id = -3
    ids = np.full((n_rows, row_len), 9, dtype=np.int64)
    att = np.full((n_rows, row_len), 9, dtype=np.int64)
    labels = np.full((n_rows, row_len if labelled else 0), 9, dtype=np.int64)
    cu = np.full((n_rows, max(per_row) + 2), -1, dtype=np.int32)
    n_seg = np.empty(n_rows, dtype=np.int64)
    longest = np.empty(n_rows, dtype=np.int64)
    no_eot = np.zeros(n_placed, dtype=np.int64)
    mode = LABELS_NEXT if labelled else LABELS_NONE
    mask_args = (mask, starts) if masked else (np.empty(0, np.uint8), np.empty(0, np.int64))
    fill_rows(
        src, starts, placed[0], no_eot, row_ptr, 0, pad_id, mode, IGNORE, ids,
        np.empty((n_rows, 0), np.int64), labels, att, cu, n_seg, longest, *mask_args,
    )  # fmt: skip

    tokens = [chunk[p : p + ln].tolist() for p, ln in zip(positions[:-1], all_lens)]
    masks = [chunk_mask[p : p + ln].tolist() if masked else [1] * ln
             for p, ln in zip(positions[:-1], all_lens)]  # fmt: skip
    w_rows = [w_placed[row_ptr[r] : row_ptr[r + 1]] for r in range(n_rows)]
    w_ids, w_att, w_lab = _streamed_rows(tokens, masks, w_rows, row_len, pad_id, labelled)
    assert ids.tolist() == w_ids and att.tolist() == w_att
    assert labels.tolist() == (w_lab if labelled else [[] for _ in range(n_rows)])
    assert [cu[r, : n_seg[r] + 1].tolist() for r in range(n_rows)] == w_cu
    assert longest.tolist() == w_longest

    # stream_rows: fill_rows with its arguments folded, the same rows.
    rows = np.full(3 * n_rows + 1, -7, dtype=np.int64)
    rows[: n_rows + 1] = row_ptr
    s_ids, s_att, s_lab = (np.full_like(x, 8) for x in (ids, att, labels))
    s_cu = np.full(cu.size, -1, dtype=np.int32)
    params = np.array([pad_id, mode, IGNORE], dtype=np.int64)
    stream_rows(src, placed, no_eot, rows, params, s_ids, s_lab, s_att, s_cu, *mask_args)
    assert s_ids.tolist() == ids.tolist() and s_att.tolist() == att.tolist()
    assert s_lab.tolist() == labels.tolist()
    s_cu = s_cu.reshape(cu.shape)
    assert [s_cu[r, : n_seg[r] + 1].tolist() for r in range(n_rows)] == w_cu
    assert rows[n_rows + 1 :].tolist() == n_seg.tolist() + longest.tolist()


def test_streaming_rows_are_written_by_fill_rows(monkeypatch):
    """The streaming packer has no row writer of its own: its batches (in-memory chunks and a
    store's ranges alike) are written by stream_rows, whose rows are fill_rows's (above)."""
    calls = []

    def spy(*args):
        calls.append(args[0].dtype)  # the source fill_rows reads
        return stream_rows(*args)

    monkeypatch.setattr(placement_module, "stream_rows", spy)
    docs = [np.arange(1, n + 1, dtype=np.int16) for n in (5, 3, 7, 2, 6)]
    batches = list(StreamingPacker(docs, batch_size=2, seqlen=8, buffer_size=4, mode="causal"))
    assert batches and len(calls) == len(batches)
    assert set(calls) == {np.dtype(np.int16)}  # the gathered buffer, in the chunks' dtype


@given(st.integers(1, 5), st.integers(1, 30), st.data())
def test_place_batch_matches_twin(n_rows, row_len, data):
    """place_batch over a slice of the held pieces is the linear scan's best fit, resumable, from
    empty rows whatever the previous batch left."""
    lens = data.draw(st.lists(st.integers(1, row_len), max_size=50))
    budget = data.draw(st.integers(0, 55))
    split = data.draw(st.integers(0, len(lens)))
    bits, off = row_index(n_rows, row_len)
    remaining = np.full(n_rows, -1, dtype=np.int64)
    counts = np.ones(n_rows, dtype=np.int64)
    held = np.zeros((4, len(lens) + 1), dtype=np.int64)
    held[0, : len(lens)] = lens
    out = np.full((2, len(lens) + 1), -9, dtype=np.int64)
    place_batch(held, 0, 0, 0, bits, off, remaining, counts, 5, n_rows, out)  # a previous batch
    counts[:] = 1  # of rows of 5 tokens, which the next batch resets
    k, d = place_batch(held, 0, split, budget, bits, off, remaining, counts, row_len, n_rows, out)
    if k == split and d < budget:  # all scanned: continue with the rest, as the packer does
        k, d2 = place_batch(
            held, k, len(lens), budget - d, bits, off, remaining, counts, row_len, n_rows, out,
        )  # fmt: skip
        d += d2
    rows, offs, want_d, want_rem, want_counts = ref_place(lens, budget, [row_len] * n_rows, row_len)
    assert k == len(rows) and d == want_d
    assert out[0, :k].tolist() == rows and out[1, :k].tolist() == offs
    assert remaining.tolist() == want_rem and counts.tolist() == want_counts


# =========================================================================== whole packer vs the seed
@settings(max_examples=60)
@given(
    lengths=st.lists(st.integers(0, 45), max_size=80),
    n_rows=st.integers(1, 4),
    row_len=st.integers(1, 20),
    extra=st.integers(0, 8),
    long_docs=st.sampled_from(["split", "truncate", "drop"]),
    drop_last=st.booleans(),
    readahead=st.integers(1, 9),
    kind=st.sampled_from(["lists", "int32", "uint16", "int64", "mixed", "tuples"]),
    pad_id=st.integers(-2, 3),
)
def test_numpy_and_list_sources_match_seed_twin(
    lengths, n_rows, row_len, extra, long_docs, drop_last, readahead, kind, pad_id
):
    """The same placements, tokens and padding as the seed's packer (slow twin), whatever the
    input's container and dtype (the batch is written by one concatenate per batch)."""
    docs = make_docs(lengths)
    want = ref_pack(docs, n_rows, row_len, n_rows + extra, long_docs, drop_last)
    dtypes = [np.int32, np.uint16, np.int64, np.uint32]
    source: list
    if kind == "lists":
        source = docs
    elif kind == "tuples":
        source = [tuple(d) for d in docs]
    elif kind == "mixed":
        source = [np.asarray(d, dtype=dtypes[j % 4]) for j, d in enumerate(docs)]
    else:
        source = [np.asarray(d, dtype=kind) for d in docs]
    packer = StreamingPacker(
        source,
        batch_size=n_rows,
        seqlen=row_len,
        buffer_size=n_rows + extra,
        long_docs=long_docs,
        drop_last=drop_last,
        readahead=readahead,
        pad_id=pad_id,
    )
    batches = list(packer)
    assert [rows_of(b) for b in batches] == want
    for b in batches:
        pad = b["input_ids"][b["attention_mask"] == 0]
        assert (pad == pad_id).all()


@pytest.mark.parametrize("source_kind", ["array", "list"])
def test_negative_tokens_are_refused_whatever_the_padding(source_kind):
    good = [[1, 2, 3], [4, 5]]
    bad = [[1, 2, 3], [4, -5]]
    if source_kind == "array":
        good = [np.asarray(d, dtype=np.int32) for d in good]
        bad = [np.asarray(d, dtype=np.int32) for d in bad]
    kw = dict(batch_size=1, seqlen=8, buffer_size=2, drop_last=False, pad_id=-1)
    assert [rows_of(b) for b in StreamingPacker(good, **kw)] == [[[[1, 2, 3], [4, 5]]]]
    with pytest.raises(ValueError, match="negative token -5"):
        list(StreamingPacker(bad, **kw))


@pytest.mark.parametrize("row_len", [1, 2, 3, 1024, 1025])
def test_padding_of_every_length(row_len):
    """Padding is written as the binary digits of its length: every length from 0 to row_len."""
    docs = [list(range(1, n + 1)) for n in range(1, row_len + 1)][:40]
    packer = StreamingPacker(
        docs, batch_size=1, seqlen=row_len, buffer_size=1, drop_last=False, pad_id=-3
    )
    for b in packer:
        used = int(b["attention_mask"].sum())
        assert (b["input_ids"][0, used:] == -3).all()
        assert b["input_ids"][0, :used].min() >= 1


@pytest.mark.parametrize("big", [2**63, 2**63 + 5, 2**64 + 5, 10**30])
def test_list_ids_past_int64_are_refused_as_the_build_refuses_them(tmp_path, big):
    """A Python-list sequence holding an id that does not fit int64 is the build's ValueError
    naming the value (it was a TypeError about casting dtype('O') or float64)."""
    seqs = [[1, 2, 3], [4, big, 6], [7, 8]] * 3
    with pytest.raises(ValueError, match=str(big)) as packed:
        for _ in StreamingPacker(seqs, seqlen=8, batch_size=2, buffer_size=4):
            pass
    with pytest.raises(ValueError, match=str(big)) as built:
        mmpack.build(tmp_path / "s", seqs)
    assert type(packed.value) is type(built.value)


# =========================================================================== token chunks
@settings(max_examples=80)
@given(
    dtype=st.sampled_from([np.int8, np.int32, np.uint16, np.int64, np.uint64]),
    n_chunk=st.integers(0, 30),
    base=st.integers(0, 50),
    data=st.data(),
)
def test_gather_pieces_matches_twin(dtype, n_chunk, base, data):
    """Pieces of any position (inside, across or outside the chunk, past the buffer) are copied
    exactly when wholly inside the chunk and the buffer; the or of the tokens is returned."""
    info = np.iinfo(dtype)
    chunk = np.array(
        data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n_chunk,
                           max_size=n_chunk)),
        dtype=dtype,
    )  # fmt: skip
    n = data.draw(st.integers(0, 6))
    positions = np.array(data.draw(st.lists(st.integers(0, 90), min_size=n, max_size=n)))
    lengths = np.array(data.draw(st.lists(st.integers(-1, 8), min_size=n, max_size=n)))
    starts = np.array(data.draw(st.lists(st.integers(-1, 20), min_size=n, max_size=n)))
    args = [np.asarray(a, dtype=np.int64) for a in (positions, lengths, starts)]
    got = np.full(16, -7, dtype=np.int64)
    want = got.copy()
    bits = gather_pieces(chunk, base, *args, got)
    assert bits == ref_gather_pieces(chunk, base, *args, want)
    assert (got == want).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda d: np.asarray(d, dtype=">i4"),  # non-native byte order
        lambda d: np.repeat(np.asarray(d, dtype=np.int32), 2)[::2],  # not contiguous
        lambda d: np.asarray(d, dtype=np.uint16),
        lambda d: np.asarray(d, dtype=np.int64),
    ],
)
def test_arrays_of_any_layout_give_the_same_batches(make):
    """Arrays joined by their bytes (one native dtype, contiguous) or by np.concatenate (other
    byte orders, strided views) give the seed's batches."""
    rng = np.random.default_rng(9)
    docs = [rng.integers(1, 60000, size=int(n)).tolist() for n in rng.integers(1, 41, 200)]
    packer = StreamingPacker([make(d) for d in docs], batch_size=3, seqlen=40, buffer_size=9)
    assert [rows_of(b) for b in packer] == ref_pack(docs, 3, 40, 9)
