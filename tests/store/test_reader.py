"""The TokenStore contract, checked identically for every backend.

``TestStoreContract`` is parametrized over ``BACKENDS``: a new backend is added to that list and
must pass everything here (round trips over random corpora, dtype choice and widening, every kind
of document input, indexing errors, range reads, pickling, atomic (over)writes).
"""

from __future__ import annotations

import multiprocessing
import operator
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import build
from mmpack._src.store.writer import TokenStore, open_store
from mmpack.errors import FormatError, StateMismatchError, StoreExistsError, StoreNotFoundError
from mmpack.store import StoreWriter

BACKENDS = ["memmap", "zarr"]
BOUNDARY_TOKENS = [0, 1, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]  # ids < 2**63

token = st.one_of(
    st.sampled_from(BOUNDARY_TOKENS),
    st.integers(0, 300),
    st.integers(0, 2**63 - 1),
)
corpus = st.lists(st.lists(token, max_size=12), max_size=12)


def smallest(max_token: int) -> np.dtype:
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_token <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise AssertionError


def assert_store_holds(store: TokenStore, docs: list[list[int]]) -> None:
    """The slow, obviously-right reading of a store, compared with the expected documents."""
    assert len(store) == len(docs)
    lens = [len(d) for d in docs]
    assert store.num_tokens == sum(lens)
    assert store.offsets.dtype == np.int64 and store.offsets.shape == (len(docs) + 1,)
    assert store.offsets.tolist() == [0, *np.cumsum(lens, dtype=np.int64).tolist()]
    assert store.doc_lens.dtype == np.int64 and store.doc_lens.tolist() == lens
    for j, doc in enumerate(docs):
        got = store[j]
        assert got.dtype == store.dtype and got.ndim == 1
        assert [int(x) for x in got] == [int(x) for x in doc]
        assert [int(x) for x in store[j - len(docs)]] == [int(x) for x in doc]
    assert [list(map(int, d)) for d in store] == [list(map(int, d)) for d in docs]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


