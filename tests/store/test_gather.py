"""Documents appended to the token file as they are (``TokenFile.append_arrays``: written straight
from the arrays, or copied into the staging block when small) and taken from iterators, each as
it was when yielded (``DocChunks``), against naive concatenation; lists and generators of the
same documents give the same store or the same error.

Run: ``pytest tests/store/test_gather.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack._src.store.gather import Arrays, DocChunks
from mmpack._src.store.integrity import stripe_digest
from mmpack._src.store.tokenfile import TokenFile

_BLOCK = 64  # bytes: documents of a few tokens cross block boundaries


def _file(tmp_path, dtype="<u2", block=_BLOCK):
    return TokenFile(tmp_path / "t.bin", open, np.dtype(dtype), block)


def _finish(tf):
    digests = tf.finish()
    tf.close()
    return np.fromfile(tf.path, dtype=tf.dtype), digests


def _lens(docs):
    return np.array([len(d) for d in docs], dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), min_size=0, max_size=40), min_size=1, max_size=30),
    st.integers(0, 40),
)
def test_append_arrays_matches_concatenation(tmp_path_factory, docs, head):
    """Any split of the documents over blocks (after ``head`` tokens already in the file)
    gives the bytes and block digests of the naive concatenation."""
    tmp = tmp_path_factory.mktemp("a")
    arrays = [np.array(d, dtype=np.uint16) for d in docs]
    tf = _file(tmp)
    assert tf.append(np.arange(head, dtype=np.uint16)) == -1
    total = sum(len(d) for d in docs)
    assert tf.append_arrays(arrays, _lens(arrays)) is (total > 0)
    data, digests = _finish(tf)
    expected = np.concatenate([np.arange(head, dtype=np.uint16)] + (arrays if total else []))
    assert data.tolist() == expected.tolist()
    raw = expected.tobytes()
    assert digests == [stripe_digest(raw[a : a + _BLOCK]) for a in range(0, len(raw), _BLOCK)]


def test_strided_documents_are_copied_as_values(tmp_path):
    base = np.arange(200, dtype=np.uint16)
    docs = [base[::2], base[1:40:3], base[::-1][:30]]
    tf = _file(tmp_path)
    assert tf.append_arrays(docs, _lens(docs))
    data, _ = _finish(tf)
    assert data.tolist() == np.concatenate(docs).tolist()


@pytest.mark.parametrize(
    "bad",
    [
        np.arange(5, dtype=np.int64),  # another dtype
        np.arange(6, dtype=np.uint16).reshape(2, 3),  # 2-D
        np.arange(5, dtype=np.dtype(">u2")),  # other byte order
    ],
)
def test_a_document_of_another_kind_rolls_back_everything(tmp_path, bad):
    """A bad document after whole blocks were written: nothing of the call stays appended and
    the blocks before it are intact."""
    tf = _file(tmp_path)
    assert tf.append(np.arange(7, dtype=np.uint16)) == -1
    good = [np.arange(50, dtype=np.uint16) + i for i in range(3)]  # 300 bytes: several blocks
    docs = [*good, bad, np.arange(3, dtype=np.uint16)]
    assert tf.append_arrays(docs, _lens(docs)) is False
    assert tf.num_tokens == 7
    assert tf.append(np.arange(3, dtype=np.uint16)) == -1
    data, digests = _finish(tf)
    assert data.tolist() == list(range(7)) + [0, 1, 2]
    assert digests == [stripe_digest(data.tobytes())]


@pytest.mark.parametrize(
    ("dtype", "docs"),
    [
        ("<u1", [np.arange(3, dtype=np.uint16)]),  # needs conversion (and widening)
        ("<u2", [np.arange(3, dtype=np.int16)]),  # signed: needs a range check
        ("<u8", [np.arange(3, dtype=np.uint64)]),  # uint64 holds values beyond the token rule
        ("<u2", [np.zeros(0, dtype=np.uint16), np.zeros(0, dtype=np.float64)]),  # no tokens
    ],
)
def test_refused_when_values_need_checking(tmp_path, dtype, docs):
    tf = _file(tmp_path, dtype)
    assert tf.append_arrays(docs, _lens(docs)) is False
    assert tf.num_tokens == 0
    tf.close()


def test_list_chunks_are_documents_not_copies():
    docs = [np.arange(3, dtype=np.uint16), np.arange(2, dtype=np.uint16)]
    got = DocChunks(docs).take(10)
    assert isinstance(got, Arrays)
    assert got.docs[0] is docs[0] and got.lengths.tolist() == [3, 2]
    mixed = [np.arange(3, dtype=np.uint16), np.arange(2, dtype=np.int64)]
    got = DocChunks(mixed).take(10)
    assert isinstance(got, Arrays) and got.flat() is None  # the writer then goes doc by doc
    assert isinstance(DocChunks([np.arange(3), [1, 2]]).take(10), list)


def test_iterator_chunks_survive_a_live_view_of_the_buffer():
    """A chunk still referenced two takes later: its buffer is not written over."""
    source = DocChunks(np.full(4, j, dtype=np.uint16) for j in range(6))
    first, _ = source.take(2)
    second, _ = source.take(2)
    third, _ = source.take(2)
    assert first.tolist() == [0] * 4 + [1] * 4
    assert second.tolist() == [2] * 4 + [3] * 4
    assert third.tolist() == [4] * 4 + [5] * 4


@pytest.mark.parametrize("source", ["list", "generator"])
def test_build_mixed_and_strided_sources(tmp_path, source):
    """Whole builds through both paths: strided arrays, mixed dtypes, lists, empty documents."""
    base = np.arange(3000, dtype=np.uint16) % 700
    docs = [base[i : i + 37] for i in range(0, 2000, 37)] + [base[::5], np.zeros(0, np.uint16)]
    docs += [np.arange(4, dtype=np.int64), [1, 2, 3], base[:9]]
    expected = [np.asarray(d).tolist() for d in docs]
    src = docs if source == "list" else iter(docs)
    store = mmpack.build(tmp_path / "s", src, fsync=False, buffer_tokens=512)
    assert [d.tolist() for d in store] == expected
    store.verify()


def _docs_of(got):
    """The documents of one ``take`` result, as lists of ints."""
    if isinstance(got, tuple):
        flat, lens = got
        ends = np.cumsum(lens)
        return [flat[e - n : e].tolist() for e, n in zip(ends.tolist(), lens.tolist())]
    return [np.asarray(d).tolist() for d in got]


_SHARED = np.zeros(5, dtype=np.uint16)  # a source refilling this one array and yielding it


def _make(kind, j):
    if kind == "plain":
        return np.arange(j, j + j % 7, dtype=np.uint16)
    if kind == "reused":
        _SHARED[:] = j
        return _SHARED
    if kind == "strided":
        return np.arange(j, j + 20, dtype=np.uint16)[::3]
    if kind == "list":
        return list(range(j % 5))
    if kind == "2-D":
        return np.full((2, 2), j, dtype=np.uint16)
    return np.arange(j % 4, dtype=np.int64)  # another dtype


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(["plain", "reused", "strided", "list", "2-D", "int64"]), max_size=40),
    st.integers(1, 9),
)
def test_iterator_chunks_hold_each_document_as_yielded(kinds, size):
    """Any mix of documents from a generator (one array refilled and yielded again among them):
    the chunks hold every document as it was when yielded, in order, whichever path took it."""
    expected = []

    def source():
        for j, kind in enumerate(kinds):
            d = _make(kind, j)
            expected.append(np.asarray(d).tolist())
            yield d

    chunks = DocChunks(source())
    got = []
    while (part := chunks.take(size)) is not None:
        got += _docs_of(part)
    assert got == expected


class _Raises:
    """An iterator yielding ``good`` arrays, then raising ``exc`` (and, if ``more``, going on
    yielding arrays afterwards, as an iterator class may)."""

    def __init__(self, good: int, exc: BaseException, more: bool) -> None:
        self.k, self.good, self.exc, self.more = 0, good, exc, more

    def __iter__(self):
        return self

    def __next__(self):
        self.k += 1
        if self.k == self.good + 1:
            raise self.exc
        if self.k > self.good + 1 and not self.more:
            raise StopIteration
        return np.arange(5, dtype=np.uint16) + self.k


def _generator(good: int, exc: BaseException):
    for k in range(good):
        yield np.arange(5, dtype=np.uint16) + k
    raise exc


@pytest.mark.parametrize("exc", [ValueError("boom"), TypeError("boom"), BufferError("boom")])
@pytest.mark.parametrize("good", [0, 3])
@pytest.mark.parametrize("kind", ["generator", "iterator", "iterator going on"])
def test_a_source_raising_midway_fails_the_build(tmp_path, exc, good, kind):
    """The source's own ValueError/TypeError/BufferError propagates (it is not taken for a
    document ``io.BytesIO.write`` refused: no silent end, no repeated document)."""
    if kind == "generator":
        source = _generator(good, exc)
    else:
        source = _Raises(good, exc, more=kind == "iterator going on")
    with pytest.raises(type(exc), match="boom"):
        mmpack.build(tmp_path / "s", source, fsync=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("head", ["array.array", "ndarray"])
def test_a_source_refilling_one_array_array_keeps_each_document(tmp_path, head):
    """``array.array`` documents from a source that refills and yields one buffer again, after
    a plain array or not: each document is what was yielded (a copy taken when yielded)."""
    import array

    def source():
        if head == "ndarray":
            yield np.arange(4, dtype=np.uint16)
        buf = array.array("H", [0] * 4)
        for i in range(9):
            buf[:] = array.array("H", [i * 10 + j for j in range(4)])
            yield buf

    want = ([[0, 1, 2, 3]] if head == "ndarray" else []) + [
        [i * 10 + j for j in range(4)] for i in range(9)
    ]
    chunks, got = DocChunks(source()), []
    while (c := chunks.take(3)) is not None:
        assert isinstance(c, list)
        got += [list(map(int, d)) for d in c]
    assert got == want
    store = mmpack.build(tmp_path / "s", source(), fsync=False)
    assert [list(map(int, store[j])) for j in range(len(store))] == want


@pytest.mark.parametrize("order", [1, -1])
def test_a_generator_of_object_arrays_builds_as_the_list_does(tmp_path, order):
    """An object-dtype array (Python ints) is accepted from a list and from a generator alike
    (never taken as bytes: those would be object pointers)."""
    docs = [np.arange(5, dtype=np.uint16), np.array([1, 2, 300], dtype=object)][::order]
    want = [list(map(int, d)) for d in docs]
    for name, source in [("list", docs), ("generator", iter(docs))]:
        store = mmpack.build(tmp_path / name, source, fsync=False)
        assert [list(map(int, store[j])) for j in range(len(store))] == want


# ------------------------------------------- every document taken as it was when the source gave it
def _refilled(kind: str, n: int):
    """A source refilling one buffer and yielding a view of it (``memoryview``, a ctypes array,
    a ``memoryview`` of a ``bytearray`` cast to uint16, a ``numpy.memmap``-like subclass view)."""
    import ctypes

    if kind == "ctypes":
        cbuf = (ctypes.c_uint16 * 4)()
        for j in range(n):
            for k in range(4):
                cbuf[k] = 10 * j + k
            yield cbuf
        return
    raw = bytearray(8)
    arr = np.frombuffer(raw, dtype=np.uint16)
    for j in range(n):
        arr[:] = [10 * j + k for k in range(4)]
        if kind == "memoryview":
            yield memoryview(arr)
        elif kind == "bytearray view":
            yield memoryview(raw).cast("H")
        else:
            yield arr.view(np.memmap)


@pytest.mark.parametrize("kind", ["memoryview", "ctypes", "bytearray view", "subclass"])
@pytest.mark.parametrize("chunk", [1, 3, 8192])
def test_a_source_refilling_one_buffer_gives_every_document(tmp_path, kind, chunk):
    """A generator that refills one buffer and yields a buffer-protocol view of it: each
    document is what it was when yielded (not the last one ``n`` times), in every chunk of the
    take; a list of such objects over distinct buffers builds the same store."""
    want = [[10 * j + k for k in range(4)] for j in range(5)]
    chunks, got = DocChunks(_refilled(kind, 5)), []
    while (part := chunks.take(chunk)) is not None:
        got += _docs_of(part)
    assert got == want
    store = mmpack.build(tmp_path / "g", _refilled(kind, 5), fsync=False)
    assert [d.tolist() for d in store] == want
    as_list = [np.array(d).copy() for d in _refilled(kind, 5)]  # distinct buffers
    if kind == "memoryview":
        as_list = [memoryview(a) for a in as_list]
    store = mmpack.build(tmp_path / "l", as_list, fsync=False)
    assert [d.tolist() for d in store] == want


def _tensor_cases():
    import torch

    grad = torch.tensor([3.0, 4.0], requires_grad=True)
    return {
        "requires grad": (grad, [3, 4]),
        "requires grad, not integral": (torch.tensor([3.5], requires_grad=True), ValueError),
        "meta": (torch.tensor([1, 2], device="meta"), ValueError),
        "meta float": (torch.empty(3, device="meta"), ValueError),
    }


@pytest.mark.parametrize(
    "case", ["requires grad", "requires grad, not integral", "meta", "meta float"]
)
def test_tensors_follow_one_rule_for_lists_and_generators(tmp_path, case):
    """A tensor that requires grad or a ``meta`` tensor (no data): a list and a generator give
    the same result, a store or an error of a builtin type naming the document."""
    import torch

    doc, want = _tensor_cases()[case]
    docs = [torch.tensor([1, 2]), doc, torch.tensor([5])]
    for name, source in [("list", docs), ("generator", iter(docs))]:
        if want is ValueError:
            with pytest.raises(ValueError, match="document 1 "):
                mmpack.build(tmp_path / name, source, fsync=False)
            assert not (tmp_path / name).exists()
        else:
            store = mmpack.build(tmp_path / name, source, fsync=False)
            assert [d.tolist() for d in store] == [[1, 2], want, [5]]


def test_the_first_chunk_of_an_iterator_is_small():
    """Before any length is known the writer's chunk size is a guess: the first chunk of an
    iterator holds at most ``FIRST_TAKE`` documents, later ones what is asked."""
    from mmpack._src.store.gather import FIRST_TAKE

    chunks = DocChunks(np.full(3, j, dtype=np.uint16) for j in range(3 * FIRST_TAKE))
    sizes = [len(part[1]) for part in iter(lambda: chunks.take(8192), None)]
    assert sizes == [FIRST_TAKE, 2 * FIRST_TAKE]
    assert len(DocChunks([np.zeros(1, np.uint16)] * 100).take(8192).docs) == 100  # lists: as asked


def test_a_generator_of_long_documents_is_taken_in_bounded_chunks(tmp_path):
    """The writer's first chunk size is a guess (no length known yet): 200 documents of 50k
    int64 tokens (80 MB) from a generator never sit in one chunk buffer; the traced peak stays
    near the two staging blocks, far below the corpus."""
    import tracemalloc

    def docs():
        for j in range(200):
            yield np.full(50_000, j, dtype=np.int64)

    tracemalloc.start()
    try:
        store = mmpack.build(tmp_path / "s", docs(), fsync=False, buffer_tokens=1 << 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(store) == 200 and store[199].tolist() == [199] * 50_000
    assert peak < 60 << 20, f"peak {peak / 2**20:.0f} MiB for an 80 MB corpus"
