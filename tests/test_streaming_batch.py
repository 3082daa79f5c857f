"""The streaming packer's batch kernels against slow twins, and the one-pass conversion of an
incoming batch (numpy arrays and Python lists) against the token rule and the seed's packer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_layout, ref_pack, ref_place, ref_write_pieces, rows_of
from test_streaming import make_docs

import mmpack
from mmpack.kernels.plan_bestfit import place_batch, reset_rows, row_index
from mmpack.kernels.streaming_batch import layout_batch, token_bits, write_pieces
from mmpack.store.tokens import as_token_array
from mmpack.streaming.incoming import flat_sequences, sequences_of
from mmpack.streaming.packer import StreamingPacker
from mmpack.streaming.pieces import PieceBuffer


# =========================================================================== slow twins
@settings(max_examples=80)
@given(
    n_rows=st.integers(1, 5),
    row_len=st.integers(1, 40),
    with_pads=st.booleans(),
    data=st.data(),
)
def test_layout_batch_matches_twin(n_rows, row_len, with_pads, data):
    n = data.draw(st.integers(0, 40))
    lens = data.draw(st.lists(st.integers(1, row_len), min_size=n, max_size=n))
    budget = data.draw(st.integers(0, 45))
    extra = data.draw(st.integers(0, 5))  # held pieces beyond the scanned ones
    rows, offs, deferred, remaining, _ = ref_place(lens, budget, [row_len] * n_rows, row_len)
    processed = len(rows)
    n_held = n + extra
    held = np.zeros((4, n_held + 3), dtype=np.int64)
    held[0, :n] = lens
    held[0, n:n_held] = 1
    held[1, :n_held] = np.arange(n_held) * 7 + 3  # source index
    held[2, :n_held] = np.arange(n_held) % 5  # offset in the source
    held[3, :n_held] = np.arange(n_held) + 100  # slot
    before = held.copy()
    out = np.full((2, n_held + 2), -9, dtype=np.int64)
    out[0, :processed] = rows
    out[1, :processed] = offs
    rem = np.array(remaining + [-1], dtype=np.int64)
    pad_bits = row_len.bit_length() if with_pads else 0
    n_placed = sum(r >= 0 for r in rows)
    placed = np.empty((6, n_placed), dtype=np.int64)
    cu = np.empty(n_placed + 2 * n_rows, dtype=np.int32)
    per_row = np.empty(3 * n_rows + 1, dtype=np.int64)
    order = np.empty(n_placed + n_rows * pad_bits, dtype=np.int64)
    mask = np.full((n_rows, row_len), 7, dtype=np.int64)
    n_left, total, empty, n_order = layout_batch(
        out, processed, held, n_held, rem, n_rows, row_len, pad_bits, placed, cu, per_row, order,
        mask,
    )  # fmt: skip

    w_placed, w_cu, w_longest, w_used, w_order = ref_layout(
        rows, offs, lens, remaining, n_rows, row_len, pad_bits
    )
    assert placed[0].tolist() == [rows[i] for i in w_placed]
    assert placed[1].tolist() == [offs[i] for i in w_placed]
    for f in range(4):
        assert placed[2 + f].tolist() == [int(before[f, i]) for i in w_placed]
    b = per_row[: n_rows + 1].tolist()
    assert [cu[b[r] : b[r + 1]].tolist() for r in range(n_rows)] == w_cu
    assert per_row[n_rows + 1 : 2 * n_rows + 1].tolist() == w_longest
    assert per_row[2 * n_rows + 1 :].tolist() == w_used
    assert total == sum(w_used) and empty == sum(1 for r in range(n_rows) if r not in rows)
    slot_of = {i: int(before[3, i]) for i in range(n_held)}
    assert order[:n_order].tolist() == [slot_of[x] if k == "piece" else x for k, x in w_order]
    assert mask.tolist() == [[int(c < u) for c in range(row_len)] for u in w_used]
    stay = [i for i in range(n_held) if i >= processed or rows[i] < 0]
    assert n_left == len(stay)
    assert held[:, :n_left].tolist() == before[:, stay].tolist()


@given(st.lists(st.lists(st.integers(-3, 2**40), max_size=9), min_size=1, max_size=5))
def test_token_bits_matches_twin(rows):
    width = max(len(r) for r in rows) + 2
    ids = np.full((len(rows), width), -1, dtype=np.int64)  # padding is not looked at
    for r, toks in enumerate(rows):
        ids[r, : len(toks)] = toks
    used = np.array([len(r) for r in rows], dtype=np.int64)
    want = 0
    for toks in rows:
        for t in toks:
            want |= t
    assert token_bits(ids, used) == want
    assert (token_bits(ids, used) < 0) == any(t < 0 for r in rows for t in r)


@given(st.integers(1, 5), st.integers(1, 30), st.data())
def test_place_batch_matches_twin(n_rows, row_len, data):
    """place_batch = reset_rows + place_best_fit over a slice of the held pieces, resumable."""
    lens = data.draw(st.lists(st.integers(1, row_len), max_size=50))
    budget = data.draw(st.integers(0, 55))
    split = data.draw(st.integers(0, len(lens)))
    bits, off = row_index(n_rows, row_len)
    remaining = np.full(n_rows, 5, dtype=np.int64)  # a previous batch's state: reset first
    counts = np.ones(n_rows, dtype=np.int64)
    held = np.zeros((4, len(lens) + 1), dtype=np.int64)
    held[0, : len(lens)] = lens
    out = np.full((2, len(lens) + 1), -9, dtype=np.int64)
    reset_rows(bits, off, remaining, counts, n_rows, 5)  # the index matches `remaining`
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


def test_write_pieces_pads_rows_without_a_chunk():
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    none = np.empty(0, dtype=np.int64)
    write_pieces(none, 0, np.empty((6, 0), dtype=np.int64), 3, ids, np.array([4, 0, 2]), -5)
    assert ids.tolist() == [[0, 1, 2, 3], [-5, -5, -5, -5], [8, 9, -5, -5]]


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


# =========================================================================== one pass per batch
def _tokens(objs, lens):
    return [np.asarray(o).tolist() for o in objs], lens.tolist()


@pytest.mark.parametrize(
    "items",
    [
        [[5, 6, 7], [], [8], (9, 10)],
        [[0, 1, 1, 0] * 50, [1] * 30, [2, 3]],  # many 0s and 1s: every element's type is read
        [[2**62, 3], [4]],
        [np.arange(4, dtype=np.int32), np.arange(3, dtype=np.uint8)],
    ],
)
def test_sequences_of_keeps_the_tokens(items):
    objs, lens = sequences_of(items, 0)
    assert _tokens(objs, lens) == ([list(x) for x in items], [len(x) for x in items])
    assert all(np.asarray(o).dtype.kind in "iu" for o in objs)


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        ([3, True], ValueError, "document 11 has a non-integer token True"),
        ([False, 3], ValueError, "non-integer token False"),
        ([3, 1.5], ValueError, "non-integer token 1.5"),
        ([3, "4"], ValueError, "document 11 holds <U21 values"),
        ([3, [4]], ValueError, "document 11"),
        ([3, np.True_], ValueError, "non-integer token"),
    ],
)
def test_lists_follow_the_token_rule(bad, exc, match):
    """A bad element anywhere in an incoming batch of lists is refused as build refuses it,
    naming its document, even when the other lists are plain (the one-pass path falls back)."""
    items = [[1, 2]] * 10 + [bad] + [[0, 1]] * 5
    with pytest.raises(exc, match=match):
        sequences_of(items, 1)
    with pytest.raises(exc):
        as_token_array(bad, 11)


def test_integral_floats_and_numpy_scalars_in_lists_are_converted():
    items = [[1.0, 2.0], [np.int64(3), 4], [5, 6]]
    objs, lens = sequences_of(items, 0)
    assert _tokens(objs, lens) == ([[1, 2], [3, 4], [5, 6]], [2, 2, 2])


def test_bad_arrays_take_the_exact_path():
    with pytest.raises(TypeError, match="document 1 has shape"):
        sequences_of([np.arange(3), np.ones((2, 2), dtype=np.int64)], 0)
    with pytest.raises(TypeError, match="document 0"):
        sequences_of([np.int64(3), np.arange(2)], 0)
    with pytest.raises(ValueError, match="non-integer token 0.5"):
        sequences_of([np.arange(3), np.full(2, 0.5)], 0)


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


def test_uint64_tokens_beyond_int64_are_refused():
    docs = [np.array([2**63 + 1, 3], dtype=np.uint64)]
    with pytest.raises(ValueError, match=r"< 2\*\*63"):
        list(StreamingPacker(docs, batch_size=1, seqlen=4, buffer_size=1))


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
def test_write_pieces_matches_twin(dtype, n_chunk, base, data):
    """Pieces of any position (inside, across or outside the chunk, past a row) are written
    exactly when wholly inside the chunk and the row, then the padding of the rows in ``used``
    (clamped, none with an empty ``used``); the or of the tokens is returned."""
    info = np.iinfo(dtype)
    chunk = np.array(
        data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n_chunk,
                           max_size=n_chunk)),
        dtype=dtype,
    )  # fmt: skip
    n_rows, row_len = 3, 8
    n = data.draw(st.integers(0, 6))
    cols = [
        [data.draw(st.integers(-1, 3)), data.draw(st.integers(-1, 8)),
         data.draw(st.integers(0, 8)), 0, 0, data.draw(st.integers(0, 90))]
        for _ in range(n)
    ]  # fmt: skip
    placed = np.array(cols, dtype=np.int64).reshape(n, 6).T.copy()
    used = np.array(
        data.draw(st.lists(st.integers(-2, row_len + 2), max_size=n_rows + 1)), dtype=np.int64
    )
    pad_id = data.draw(st.integers(-5, 5))
    got = np.full((n_rows, row_len), -7, dtype=np.int64)
    want = got.copy()
    assert write_pieces(chunk, base, placed, n_rows, got, used, pad_id) == ref_write_pieces(
        chunk, base, placed, n_rows, want, used, pad_id
    )
    assert (got == want).all()


def test_flat_sequences_joins_and_checks_like_sequences_of():
    items = [
        np.arange(4, dtype=np.int32),
        np.arange(3, dtype=np.uint8),
        np.arange(0, dtype=np.int8),
    ]
    flat, lens = flat_sequences(items, 0)
    assert flat.tolist() == [0, 1, 2, 3, 0, 1, 2] and lens.tolist() == [4, 3, 0]
    assert flat.dtype == np.int32
    flat, lens = flat_sequences([[5, 6], (7,), []], 0)
    assert flat.tolist() == [5, 6, 7] and flat.dtype == np.int64 and lens.tolist() == [2, 1, 0]
    # int64 with uint64 (numpy would give float64): int64, an id >= 2**63 refused naming it
    flat, _ = flat_sequences([np.arange(2), np.arange(2, dtype=np.uint64)], 0)
    assert flat.dtype == np.int64 and flat.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match=str(2**63 + 1)):
        flat_sequences([np.arange(2), np.array([2**63 + 1], dtype=np.uint64)], 0)
    with pytest.raises(ValueError, match="document 11 has a non-integer token True"):
        flat_sequences([[1, 2]] * 10 + [[3, True]], 1)
    with pytest.raises(TypeError, match="document 1 has shape"):
        flat_sequences([np.arange(3), np.ones((2, 2), dtype=np.int64)], 0)
    spare = np.full(10, -1, dtype=np.int32)
    flat, _ = flat_sequences(items, 0, lambda dt, n: spare[:n] if dt == np.int32 else None)
    assert flat.base is spare and spare[:7].tolist() == [0, 1, 2, 3, 0, 1, 2]


def test_piece_buffer_releases_and_reuses_chunks():
    buf = PieceBuffer(with_chunks=True)
    a = buf.spare(np.dtype(np.int32), 5)
    a[:] = range(5)
    assert buf.add_chunk(a) == 0
    assert buf.add_chunk(np.arange(10, 13, dtype=np.int64)) == 5
    assert buf.tokens(1, 3).tolist() == [1, 2, 3] and buf.tokens(5, 3).tolist() == [10, 11, 12]
    buf.release(4)  # position 4 is still referenced: nothing is released
    assert len(buf.chunks) == 2
    buf.release(5)
    assert [b for b, _ in buf.chunks] == [5]
    again = buf.spare(np.dtype(np.int32), 4)  # the released buffer, reused
    assert again.base is a.base
    assert buf.spare(np.dtype(np.int64), 4).base is not a.base
    buf.release(None)
    assert buf.chunks == []


@pytest.mark.parametrize("incoming", [3, 50])
def test_pieces_from_many_chunks_keep_placements(incoming):
    """Pieces deferred across incoming batches (many live chunks, some of other dtypes) are
    written from the right chunk: the batches equal the seed's packer's."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 60000, size=int(n)).tolist() for n in rng.integers(1, 41, 300)]
    kinds = [np.int32, np.uint16, np.int64]
    arrays = [np.asarray(d, dtype=kinds[j // 7 % 3]) for j, d in enumerate(docs)]
    batches = [arrays[i : i + incoming] for i in range(0, len(arrays), incoming)]
    packer = StreamingPacker(
        batches, source_format="batches", batch_size=3, seqlen=40, buffer_size=9
    )
    assert [rows_of(b) for b in packer] == ref_pack(docs, 3, 40, 9)


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


def test_two_d_arrays_in_a_batch_are_refused_by_name():
    flat, _ = flat_sequences([np.arange(3), np.arange(2)], 0)
    assert flat.tolist() == [0, 1, 2, 0, 1]
    for items in (
        [np.ones((2, 1), dtype=np.int64), np.ones((3, 1), dtype=np.int64)],
        [np.ones((2, 2), dtype=np.int32)] * 2,
    ):
        with pytest.raises(TypeError, match="document 0 has shape"):
            flat_sequences(items, 0)


def test_chunks_are_released_as_the_stream_moves_on():
    """The live token chunks stay few (those of the held and queued pieces), whatever the
    stream's length (187 incoming batches, each one chunk)."""
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, 1000, size=int(n), dtype=np.int32) for n in rng.integers(1, 60, 3000)]
    batches = [docs[i : i + 16] for i in range(0, len(docs), 16)]
    packer = StreamingPacker(
        batches, source_format="batches", batch_size=4, seqlen=64, buffer_size=8
    )
    live = []
    for _ in packer:
        live.append(len(packer._admission.pieces.chunks))
    assert len(batches) > 150 and len(live) > 100 and max(live) <= 4


def test_chunks_of_dropped_sequences_are_not_held():
    """A long stretch of sequences that give no piece (dropped) keeps no chunks
    alive while the packer reads on for pieces: the live chunks stay bounded by the held
    pieces (before: one per incoming batch of the stretch, 1463 here, all their tokens held
    until the next batch was written)."""
    rng = np.random.default_rng(6)
    lengths = np.where(np.arange(4000) % 400 == 0, 8, 100)  # 1 short per 400 long
    docs = [rng.integers(1, 1000, size=int(n), dtype=np.int32) for n in lengths]
    seen = []

    def source():
        for i in range(0, len(docs), 10):
            seen.append(len(packer._admission.pieces.chunks))
            yield docs[i : i + 10]

    packer = StreamingPacker(
        source(), source_format="batches", batch_size=2, seqlen=64, buffer_size=4,
        long_docs="drop", drop_last=False,
    )  # fmt: skip
    got = [rows_of(b) for b in packer]
    assert got == ref_pack([d.tolist() for d in docs], 2, 64, 4, "drop", False)
    # At most one chunk per held piece (buffer_size + readahead = 8) and the newest two.
    assert len(seen) == 400 and max(seen) <= 10