class TestStoreContract:
    # ------------------------------------------------------------------------- round trips
    @settings(max_examples=30)
    @given(docs=corpus, data=st.data())
    def test_round_trip(self, backend, docs, data):
        with tempfile.TemporaryDirectory() as tmp:
            store = build(Path(tmp) / "s", docs, backend=backend)
            assert store.backend == backend
            flat = [t for d in docs for t in d]
            assert store.dtype == smallest(max(flat, default=0))
            assert_store_holds(store, docs)
            assert (
                store.verify()["bytes"]
                == store.num_tokens * store.dtype.itemsize + (len(docs) + 1) * 8
            )
            n = store.num_tokens
            start = data.draw(st.integers(0, n))
            stop = data.draw(st.integers(start, n))
            assert store.read_range(start, stop).tolist() == flat[start:stop]
            k = data.draw(st.integers(0, 6))
            starts = np.array(
                data.draw(st.lists(st.integers(0, n), min_size=k, max_size=k)), dtype=np.int64
            )
            lengths = np.array([data.draw(st.integers(0, n - s)) for s in starts], dtype=np.int64)
            src, src_starts = store.read_ranges(starts, lengths)
            assert src_starts.dtype == np.int64 and src_starts.shape == (k,)
            for s, ln, ss in zip(starts, lengths, src_starts):
                assert src[ss : ss + ln].tolist() == flat[s : s + ln]
            again = pickle.loads(pickle.dumps(store))
            assert_store_holds(again, docs)
            reopened = open_store(Path(tmp) / "s")
            assert reopened.fingerprint == store.fingerprint
            assert reopened.meta == store.meta

    @pytest.mark.parametrize("docs", [[], [[]], [[], [], []], [[7]], [[], [3, 4], []]])
    def test_degenerate_corpora(self, backend, tmp_path, docs):
        store = build(tmp_path / "s", docs, backend=backend)
        assert_store_holds(store, docs)
        store.verify()
        assert store.dtype == np.uint8

    @pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, "<u2", ">u4"])
    def test_given_dtype(self, backend, tmp_path, dtype):
        docs = [[0, 1, 255], [], [7]]
        store = build(tmp_path / "s", docs, dtype=dtype, backend=backend)
        assert store.dtype == np.dtype(dtype).newbyteorder("<")
        assert_store_holds(store, docs)

    @pytest.mark.parametrize("top", BOUNDARY_TOKENS)
    def test_dtype_boundary(self, backend, tmp_path, top):
        store = build(tmp_path / "s", [[0, top], [top]], backend=backend)
        assert store.dtype == smallest(top)
        assert_store_holds(store, [[0, top], [top]])

    def test_every_input_kind(self, backend, tmp_path):
        docs = [
            [1, 2, 3],
            (4, 5),
            np.array([6, 7], dtype=np.int8),
            np.array([8], dtype=np.int16),
            np.array([9, 10], dtype=np.int32),
            np.array([11], dtype=np.int64),
            np.array([12], dtype=np.uint8),
            np.array([65535], dtype=np.uint16),
            np.array([13], dtype=np.uint32),
            np.array([14], dtype=np.uint64),
            np.array([15.0, 16.0]),  # integer-valued floats are accepted
            torch.tensor([17, 18], dtype=torch.int64),
            torch.tensor([19], dtype=torch.int32),
            torch.tensor([20], dtype=torch.uint8),
            torch.tensor([21], dtype=torch.int16),
            np.arange(30)[::3],  # non-contiguous
            [],
            np.array([], dtype=np.float64),
            [np.int64(22), np.uint16(23)],
            [2**63 - 1, 1],  # the largest token id
            [2**63 - 2, 0],
        ]
        expected = [[int(x) for x in np.asarray(d).tolist()] for d in docs[:-2]]
        expected += [[2**63 - 1, 1], [2**63 - 2, 0]]
        store = build(tmp_path / "s", (d for d in docs), backend=backend)  # a generator
        assert_store_holds(store, expected)

    @pytest.mark.parametrize("buffer_tokens", [1, 2, 5])
    def test_small_buffer_widens_dtype(self, backend, tmp_path, buffer_tokens):
        rng = np.random.default_rng(buffer_tokens)
        docs = [rng.integers(0, 256, rng.integers(0, 6)).tolist() for _ in range(20)]
        docs += [[1, 65536]] + [rng.integers(0, 70000, 4).tolist() for _ in range(5)]
        docs += [[2**40]] + [[2**63 - 1, 0]] + [[3]]
        store = build(tmp_path / "s", docs, backend=backend, buffer_tokens=buffer_tokens)
        assert store.dtype == np.uint64
        assert_store_holds(store, docs)
        store.verify()  # the checksums were recomputed over the widened bytes
        plain = build(tmp_path / "p", docs, backend=backend)
        assert plain.fingerprint == store.fingerprint

    def test_add_batch(self, backend, tmp_path):
        with StoreWriter(tmp_path / "s", backend=backend, buffer_tokens=2) as w:
            w.add([1, 2, 3])
            w.add_batch(np.array([4, 5, 70000], dtype=np.int64), np.array([0, 1, 2]))
            w.add([6])
        assert_store_holds(w.store, [[1, 2, 3], [], [4], [5, 70000], [6]])
        with pytest.raises(ValueError, match="lengths sum to 3"):
            with StoreWriter(tmp_path / "t", backend=backend) as w:
                w.add_batch(np.array([1, 2]), np.array([1, 2]))
        assert not (tmp_path / "t").exists()

    # ------------------------------------------------------------------------- indexing
    def test_indexing_errors(self, backend, tmp_path):
        store = build(tmp_path / "s", [[1], [2, 3]], backend=backend)
        assert store[np.int32(1)].tolist() == [2, 3]
        assert store[np.uint64(0)].tolist() == [1]
        for j in (2, -3, 10**30):
            with pytest.raises(IndexError, match=f"document index {j} is out of range for 2"):
                store[j]
        for j in (1.0, "0", None, True, np.bool_(False), [0], slice(0, 1)):
            with pytest.raises(TypeError, match="document index must be an integer"):
                store[j]
        for a, b in ((-1, 1), (0, 4), (2, 1)):
            with pytest.raises(IndexError, match=rf"token range \[{a}, {b}\)"):
                store.read_range(a, b)
        with pytest.raises(TypeError):
            store.read_range(0.5, 1)

    def test_views_are_read_only(self, backend, tmp_path):
        store = build(tmp_path / "s", [[1], [2, 3]], backend=backend)
        for arr in (store.offsets, store.doc_lens):
            with pytest.raises(ValueError):
                arr[0] = 5
        if backend == "memmap":
            with pytest.raises(ValueError):
                store[0][0] = 5

    # ------------------------------------------------------------------------- identity
    def test_metadata_and_fingerprint(self, backend, tmp_path):
        docs = [[1, 2], [300]]
        store = build(tmp_path / "s", docs, backend=backend)
        assert isinstance(store.path, Path) and store.path == tmp_path / "s"
        assert len(store.fingerprint) == 16 and int(store.fingerprint, 16) >= 0
        assert store.meta["num_docs"] == 2 and store.meta["num_tokens"] == 3
        assert store.meta["backend"] == backend
        other = "zarr" if backend == "memmap" else "memmap"
        assert build(tmp_path / "o", docs, backend=other).fingerprint == store.fingerprint
        assert (
            build(tmp_path / "d", [[1, 2], [301]], backend=backend).fingerprint != store.fingerprint
        )
        assert (
            build(tmp_path / "e", [[1], [2, 300]], backend=backend).fingerprint != store.fingerprint
        )
        assert repr(store).startswith("TokenStore(")

    # ------------------------------------------------------------------------- pickling
    def test_pickle_is_small_and_survives_spawn(self, backend, tmp_path):
        docs = [list(range(j, j + 50)) for j in range(200)]
        store = build(tmp_path / "s", docs, backend=backend)
        blob = pickle.dumps(store)
        assert len(blob) < 1024
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            assert pool.apply(len, (store,)) == 200
            assert pool.apply(operator.getitem, (store, 17)).tolist() == docs[17]
            assert pool.apply(TokenStore.verify, (store,))["blocks"] == 2

    def test_pickle_into_subprocess(self, backend, tmp_path):
        store = build(tmp_path / "s", [[5, 6], [7]], backend=backend)
        code = (
            "import pickle, sys; s = pickle.loads(sys.stdin.buffer.read()); "
            "print(len(s), s[0].tolist(), s.fingerprint)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], input=pickle.dumps(store), capture_output=True, check=True
        )
        assert out.stdout.decode().split() == ["2", "[5,", "6]", store.fingerprint]

    def test_unpickle_after_rebuild_is_refused(self, backend, tmp_path):
        store = build(tmp_path / "s", [[1, 2]], backend=backend)
        blob = pickle.dumps(store)
        build(tmp_path / "s", [[1, 3]], backend=backend, overwrite=True)
        with pytest.raises(StateMismatchError, match="rebuilt"):
            pickle.loads(blob)
        # rebuilt with identical content: same fingerprint, accepted
        build(tmp_path / "s", [[1, 2]], backend=backend, overwrite=True)
        assert pickle.loads(blob)[0].tolist() == [1, 2]

    # ------------------------------------------------------------------------- (over)writing
    def test_exists_without_overwrite(self, backend, tmp_path):
        first = build(tmp_path / "s", [[1]], backend=backend)
        with pytest.raises(StoreExistsError, match="overwrite=True") as info:
            build(tmp_path / "s", [[2]], backend=backend)
        assert isinstance(info.value, FileExistsError)
        assert open_store(tmp_path / "s").fingerprint == first.fingerprint
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]

    def test_overwrite_replaces(self, backend, tmp_path):
        old = build(tmp_path / "s", [[1, 2, 3]] * 10, backend=backend)
        new = build(tmp_path / "s", [[9]], backend=backend, overwrite=True)
        assert_store_holds(open_store(tmp_path / "s"), [[9]])
        assert new.fingerprint != old.fingerprint
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
        if backend == "memmap":  # a reader holding the old mapping keeps reading the old data
            assert old[9].tolist() == [1, 2, 3]
        else:  # zarr reads chunks by path: the old object refuses instead of mixing stores
            with pytest.raises(StateMismatchError, match="replaced"):
                old[9]

    def test_overwrite_of_a_file_is_refused(self, backend, tmp_path):
        (tmp_path / "s").write_text("precious")
        with pytest.raises(FileExistsError, match="is a file"):
            build(tmp_path / "s", [[1]], backend=backend, overwrite=True)
        assert (tmp_path / "s").read_text() == "precious"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]

    @pytest.mark.parametrize(
        ("docs", "kwargs", "message"),
        [
            ([[1, 2]] * 30 + [[3, -1]], {}, "document 30 has a negative token -1 at position 1"),
            ([[1, 2]] * 30 + [[70000]], {"dtype": np.uint16}, "document 30 has token 70000"),
            ([[1]] * 10 + [[300]] + [[2**63 - 1]] + [[0.5]], {}, "document 12 has a non-integer"),
            ([[1]] * 10 + ["text"], {}, "document 10 is a str"),
        ],
    )
    def test_bad_late_document_leaves_nothing(self, backend, tmp_path, docs, kwargs, message):
        """A bad document after several flushes (and a widening) still leaves no trace."""
        with pytest.raises((ValueError, TypeError), match=message):
            build(tmp_path / "s", docs, backend=backend, buffer_tokens=3, **kwargs)
        assert list(tmp_path.iterdir()) == []

    def test_exception_inside_writer_leaves_nothing(self, backend, tmp_path):
        with pytest.raises(KeyError):
            with StoreWriter(tmp_path / "s", backend=backend, buffer_tokens=1) as w:
                w.add([1, 2, 3])
                raise KeyError("user code failed")
        assert list(tmp_path.iterdir()) == []


