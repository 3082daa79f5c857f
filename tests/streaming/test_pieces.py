"""The packer's piece buffer: chunks released and reused as the stream moves on, placements kept across chunks."""

from __future__ import annotations

import numpy as np
import pytest
from reference import ref_pack, rows_of

from mmpack import StreamingPacker
from mmpack._src.streaming.pieces import PieceBuffer


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
