"""The on-disk format: dtypes, block checksums, metadata validation, atomic JSON writes."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmpack._src.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    TOKEN_DTYPES,
    StoreMeta,
    StripeChecksum,
    normalize_token_dtype,
    smallest_token_dtype,
    write_json_atomic,
)
from mmpack.errors import FormatError


@pytest.mark.parametrize(
    ("max_token", "expected"),
    [
        (0, "<u1"),
        (255, "<u1"),
        (256, "<u2"),
        (65535, "<u2"),
        (65536, "<u4"),
        (2**32 - 1, "<u4"),
        (2**32, "<u8"),
        (2**64 - 1, "<u8"),
    ],
)
def test_smallest_token_dtype_boundaries(max_token, expected):
    assert smallest_token_dtype(max_token) == np.dtype(expected)
    assert smallest_token_dtype(max_token).byteorder in "<|="


def test_smallest_token_dtype_refuses_65_bits():
    with pytest.raises(ValueError, match="18446744073709551616"):
        smallest_token_dtype(2**64)


@pytest.mark.parametrize("given_dtype", [np.uint8, "uint16", ">u2", np.dtype("<u4"), "u8"])
def test_normalize_token_dtype_is_little_endian_unsigned(given_dtype):
    dt = normalize_token_dtype(given_dtype)
    assert dt in TOKEN_DTYPES
    assert dt.kind == "u" and dt.byteorder in "<|="


@pytest.mark.parametrize(
    ("bad", "exc"),
    [(np.int32, ValueError), ("float32", ValueError), (bool, ValueError), ("junk", TypeError)],
)
def test_normalize_token_dtype_refuses(bad, exc):
    with pytest.raises(exc, match="dtype"):
        normalize_token_dtype(bad)


@given(
    data=st.binary(max_size=300),
    block=st.integers(1, 64),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
def test_block_checksum_matches_one_shot_crc_per_block(data, block, cuts):
    bc = StripeChecksum(block)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for lo, hi in zip(bounds, bounds[1:]):
        bc.update(data[lo:hi])
    expected = [zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)]
    assert bc.finish() == expected


def _meta(**kw) -> StoreMeta:
    base = dict(
        backend="memmap",
        dtype=np.dtype("<u2"),
        num_docs=3,
        num_tokens=10,
        block_bytes=8,
        tokens_digests=(1, 2, 3),
        offsets_crc32=(4, 5, 6, 7),
    )
    base.update(kw)
    return StoreMeta(**base)


def test_meta_json_round_trip_and_fingerprint():
    meta = _meta()
    obj = json.loads(json.dumps(meta.to_json()))
    assert obj["format"] == FORMAT_NAME and obj["version"] == FORMAT_VERSION
    back = StoreMeta.from_json(obj, "x")
    assert back == meta and "files" not in obj
    listed = _meta(files=("tokenizer.json",))
    assert listed.to_json()["files"] == ["tokenizer.json"]
    assert StoreMeta.from_json(listed.to_json(), "x") == listed
    assert listed.fingerprint == meta.fingerprint  # the files a build wrote are not content
    assert len(meta.fingerprint) == 16 and int(meta.fingerprint, 16) >= 0
    # the fingerprint identifies content, not the backend it is stored in
    assert _meta(backend="zarr").fingerprint == meta.fingerprint
    for change in (
        dict(num_docs=4, offsets_crc32=(4, 5, 6, 7, 8)),
        dict(tokens_digests=(1, 2, 4)),
        dict(dtype=np.dtype("<u1"), num_tokens=20),
    ):
        assert _meta(**change).fingerprint != meta.fingerprint


def _edit(path: list, value):
    obj = _meta().to_json()
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


# (edit of a valid record, text the FormatError message must contain)
BAD_META = [
    (["format"], "other-format", "format is 'other-format'"),
    (["format"], KeyError, "format is None"),
    (["version"], FORMAT_VERSION + 1, "newer mmpack"),
    (["version"], 0, "invalid format version 0"),
    (["version"], True, "invalid format version True"),
    (["version"], "1", "invalid format version '1'"),
    (["backend"], "s3", "unknown backend 's3'"),
    (["dtype"], "<i2", "unsupported token dtype"),
    (["dtype"], ">u2", "unsupported token dtype"),
    (["dtype"], KeyError, "missing or malformed"),
    (["num_docs"], -1, "num_docs must be a non-negative integer"),
    (["num_docs"], True, "num_docs must be a non-negative integer"),
    (["num_tokens"], 1.5, "num_tokens must be a non-negative integer"),
    (["num_tokens"], KeyError, "missing or malformed"),
    (["checksum", "algorithm"], "md5", "unsupported checksum record"),
    (["checksum", "block_bytes"], 0, "unsupported checksum record"),
    (["checksum", "tokens"], [1, 2], "2 tokens checksums for 20 bytes"),
    (["checksum", "offsets"], [4, 5, 6, -7], "checksum must be a non-negative integer"),
    (["checksum", "offsets"], None, "missing or malformed"),
    (["checksum", "tokens"], [1, 2, 9], "fingerprint"),
    (["fingerprint"], "0" * 16, "fingerprint"),
    (["files"], "tokenizer.json", "files must be a list of file names"),
    (["files"], ["sub/tokenizer.json"], "files must be a list of file names"),
    (["files"], [".mmpack-lock"], "files must be a list of file names"),
    (["files"], [""], "files must be a list of file names"),
    (["files"], [3], "files must be a list of file names"),
    (["files"], ["a.json", "a.json"], "files lists a name twice"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_META)
def test_meta_defects_are_format_errors(path, value, message):
    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace("*", r"\*")):
        StoreMeta.from_json(_edit(path, value), "store")


@pytest.mark.parametrize("obj", [None, [], "x", 3])
def test_meta_not_an_object(obj):
    with pytest.raises(FormatError, match="not a JSON object"):
        StoreMeta.from_json(obj, "store")


def test_write_json_atomic_leaves_only_the_file(tmp_path):
    target = tmp_path / "m.json"
    write_json_atomic(target, {"a": 1})
    write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_dtype_check_has_one_wording(tmp_path):
    from mmpack._src.formats.eos_separated import read_layout
    from mmpack._src.store.format import normalize_token_dtype

    (tmp_path / "t.bin").write_bytes(bytes(8))
    np.save(tmp_path / "t.npy", np.zeros(4, np.uint16))
    for call in (
        lambda: normalize_token_dtype("junk"),
        lambda: read_layout(tmp_path / "t.bin", "junk"),  # headerless
        lambda: read_layout(tmp_path / "t.npy", "junk"),  # .npy: was numpy's own wording
    ):
        with pytest.raises(TypeError, match=r"^dtype='junk' is not a numpy dtype$"):
            call()


def test_write_bytes_atomic_replaces_whole_and_leaves_no_temporary(tmp_path, monkeypatch):
    import os

    from mmpack._src.store.format import write_bytes_atomic

    path = tmp_path / "sub" / "f.bin"
    write_bytes_atomic(path, b"old")
    write_bytes_atomic(path, b"new!")
    assert path.read_bytes() == b"new!" and os.listdir(path.parent) == ["f.bin"]

    def fail(src, dst):
        raise OSError("replace failed")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="replace failed"):
        write_bytes_atomic(path, b"half")
    assert path.read_bytes() == b"new!" and os.listdir(path.parent) == ["f.bin"]
