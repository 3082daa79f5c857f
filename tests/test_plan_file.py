"""The plan file format (mmpack.views.plan_file): format 4 records the regions and an XXH64 of
every array; a file of another format version is refused, and the cache rebuilds it."""

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
from mmpack.views.plan_file import load_plan, plan_cache_key, save_plan
from mmpack.views.plan_regions import cached_plan

ARRAYS = ["bin_ptr", "piece_doc", "piece_start", "piece_len", "region_bin", "region_doc"]


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


def _plan_and_key(region_tokens=None):
    lens = np.random.default_rng(7).integers(0, 3000, 2000)
    plan = build_plan(lens, 1024, add_eot=True, region_tokens=region_tokens)
    return plan, plan_cache_key("a" * 16, 1024, add_eot=True, region_tokens=region_tokens)


@pytest.mark.parametrize("region_tokens", [None, 100_000])
def test_format_4_records_the_regions_and_the_xxh64_of_every_array(tmp_path, region_tokens):
    plan, key = _plan_and_key(region_tokens)
    save_plan(plan, tmp_path / "p.mmplan", key)
    header, raw = _header(tmp_path / "p.mmplan")
    assert header["format"] == plan_file.PLAN_FORMAT_VERSION == 4
    assert header["plan"]["region_tokens"] == region_tokens
    assert header["stats"]["n_regions"] == plan.n_regions == (1 if region_tokens is None else 31)
    for name in ARRAYS:
        spec = header["arrays"][name]
        nbytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
        body = raw[spec["offset"] : spec["offset"] + nbytes]
        assert spec["xxh64"] == xxh64_slow(body)  # the reference, not the kernel under test
    again = load_plan(tmp_path / "p.mmplan", key)
    assert same_plan(plan, again) and again.region_tokens == region_tokens


@pytest.mark.parametrize("array", ARRAYS)
def test_a_flipped_bit_in_any_array_is_detected(tmp_path, array):
    plan, key = _plan_and_key(100_000)
    path = tmp_path / "p.mmplan"
    save_plan(plan, path, key)
    header, raw = _header(path)
    spec = header["arrays"][array]
    damaged = bytearray(raw)
    damaged[spec["offset"] + 2] ^= 0x04
    path.write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match=f"{array}.* fails its checksum \\(xxh64"):
        load_plan(path, key)


@pytest.mark.parametrize("version", [2, 3, 5])
def test_a_plan_of_another_format_is_refused_and_the_cache_rebuilds_it(tmp_path, version):
    store = FakeStore(tmp_path, np.random.default_rng(8).integers(0, 4000, 20_000))
    first = cached_plan(store, 2048, add_eot=True)
    (path,) = (tmp_path / "cache").iterdir()
    header, _ = _header(path)
    header["format"] = version
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match=f"plan format {version}, this mmpack reads 4"):
        load_plan(path)
    with pytest.warns(UserWarning, match="rebuilding the packing plan"):
        again = cached_plan(store, 2048, add_eot=True)
    assert same_plan(first, again)
    assert _header(path)[0]["format"] == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten plan is used as it is
        assert same_plan(first, cached_plan(store, 2048, add_eot=True))


def test_regions_that_do_not_cut_the_plan_in_order_are_refused(tmp_path):
    plan, key = _plan_and_key(100_000)
    path = tmp_path / "p.mmplan"
    save_plan(plan, path, key)
    header, _ = _header(path)
    header["stats"]["n_regions"] += 1  # the region arrays no longer match the statistics
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match="inconsistent"):
        load_plan(path, key)


def test_the_cache_key_names_every_parameter_once():
    key = plan_cache_key("f" * 16, 2048, add_eot=True, algorithm="online", lookahead=3)
    assert key == {
        "format": 4,
        "fingerprint": "f" * 16,
        "seqlen": 2048,
        "add_eot": True,
        "long_docs": "split",
        "algorithm": "online",
        "lookahead": 3,
        "region_tokens": None,
    }
    with pytest.raises(TypeError, match="add_eot must be a bool"):
        plan_cache_key("f" * 16, 2048, add_eot=1)


def test_the_cache_key_and_path_include_region_tokens_with_auto_resolved():
    def key(r):
        return plan_cache_key("f" * 16, 512, add_eot=True, region_tokens=r)

    assert key("auto")["region_tokens"] == 2048 * 512 == key(2048 * 512)["region_tokens"]
    assert plan_file.plan_path("c", key("auto")) == plan_file.plan_path("c", key(2048 * 512))
    paths = {plan_file.plan_path("c", key(r)) for r in (None, 1, 1000, "auto")}
    assert len(paths) == 4
    for bad, err, msg in [
        (0, ValueError, "region_tokens must be >= 1"),
        ("big", ValueError, "region_tokens must be an integer >= 1, 'auto' or None, got 'big'"),
        (1.5, TypeError, "region_tokens"),
        (True, TypeError, "region_tokens"),
    ]:
        with pytest.raises(err, match=msg):
            key(bad)


def test_cached_plans_of_two_region_sizes_live_side_by_side(tmp_path):
    store = FakeStore(tmp_path, np.random.default_rng(9).integers(0, 4000, 5_000))
    a = cached_plan(store, 1024, add_eot=True, region_tokens=50_000)
    b = cached_plan(store, 1024, add_eot=True, region_tokens=None)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert a.n_regions > 1 and b.n_regions == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same_plan(a, cached_plan(store, 1024, add_eot=True, region_tokens=50_000))
