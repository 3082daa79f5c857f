"""The plan file formats (mmpack.views.plan_file): format 3 digests each array with XXH64,
format-2 files (CRC-32 per array) still load, are checked, and are rewritten by the cache."""

from __future__ import annotations

import json
import struct
import warnings
import zlib

import numpy as np
import pytest
from reference import xxh64_slow
from test_plan import FakeStore, same_plan

from mmpack.errors import FormatError
from mmpack.views import plan_file
from mmpack.views.plan import build_plan
from mmpack.views.plan_file import cached_plan, load_plan, plan_cache_key, save_plan

ARRAYS = ["bin_ptr", "piece_doc", "piece_start", "piece_len"]


def _header(path):
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[8:16])
    return json.loads(raw[16 : 16 + hlen]), raw


def _rewrite_header(path, header):
    """The file with ``header`` in place of its own (same length, header CRC-32 recomputed)."""
    old, raw = _header(path)
    (hlen,) = struct.unpack("<Q", raw[8:16])
    blob = json.dumps(header).encode()
    blob = blob + b" " * (hlen - len(blob))  # JSON allows trailing blanks
    assert len(blob) == hlen
    path.write_bytes(raw[:16] + blob + struct.pack("<I", zlib.crc32(blob)) + raw[20 + hlen :])


def _plan_and_key():
    lens = np.random.default_rng(7).integers(0, 3000, 2000)
    return build_plan(lens, 1024, add_eot=True), plan_cache_key("a" * 16, 1024, add_eot=True)


def test_format_3_records_the_xxh64_of_every_array(tmp_path):
    plan, key = _plan_and_key()
    save_plan(plan, tmp_path / "p.mmplan", key)
    header, raw = _header(tmp_path / "p.mmplan")
    assert header["format"] == plan_file.PLAN_FORMAT_VERSION == 3
    for name in ARRAYS:
        spec = header["arrays"][name]
        assert "crc32" not in spec
        nbytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
        body = raw[spec["offset"] : spec["offset"] + nbytes]
        assert spec["xxh64"] == xxh64_slow(body)  # the reference, not the kernel under test
    assert same_plan(plan, load_plan(tmp_path / "p.mmplan", key))


@pytest.mark.parametrize("array", ARRAYS)
def test_a_format_2_plan_loads_and_a_flipped_bit_in_it_is_detected(tmp_path, array):
    plan, key = _plan_and_key()
    path = tmp_path / "p.mmplan"
    plan_file._write_plan(plan, path, key, 2)
    header, raw = _header(path)
    assert header["format"] == 2 and "xxh64" not in header["arrays"][array]
    assert same_plan(plan, load_plan(path, key))
    spec = header["arrays"][array]
    damaged = bytearray(raw)
    damaged[spec["offset"] + 2] ^= 0x04
    path.write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match=f"{array}.* fails its checksum \\(crc32"):
        load_plan(path, key)


def test_cached_plan_uses_a_format_2_file_and_rewrites_it_as_format_3(tmp_path):
    store = FakeStore(tmp_path, np.random.default_rng(8).integers(0, 4000, 20_000))
    first = cached_plan(store, 2048, add_eot=True)
    (path,) = (tmp_path / "cache").iterdir()
    plan_file._write_plan(first, path, plan_cache_key(store.fingerprint, 2048, add_eot=True), 2)
    assert _header(path)[0]["format"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sound format-2 plan is used, not rebuilt
        again = cached_plan(store, 2048, add_eot=True)
    assert same_plan(first, again)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]
    assert _header(path)[0]["format"] == 3
    assert same_plan(first, load_plan(path))


def test_a_digest_of_the_wrong_kind_or_an_unknown_format_is_rejected(tmp_path):
    plan, key = _plan_and_key()
    path = tmp_path / "p.mmplan"
    save_plan(plan, path, key)
    header, _ = _header(path)
    header["format"] = 2  # format 2 claims CRC-32s the header does not hold
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match="bad layout of 'bin_ptr'.*crc32"):
        load_plan(path, key)
    header["format"] = 4
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match="plan format 4, this mmpack reads \\[2, 3\\]"):
        load_plan(path, key)


def test_the_cache_key_names_every_parameter_once():
    key = plan_cache_key("f" * 16, 2048, add_eot=True, algorithm="online", lookahead=3)
    assert key == {
        "format": 3,
        "fingerprint": "f" * 16,
        "seqlen": 2048,
        "add_eot": True,
        "long_docs": "split",
        "algorithm": "online",
        "lookahead": 3,
    }
    with pytest.raises(TypeError, match="add_eot must be a bool"):
        plan_cache_key("f" * 16, 2048, add_eot=1)
