"""The sharded Zarr layout (``mmpack/_src/store/backends/_zarr.py``, ``_zarr_shards.py``): every window
and packed row equal to the memmap store's, batched reads against slicing the flat tokens,
missing or damaged shards as errors (never zeros), a tokens array of another layout refused, zstd.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/store/backends/test_zarr.py``.  Small inner chunks
and shards (monkeypatched) give many shards from few tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _contract import assert_views_equal, assert_workers_serve
from _zarr_stores import _corpus, _small
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
import mmpack._src.store.backends._zarr_shards as shards
from mmpack.errors import FormatError


def _build(path: Path, docs, **small) -> mmpack.TokenStore:
    with pytest.MonkeyPatch.context() as mp:
        _small(mp, **small)
        return mmpack.build(path, docs, backend="zarr", fsync=False)


# ----------------------------------------------------------------------------- layout
def test_sharded_layout_is_a_plain_zarr_group_with_checksums(tmp_path):
    import zarr

    docs = _corpus(0)
    store = _build(tmp_path / "z", docs)
    meta = json.loads((tmp_path / "z" / "tokens" / "zarr.json").read_text())
    (codec,) = meta["codecs"]
    assert codec["name"] == "sharding_indexed"
    assert [c["name"] for c in codec["configuration"]["codecs"]] == ["bytes", "crc32c"]
    assert [c["name"] for c in codec["configuration"]["index_codecs"]] == ["bytes", "crc32c"]
    lay = store._backend._layout
    assert lay is not None and lay.inner == 256 and lay.shard == 8192  # uint16: 512 B, 16 KiB
    assert len(list((tmp_path / "z" / "tokens" / "c").iterdir())) == lay.num_shards > 2
    group = zarr.open_group(str(tmp_path / "z"), mode="r")
    np.testing.assert_array_equal(group["tokens"][:], np.concatenate(docs))


def test_default_sizes():
    """8 KiB inner chunks and 32 MiB shards (the module docstring says why); a small array
    gets one shard just large enough."""
    assert shards.INNER_CHUNK_BYTES == 8 << 10 and shards.SHARD_BYTES == 32 << 20
    assert shards.shard_items(10**9, 2) == (4096, 16 << 20)
    assert shards.shard_items(5000, 2) == (4096, 8192)
    assert shards.shard_items(0, 8) == (1024, 1024)


# ----------------------------------------------------------------------------- contract
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), inner=st.sampled_from([256, 512, 4096]))
def test_sharded_store_equals_memmap(tmp_path_factory, seed, inner):
    tmp = tmp_path_factory.mktemp("c")
    docs = _corpus(seed, n_docs=60)
    store = _build(tmp / "z", docs, inner=inner, shard=inner * 8)
    local = mmpack.build(tmp / "m", docs, fsync=False)
    assert store.fingerprint == local.fingerprint
    np.testing.assert_array_equal(store.offsets, local.offsets)
    assert_views_equal(store, local)
    assert store.verify()["bytes"] == local.verify()["bytes"]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_read_ranges_match_the_flat_tokens(tmp_path_factory, data):
    """Any batch (empty ranges, inside one chunk, across chunks and shards, repeated,
    unsorted), read the first time (every chunk checked) and again, equals slicing."""
    tmp = tmp_path_factory.mktemp("r")
    flat = (np.arange(3000, dtype=np.int64) * 7919 % 60000 + 1).astype(np.uint16)
    store = _build(tmp / "z", np.split(flat, np.arange(37, 3000, 37)), inner=128, shard=1024)
    n = flat.size
    pairs = data.draw(
        st.lists(
            st.integers(0, n).flatmap(
                lambda s: st.tuples(st.just(s), st.integers(0, min(n - s, 900)))
            ),
            max_size=20,
        )
    )
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    lengths = np.array([k for _, k in pairs], dtype=np.int64)
    for _ in range(2):
        src, at = store.read_ranges(starts, lengths)
        assert src.dtype == store.dtype and at.dtype == np.int64
        got = [src[a : a + k].tolist() for a, k in zip(at.tolist(), lengths.tolist())]
        assert got == [flat[s : s + k].tolist() for s, k in pairs]


def test_zstd_chunks_read_the_same_through_the_cache(tmp_path):
    from mmpack._src.store.backends._chunk_cache import get_cache

    docs = _corpus(3)
    store = _build(tmp_path / "z", docs, zstd=3)
    assert store._backend._layout.zstd
    get_cache().clear()
    assert_views_equal(store, mmpack.build(tmp_path / "m", docs, fsync=False))
    assert len(get_cache()) > 0  # decoded chunks went through the process's LRU


def test_all_zero_inner_chunks_are_written(tmp_path):
    """Zarr skips chunks equal to the fill value unless told; every inner chunk must exist."""
    store = _build(tmp_path / "z", [np.zeros(5000, np.int64), [0, 0], []])
    assert store.dtype == np.uint8  # one-byte tokens: the bytes codec has no byte order
    index = store._backend._reader.indexes([0])[0]
    assert (index[:, 0] != 2**64 - 1).all()
    assert int(store.read_range(0, 5002).max()) == 0


# ----------------------------------------------------------------------------- layout
def test_a_tokens_array_of_another_layout_is_refused_at_open(tmp_path):
    """A group whose tokens are a plain chunked array (no shards, no crc32c per chunk) is not
    an mmpack store: refused at open, naming what it expects, never read unchecked."""
    import zarr

    _build(tmp_path / "z", _corpus(4))
    group = zarr.open_group(str(tmp_path / "z"), mode="r+")
    tokens = np.asarray(group["tokens"][:])
    del group["tokens"]
    plain = group.create_array("tokens", shape=tokens.shape, dtype=tokens.dtype, chunks=(1000,))
    plain[:] = tokens
    with pytest.raises(FormatError, match="not mmpack's sharded Zarr layout"):
        mmpack.open(tmp_path / "z")


# ----------------------------------------------------------------------------- damage
@pytest.mark.parametrize("array", ["tokens", "offsets"])
@pytest.mark.parametrize("damage", ["removed", "emptied", "a folder"])
def test_missing_shard_is_an_error_at_open(tmp_path, array, damage):
    docs = _corpus(5, n_docs=3000) if array == "offsets" else _corpus(5)
    _build(tmp_path / "z", docs)
    shard = tmp_path / "z" / array / "c" / "1"
    shard.unlink()
    if damage == "emptied":
        shard.write_bytes(b"")
    elif damage == "a folder":
        shard.mkdir()
    what = {"removed": "is missing", "emptied": "is empty", "a folder": "is not a regular file"}
    with pytest.raises(FormatError, match=f"{array} shard 1 .* {what[damage]}: Zarr would read"):
        mmpack.open(tmp_path / "z")


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def test_flipped_byte_in_a_shard_is_an_error_never_data(tmp_path):
    docs = _corpus(6)
    store = _build(tmp_path / "z", docs)
    inner = store._backend._layout.inner
    _flip(tmp_path / "z" / "tokens" / "c" / "0", 512 + 4 + 10)  # inside inner chunk 1
    fresh = mmpack.open(tmp_path / "z")
    np.testing.assert_array_equal(fresh.read_range(0, inner), store.read_range(0, inner))
    with pytest.raises(FormatError, match=r"tokens/c/0 inner chunk 1 fails its checksum"):
        fresh.read_range(inner, inner + 5)
    ds = mmpack.WindowDataset(fresh, 64)
    with pytest.raises(FormatError, match="fails its checksum"):
        ds.__getitems__(np.arange(len(ds)))
    with pytest.raises(FormatError):
        fresh.verify()


def test_flipped_byte_in_a_shard_index_or_truncated_shard_is_an_error(tmp_path):
    _build(tmp_path / "z", _corpus(7))
    shard = tmp_path / "z" / "tokens" / "c" / "1"
    good = shard.read_bytes()
    _flip(shard, len(good) - 20)
    store = mmpack.open(tmp_path / "z")
    lay = store._backend._layout
    with pytest.raises(FormatError, match="shard index fails its checksum"):
        store.read_range(lay.shard, lay.shard + 10)
    for cut in (len(good) // 2, len(good) // 2 + 7, 100):  # a cut at a chunk's end, or not
        shard.write_bytes(good[:cut])
        with pytest.raises(FormatError, match="shard index (fails its checksum|points past)"):
            mmpack.open(tmp_path / "z").read_range(lay.shard, lay.shard + 10)
    shard.write_bytes(good[:3])
    with pytest.raises(FormatError, match="shard index fails its checksum"):
        mmpack.open(tmp_path / "z").read_range(lay.shard, lay.shard + 10)


def test_rebuilt_store_is_refused_by_the_old_reader(tmp_path):
    from mmpack.errors import StateMismatchError

    store = _build(tmp_path / "z", _corpus(8))
    store.read_range(0, 10)
    shutil.rmtree(tmp_path / "z")
    _build(tmp_path / "z", _corpus(9))
    with pytest.raises(StateMismatchError, match="replaced"):
        store.read_ranges(np.array([0]), np.array([10]))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_fork_and_spawn(tmp_path, context):
    """Workers forked after the parent mapped and checked shards (or spawned: the store
    reopens by path) serve the memmap store's rows."""
    docs = _corpus(25)
    store = _build(tmp_path / "z", docs)
    ds = mmpack.PackedDataset(store, 64, eot=65535, pad_id=0)
    ds.__getitems__([0, 1, 2])  # the parent maps shards and marks chunks checked
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    want = mmpack.PackedDataset(local, 64, eot=65535, pad_id=0)
    assert_workers_serve(ds, want, context, seed=4)