def test_zarr_store_is_a_plain_zarr_group(tmp_path):
    import zarr

    docs = [[1, 2, 3], [], [70000]]
    store = build(tmp_path / "z", docs, backend="zarr")
    group = zarr.open_group(str(tmp_path / "z"), mode="r")
    assert np.asarray(group["tokens"][:]).tolist() == [1, 2, 3, 70000]
    assert np.asarray(group["offsets"][:]).tolist() == [0, 3, 3, 4]
    assert group["tokens"].dtype == np.uint32
    assert dict(group.attrs)["mmpack"]["fingerprint"] == store.fingerprint


def test_memmap_layout(tmp_path):
    store = build(tmp_path / "m", [[1, 2, 3], [], [70000]])
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "mmpack.json",
        "offsets.bin",
        "tokens.bin",
    ]
    assert np.fromfile(tmp_path / "m" / "tokens.bin", dtype="<u4").tolist() == [1, 2, 3, 70000]
    assert np.fromfile(tmp_path / "m" / "offsets.bin", dtype="<i8").tolist() == [0, 3, 3, 4]
    assert store.tokens is not None and store.tokens.flags.writeable is False


def test_open_errors(tmp_path):
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        mmpack.open(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(FormatError, match="is a file"):
        mmpack.open(tmp_path / "f")
    (tmp_path / "d").mkdir()
    with pytest.raises(FormatError, match="not an mmpack store"):
        mmpack.open(tmp_path / "d")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        mmpack.open(3)


# ============================================================== Zarr batched reads: chunk cache
def _small_chunk_zarr(tmp_path: Path, monkeypatch, num_tokens: int = 1000, chunk: int = 64):
    """A Zarr store of zstd-compressed ``chunk``-token shards of one inner chunk each (many
    chunks from few tokens, decoded through the process's chunk cache), and the flat tokens it
    holds; the cache starts empty."""
    from mmpack._src.store.backends import _chunk_cache, _zarr, _zarr_shards

    monkeypatch.setattr(_zarr_shards, "INNER_CHUNK_BYTES", 2 * chunk)  # uint16 tokens
    monkeypatch.setattr(_zarr_shards, "SHARD_BYTES", 2 * chunk)
    monkeypatch.setattr(_zarr, "ZSTD_LEVEL", 3)
    _chunk_cache.get_cache().clear()
    flat = (np.arange(num_tokens, dtype=np.int64) * 7919 % 60000 + 1).astype(np.uint16)
    cuts = np.arange(37, num_tokens, 37)
    store = build(tmp_path / "z", np.split(flat, cuts), backend="zarr", fsync=False)
    assert store._backend.chunk_tokens == chunk
    return store, flat


def _ranges_of(src: np.ndarray, src_starts: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    assert src_starts.dtype == np.int64 and src_starts.shape == lengths.shape
    return [src[a : a + n].tolist() for a, n in zip(src_starts.tolist(), lengths.tolist())]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_zarr_read_ranges_match_the_flat_tokens(tmp_path_factory, data):
    """Any batch of ranges (empty, inside one chunk, across several chunks, repeated, unsorted),
    read cold and then from the cache, equals slicing the flat tokens (the naive reference)."""
    with pytest.MonkeyPatch.context() as mp:
        store, flat = _small_chunk_zarr(tmp_path_factory.mktemp("z"), mp)
    n = flat.size
    pairs = data.draw(
        st.lists(
            st.integers(0, n).flatmap(
                lambda s: st.tuples(st.just(s), st.integers(0, min(n - s, 300)))
            ),
            max_size=20,
        )
    )
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    lengths = np.array([k for _, k in pairs], dtype=np.int64)
    expected = [flat[s : s + k].tolist() for s, k in pairs]
    for _ in range(2):  # cold, then every chunk cached
        src, src_starts = store.read_ranges(starts, lengths)
        assert src.dtype == store.dtype
        assert _ranges_of(src, src_starts, lengths) == expected


def test_zarr_cached_chunks_of_a_replaced_store_are_refused(tmp_path, monkeypatch):
    store, flat = _small_chunk_zarr(tmp_path, monkeypatch)
    starts, lengths = np.array([0, 300], np.int64), np.array([50, 50], np.int64)
    store.read_ranges(starts, lengths)  # cached
    new = build(tmp_path / "z", [flat[::-1]], backend="zarr", overwrite=True, fsync=False)
    with pytest.raises(StateMismatchError, match="replaced"):
        store.read_ranges(starts, lengths)
    src, at = new.read_ranges(starts, lengths)  # the new store never sees the old chunks
    assert _ranges_of(src, at, lengths) == [flat[::-1][:50].tolist(), flat[::-1][300:350].tolist()]
