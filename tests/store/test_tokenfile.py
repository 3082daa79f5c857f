"""Token checksums and the build's one-pass token file: builds record XXH64 (the only token
checksum read: a record naming another, such as the unreleased CRC-32 option's, is refused),
``mmpack verify`` finds a flipped byte, and the token file's widening, rollback across written
blocks and chunked gathering keep exactly the good documents.

Run: ``pytest tests/store/test_tokenfile.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from _paths import DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import xxh64_slow

import mmpack
import mmpack._src.store.writer as W
from mmpack.errors import FormatError
from mmpack.store import StoreWriter

FIXTURE = DATA / "store_crc32_v1"
# A store whose token blocks are CRC-32 (STRIPE_BYTES=64): two token blocks, one offsets block.
FIXTURE_DOCS = [[5, 6, 7], [], [300, 1, 2, 65535], list(range(40)), [9]]


def _verify_cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mmpack", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------ XXH64 only
def test_a_store_whose_token_checksum_is_not_xxh64_is_refused_naming_it(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "old")
    with pytest.raises(FormatError, match="unsupported checksum record 'crc32'.*'xxh64'"):
        mmpack.open(tmp_path / "old")
    res = _verify_cli(tmp_path / "old")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "'crc32'" in res.stderr


def test_verify_finds_a_flipped_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "STRIPE_BYTES", 64)
    mmpack.build(tmp_path / "s", FIXTURE_DOCS, fsync=False)
    assert json.loads((tmp_path / "s" / "mmpack.json").read_text())["checksum"]["algorithm"] == (
        "xxh64"
    )
    res = _verify_cli(tmp_path / "s")
    assert res.returncode == 0 and ": ok, 3 checksum blocks" in res.stdout, res.stderr
    _flip(tmp_path / "s" / "tokens.bin", 70)  # token block 1
    res = _verify_cli(tmp_path / "s")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "tokens stripe 1 (bytes 64..96) fails its checksum" in res.stderr
    assert "(xxh64: stored" in res.stderr
    with pytest.raises(FormatError, match="tokens stripe 1"):
        mmpack.open(tmp_path / "s", verify_reads=True)[3]


def test_builds_record_xxh64_tokens_and_crc32_offsets(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "STRIPE_BYTES", 64)
    new = mmpack.build(tmp_path / "new", FIXTURE_DOCS, fsync=False)
    raw = (tmp_path / "new" / "tokens.bin").read_bytes()
    assert raw == (FIXTURE / "tokens.bin").read_bytes()  # same bytes, other checksum
    meta = new.meta["checksum"]
    assert meta["algorithm"] == "xxh64"
    assert meta["tokens"] == [xxh64_slow(raw[:64]), xxh64_slow(raw[64:])]
    offsets = (tmp_path / "new" / "offsets.bin").read_bytes()
    assert meta["offsets"] == [zlib.crc32(offsets)]  # the offsets are CRC-32
    assert new.fingerprint == "d49f2b73275d800d"  # the algorithm is part of the fingerprint


def test_the_checksum_option_is_gone_and_other_kinds_are_refused(tmp_path):
    with pytest.raises(TypeError, match="checksum"):
        StoreWriter(tmp_path / "s", checksum="crc32")  # type: ignore[call-arg]
    shutil.copytree(FIXTURE, tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "mmpack.json").read_text())
    meta["checksum"]["algorithm"] = "md5"
    del meta["fingerprint"]
    (tmp_path / "s" / "mmpack.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="unsupported checksum record 'md5'"):
        mmpack.open(tmp_path / "s")


# ------------------------------------------------------------------------ the token file
def test_add_batch_refused_after_completing_blocks_leaves_the_store_as_before(
    tmp_path, monkeypatch
):
    """A bad token far into a batch: the blocks the batch completed are taken back (the file
    is truncated and the partial block read back), so later documents and checksums are right."""
    monkeypatch.setattr(W, "STRIPE_BYTES", 64)
    with StoreWriter(tmp_path / "s", fsync=False) as w:
        w.add_batch(np.arange(10, dtype=np.uint16) + 300, [4, 6])  # 20 bytes: block partly full
        bad = np.arange(200, dtype=np.int64)
        bad[150] = -5
        with pytest.raises(ValueError, match="document 3 has a negative token -5 at position 50"):
            w.add_batch(bad, [100, 100])
        w.add_many([np.arange(40, dtype=np.uint16), [7]])
    store = w.store
    assert store is not None
    assert [d.tolist() for d in store] == [
        list(range(300, 304)),
        list(range(304, 310)),
        list(range(40)),
        [7],
    ]
    assert store.meta["dtype"] == "<u2"
    store.verify()


def test_a_bad_document_after_written_blocks_keeps_the_good_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "STRIPE_BYTES", 64)
    docs = [np.arange(j, j + 30, dtype=np.uint32) for j in range(6)]  # u1 -> widened? no: <= 35
    with StoreWriter(tmp_path / "s", fsync=False) as w:
        with pytest.raises(ValueError, match="document 6 has a token 9223372036854775808"):
            w.add_many([*docs, np.array([1, 2**63], dtype=np.uint64), [99]])
    assert [d.tolist() for d in w.store] == [d.tolist() for d in docs]
    assert w.store.meta["dtype"] == "|u1"  # never widened for the refused document
    w.store.verify()


def test_widening_rewrites_the_written_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "STRIPE_BYTES", 64)
    docs = [list(range(100)), [300], list(range(50)), [70000, 2], [2**40]]
    store = mmpack.build(tmp_path / "s", docs, fsync=False, buffer_tokens=4)
    assert store.meta["dtype"] == "<u8"
    assert [d.tolist() for d in store] == docs
    assert store.verify()["blocks"] == -(-sum(map(len, docs)) * 8 // 64) + 1
    assert not list((tmp_path / "s").glob("*.widen"))


@pytest.mark.parametrize("source", ["list", "generator"])
def test_mixed_chunks_keep_order_and_values(tmp_path, source):
    """Arrays of several dtypes, strided views, lists, tuples, tensors and a memmap in one
    chunk: the fast path takes the plain arrays, the rest goes document by document."""
    import torch

    backing = np.memmap(tmp_path / "m", dtype=np.int32, mode="w+", shape=(4,))
    backing[:] = [4, 3, 2, 1]
    docs = [
        np.array([1, 2, 3], dtype=np.uint16),
        np.arange(10, dtype=np.uint16)[::3],
        [5, 6],
        np.array([7], dtype=np.int64),
        (8, 9),
        torch.tensor([10, 11]),
        np.array([], dtype=np.uint16),
        backing,
        np.array([65535], dtype=np.uint16),
    ]
    expected = [[int(v) for v in (d.tolist() if hasattr(d, "tolist") else d)] for d in docs]
    given_docs = docs if source == "list" else (d for d in docs)
    store = mmpack.build(tmp_path / "s", given_docs, fsync=False)
    assert [d.tolist() for d in store] == expected
    store.verify()


def test_a_two_dimensional_array_is_named(tmp_path):
    docs = [np.zeros(3, dtype=np.uint16), np.zeros((2, 1), dtype=np.uint16)]
    with pytest.raises(TypeError, match=r"document 1 has shape \(2, 1\)"):
        mmpack.build(tmp_path / "s", docs, fsync=False)
    with pytest.raises(TypeError, match=r"document 1 has shape \(2, 1\)"):
        mmpack.build(tmp_path / "g", (d for d in docs), fsync=False)


_doc = st.one_of(
    st.lists(st.integers(0, 2**40), max_size=40).map(lambda xs: np.array(xs, dtype=np.uint64)),
    st.lists(st.integers(0, 255), max_size=40).map(lambda xs: np.array(xs, dtype=np.uint8)),
    st.lists(st.integers(0, 70000), max_size=40).map(lambda xs: np.array(xs, dtype=np.int64)),
    st.lists(st.integers(0, 300), max_size=40),
)
_bad = st.one_of(
    st.lists(st.integers(0, 9), max_size=30).map(lambda xs: np.array([*xs, -1], dtype=np.int64)),
    st.lists(st.integers(0, 9), max_size=30).map(lambda xs: [*xs, 2**63]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), _doc, _bad), max_size=25),
    st.sampled_from([None, np.uint32]),
    st.sampled_from(["add_many", "generator", "add_batch"]),
    st.sampled_from([8, 64, 4096]),
)
def test_builds_against_the_naive_specification(items, dtype, how, block):
    """Small checksum blocks (every append crosses some), widening, refusals: the store holds
    exactly the accepted documents, in the narrowest dtype holding them (or the fixed one),
    and verifies."""
    saved = W.STRIPE_BYTES
    W.STRIPE_BYTES = block
    try:
        with tempfile.TemporaryDirectory() as tmp:
            expected: list[list[int]] = []
            with StoreWriter(Path(tmp) / "s", dtype=dtype, fsync=False, buffer_tokens=64) as w:
                for is_bad, good, bad in items:
                    doc = bad if is_bad else good
                    values = [int(v) for v in (doc.tolist() if hasattr(doc, "tolist") else doc)]
                    fits = all(0 <= v < 2**63 for v in values) and (
                        dtype is None or all(v <= np.iinfo(dtype).max for v in values)
                    )
                    if how == "add_batch":
                        call = lambda d: w.add_batch(np.asarray(d), [len(d)])  # noqa: E731
                    elif how == "generator":
                        call = lambda d: w.add_many(x for x in [d])  # noqa: E731
                    else:
                        call = lambda d: w.add_many([d])  # noqa: E731
                    if fits:
                        call(doc)
                        expected.append(values)
                    else:
                        with pytest.raises(ValueError):
                            call(doc)
            store = w.store
            assert store is not None
            assert [d.tolist() for d in store] == expected
            top = max((max(d) for d in expected if d), default=0)
            want = (
                np.dtype(dtype)
                if dtype is not None
                else mmpack._src.store.format.smallest_token_dtype(top)
            )
            assert store.meta["dtype"] == want.newbyteorder("<").str
            store.verify()
    finally:
        W.STRIPE_BYTES = saved