@pytest.mark.parametrize("array", ["tokens", "offsets"])
@pytest.mark.parametrize("field", ["shard", "inner"])
def test_zero_sized_shards_or_chunks_are_refused_at_open(tmp_path, array, field):
    """A ``zarr.json`` edited to shards or inner chunks of 0 items is a FormatError naming the
    store (found by tests/test_fuzz.py: it was a ZeroDivisionError)."""
    _build(tmp_path / "z", _corpus(5))
    meta_file = tmp_path / "z" / array / "zarr.json"
    meta = json.loads(meta_file.read_text())
    if field == "shard":
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [0]
    else:
        meta["codecs"][0]["configuration"]["chunk_shape"] = [0]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=str(tmp_path / "z")):
        mmpack.open(tmp_path / "z")


@pytest.mark.parametrize("zstd", [False, True])
def test_rebuild_between_the_check_and_the_shard_mapping_is_a_state_mismatch(
    tmp_path, monkeypatch, zstd
):
    """The race CI found (tests/test_concurrency.py): the folder is swapped after a read's
    ``zarr.json`` check passed and before the shard is mapped, so the new store's shard is
    parsed with the old layout.  The reader must say "replaced", never "corrupt"."""
    from mmpack._src.store.backends import _zarr
    from mmpack.errors import StateMismatchError

    level = 3 if zstd else 0
    store = _build(tmp_path / "z", _corpus(8), zstd=level)
    real = _zarr.ZarrBackend._check_unchanged_fast
    swapped = []

    def check_then_swap(self):
        real(self)
        if not swapped:  # the rebuild lands right after the check, before the mapping
            swapped.append(True)
            with pytest.MonkeyPatch.context() as mp:  # other shard sizes, like a real rebuild
                _small(mp, inner=1024, shard=32 << 10, zstd=level)
                mmpack.build(
                    tmp_path / "z", _corpus(9), backend="zarr", overwrite=True, fsync=False
                )

    monkeypatch.setattr(_zarr.ZarrBackend, "_check_unchanged_fast", check_then_swap)
    with pytest.raises(StateMismatchError, match="replaced"):
        store.read_range(0, 10)
    assert swapped


def test_offsets_are_read_stripe_by_stripe_on_first_use(tmp_path, monkeypatch):
    """Opening reads the first and last offsets stripes only (not the whole array); a read
    fills the stripes it uses from the Zarr chunks; ``offsets`` and ``verify`` read them all."""
    import mmpack._src.store.writer as writer

    monkeypatch.setattr(writer, "STRIPE_BYTES", 16384)  # 2048 entries a stripe
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 900, size=int(k)) for k in rng.integers(0, 9, size=9000)]
    local = mmpack.build(tmp_path / "m", docs, fsync=False)
    mmpack.build(tmp_path / "z", docs, backend="zarr", fsync=False)
    store = mmpack.open(tmp_path / "z")
    loaded = store._backend._lazy._loaded
    assert loaded.size == 5 and loaded.tolist() == [True, False, False, False, True]
    assert not store.mapped_offsets[2048:8192].any()  # never read: zeros, not offsets
    np.testing.assert_array_equal(store[5000], local[5000])
    assert loaded.tolist() == [True, False, True, False, True]
    np.testing.assert_array_equal(store.offsets, local.offsets)
    assert loaded.all()
    assert mmpack.open(tmp_path / "z").verify()["blocks"] == local.verify()["blocks"]
