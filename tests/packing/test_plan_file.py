"""The plan file format (mmpack._src.packing.plan_file): format 5 records the regions and an XXH64 of
every chunk of every array, checked lazily on reopen; a file of another format version is
refused, and the cache rebuilds it."""

from __future__ import annotations

import json
import struct
import warnings
import zlib

import numpy as np
import pytest
from _plans import FakeStore, same_plan
from reference import xxh64_slow

from mmpack._src.packing import plan_file
from mmpack.errors import FormatError
from mmpack.packing import PlanSpec, build_plan, cached_plan, load_plan, plan_cache_key, save_plan

ARRAYS = [name for name, _ in plan_file.ARRAYS]


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
    return plan, plan_cache_key("a" * 16, PlanSpec(1024, add_eot=True, region_tokens=region_tokens))


@pytest.mark.parametrize("chunk", [plan_file.CHUNK_BYTES, 256])
@pytest.mark.parametrize("region_tokens", [None, 100_000])
def test_format_6_records_the_regions_and_the_xxh64_of_every_chunk(
    tmp_path, region_tokens, chunk, monkeypatch
):
    monkeypatch.setattr(plan_file, "CHUNK_BYTES", chunk)
    plan, key = _plan_and_key(region_tokens)
    save_plan(plan, tmp_path / "p.mmplan", key)
    header, raw = _header(tmp_path / "p.mmplan")
    assert header["format"] == plan_file.PLAN_FORMAT_VERSION == 6
    assert header["chunk_bytes"] == chunk
    assert header["max_bin_pieces"] == int(np.diff(plan.bin_ptr).max())
    assert header["plan"]["region_tokens"] == region_tokens
    assert header["stats"]["n_regions"] == plan.n_regions == (1 if region_tokens is None else 31)
    for name in ARRAYS:
        spec = header["arrays"][name]
        nbytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
        body = raw[spec["offset"] : spec["offset"] + nbytes]
        expected = [xxh64_slow(body[lo : lo + chunk]) for lo in range(0, nbytes, chunk)]
        assert spec["xxh64"] == expected  # the reference, not the kernel under test
    for lazy in (False, True):
        again = load_plan(tmp_path / "p.mmplan", key, lazy=lazy)
        assert same_plan(plan, again) and again.region_tokens == region_tokens
        assert again.max_bin_pieces() == header["max_bin_pieces"]


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


@pytest.mark.parametrize("version", [3, 4, 5, 7])
def test_a_plan_of_another_format_is_refused_and_the_cache_rebuilds_it(tmp_path, version):
    store = FakeStore(tmp_path, np.random.default_rng(8).integers(0, 4000, 20_000))
    first = cached_plan(store, PlanSpec(2048, add_eot=True))
    (path,) = (tmp_path / "cache").iterdir()
    header, _ = _header(path)
    header["format"] = version
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match=f"plan format {version}, this mmpack reads 6"):
        load_plan(path)
    with pytest.warns(UserWarning, match="rebuilding the packing plan"):
        again = cached_plan(store, PlanSpec(2048, add_eot=True))
    assert same_plan(first, again)
    assert _header(path)[0]["format"] == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten plan is used as it is
        assert same_plan(first, cached_plan(store, PlanSpec(2048, add_eot=True)))


def test_regions_that_do_not_cut_the_plan_in_order_are_refused(tmp_path):
    plan, key = _plan_and_key(100_000)
    path = tmp_path / "p.mmplan"
    save_plan(plan, path, key)
    header, _ = _header(path)
    header["stats"]["n_regions"] += 1  # the region arrays no longer match the statistics
    _rewrite_header(path, header)
    with pytest.raises(FormatError, match="inconsistent"):
        load_plan(path, key)


@pytest.mark.parametrize("region_tokens", [None, 100_000])
def test_a_plan_whose_region_arrays_are_empty_is_refused_as_inconsistent(tmp_path, region_tokens):
    """Region arrays of no entries (a damaged file whose chunks still match) are a
    ``FormatError``, not an ``IndexError`` from reading their first entry."""
    plan, _ = _plan_and_key(region_tokens)
    arrays = {name: np.asarray(getattr(plan, name)) for name in ARRAYS}
    plan_file._check_consistent(tmp_path / "p", arrays, plan.stats, False)  # as saved: fine
    for name in ("region_bin", "region_doc", "region_split"):
        arrays[name] = arrays[name][:0]
    with pytest.raises(FormatError, match="inconsistent"):
        plan_file._check_consistent(tmp_path / "p", arrays, plan.stats, False)


def test_the_cache_key_names_every_parameter_once():
    key = plan_cache_key("f" * 16, PlanSpec(2048, add_eot=True, algorithm="online", lookahead=3))
    assert key == {
        "format": 6,
        "fingerprint": "f" * 16,
        "seqlen": 2048,
        "add_eot": True,
        "long_docs": "split",
        "algorithm": "online",
        "lookahead": 3,
        "region_tokens": None,
    }
    with pytest.raises(TypeError, match="add_eot must be a bool"):
        plan_cache_key("f" * 16, PlanSpec(2048, add_eot=1))


def test_the_cache_key_and_path_include_region_tokens_with_auto_resolved():
    def key(r):
        return plan_cache_key("f" * 16, PlanSpec(512, add_eot=True, region_tokens=r))

    assert key("auto")["region_tokens"] == 8192 * 512 == key(8192 * 512)["region_tokens"]
    assert plan_file.plan_path("c", key("auto")) == plan_file.plan_path("c", key(8192 * 512))
    # a plan cached for the earlier default (2048 bins a region) is not found for "auto"
    assert plan_file.plan_path("c", key("auto")) != plan_file.plan_path("c", key(2048 * 512))
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
    a = cached_plan(store, PlanSpec(1024, add_eot=True, region_tokens=50_000))
    b = cached_plan(store, PlanSpec(1024, add_eot=True, region_tokens=None))
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert a.n_regions > 1 and b.n_regions == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same_plan(a, cached_plan(store, PlanSpec(1024, add_eot=True, region_tokens=50_000)))


# ------------------------------------------------------------------------------- reopen in O(1)
def _corrupt_chunk(path, array, entry):
    """Flip one bit of entry ``entry`` of ``array`` in the plan file at ``path``."""
    header, raw = _header(path)
    spec = header["arrays"][array]
    damaged = bytearray(raw)
    damaged[spec["offset"] + entry * np.dtype(spec["dtype"]).itemsize] ^= 0x04
    path.write_bytes(bytes(damaged))


def test_a_reopen_hashes_the_same_bytes_whatever_the_plan_size(tmp_path, monkeypatch):
    """Reopening a cached plan checks its header, its regions and the end chunks of each array,
    not the arrays: the bytes hashed do not grow with the plan (format 4 hashed them all)."""
    monkeypatch.setattr(plan_file, "CHUNK_BYTES", 256)
    from mmpack._src.packing import plan_pages

    hashed = []
    digest = plan_pages.stripe_digest

    def counting(data):
        hashed.append(np.asarray(data).nbytes)
        return digest(data)

    monkeypatch.setattr(plan_pages, "stripe_digest", counting)
    sizes = {}
    for n in (20_000, 200_000):
        lens = np.random.default_rng(n).integers(0, 30, n)
        plan = build_plan(lens, 1024, add_eot=True)  # one region: no region array grows
        key = plan_cache_key("b" * 16, PlanSpec(1024, add_eot=True))
        save_plan(plan, tmp_path / f"{n}.mmplan", key)
        hashed.clear()
        lazy = load_plan(tmp_path / f"{n}.mmplan", key, lazy=True)
        sizes[n] = sum(hashed)
        assert sizes[n] <= 2 * 256 * len(ARRAYS)
        assert same_plan(plan, lazy)  # (reads the arrays: checks nothing more)
        hashed.clear()
        load_plan(tmp_path / f"{n}.mmplan", key)  # lazy=False: every chunk
        assert sum(hashed) >= plan.n_pieces * 8


@pytest.mark.parametrize("array", ["bin_ptr", "piece_ref", "piece_len", "split"])
def test_a_damaged_chunk_of_a_reopened_plan_is_refused_before_a_sample_is_served(
    tmp_path, monkeypatch, array
):
    """A flipped bit in a middle chunk passes the O(1) reopen, then fails the first read of a
    bin that uses the chunk (ds[i], a batch, locate), never serving a sample from it, while
    other bins read as before; ``ds.plan`` checks every chunk; ``lazy=False`` refuses it."""
    import mmpack
    from mmpack import PackedDataset

    monkeypatch.setattr(plan_file, "CHUNK_BYTES", 256)  # 32 int64 entries a chunk
    rng = np.random.default_rng(11)
    longest = 200 if array == "split" else 20  # documents split across bins, or none
    docs = [np.full(int(n), j % 250 + 1) for j, n in enumerate(rng.integers(1, longest, 3000))]
    store = mmpack.build(tmp_path / "s", docs, fsync=False)
    ds = PackedDataset(store, 64, eot=0, region_tokens=4096)
    expected = [ds[i]["input_ids"].tolist() for i in range(len(ds))]
    (path,) = (tmp_path / "s" / "cache").iterdir()
    plan = ds.plan
    n_pieces, bin_ptr = plan.n_pieces, plan.bin_ptr.copy()
    entry = {"bin_ptr": len(ds) // 2, "split": plan.split.shape[0] // 2}.get(array, n_pieces // 2)
    _corrupt_chunk(path, array, entry)
    if array == "split":  # a bin's split entries are checked with its region's
        chunk = range(entry // 32 * 32, (entry // 32 + 1) * 32)
        rs, rb = 2 * plan.region_split, plan.region_bin
        regions = [r for r in range(plan.n_regions) if set(range(rs[r], rs[r + 1])) & set(chunk)]
        bad = {b for r in regions for b in range(rb[r], rb[r + 1])}
    elif array == "bin_ptr":
        per = 256 // 8  # the bins that read an entry of the chunk
        bad = set(range(entry // per * per - 1, (entry // per + 1) * per)) & set(range(len(ds)))
    else:
        per = 256 // np.dtype(dict(plan_file.ARRAYS)[array]).itemsize
        chunk = range(entry // per * per, (entry // per + 1) * per)
        bad = {b for b in range(len(ds)) if set(range(bin_ptr[b], bin_ptr[b + 1])) & set(chunk)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rebuild: the damage is not where a reopen looks
        again = PackedDataset(mmpack.open(tmp_path / "s"), 64, eot=0, region_tokens=4096)
    first_bad = min(bad)
    for read in (
        lambda b: again[b],
        lambda b: again.__getitems__([b]),
        lambda b: again.locate(b),
    ):
        with pytest.raises(FormatError, match=f"{array}.* fails its checksum \\(xxh64"):
            read(first_bad)
    good = [b for b in range(len(ds)) if b not in bad]
    assert good and all(again[b]["input_ids"].tolist() == expected[b] for b in good)
    batch = again.__getitems__(good)
    assert [row["input_ids"].tolist() for row in batch] == [expected[b] for b in good]
    with pytest.raises(FormatError, match="fails its checksum"):
        _ = again.plan  # the arrays whole: every chunk
    with pytest.raises(FormatError, match=f"{array}.* fails its checksum"):
        load_plan(path)


def test_a_packed_view_opens_without_reading_the_whole_index(tmp_path, monkeypatch):
    """PackedDataset over a reopened plan checks the offsets pages of the regions it reads, not
    the whole index at open (a decrease elsewhere fails only the reads of its region)."""
    import mmpack
    import mmpack._src.store.writer
    from mmpack import PackedDataset

    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 64)  # pages of 8 offsets
    mmpack.build(tmp_path / "s", [[1] * 4] * 200, fsync=False)  # 800 tokens
    ds = PackedDataset(mmpack.open(tmp_path / "s"), 16, eot=0, region_tokens=40)
    expected = [ds[i]["input_ids"].tolist() for i in range(len(ds))]
    offsets = np.fromfile(tmp_path / "s" / "offsets.bin", dtype="<i8")
    offsets[150] = offsets[149] - 1  # page 18 (entries 144..151)
    offsets.tofile(tmp_path / "s" / "offsets.bin")
    store = mmpack.open(tmp_path / "s")
    again = PackedDataset(store, 16, eot=0, region_tokens=40)  # the cached plan
    assert not store._pages.all_checked()
    plan = again._plan
    region = int(np.searchsorted(plan.region_doc, 149, side="right")) - 1
    bins = range(int(plan.region_bin[region]), int(plan.region_bin[region + 1]))
    with pytest.raises(FormatError, match="offsets decrease at document 149"):
        again[bins[0]]
    with pytest.raises(FormatError, match="offsets decrease at document 149"):
        again.__getitems__([bins[-1]])
    assert again[0]["input_ids"].tolist() == expected[0]


def test_checked_pages_check_each_page_a_read_uses_once():
    """The one rule behind the offsets' pages and a plan's chunks: the pages of every range
    (a range over 3+ pages: its middle ones too), each once; a page that fails stays unchecked."""
    from mmpack._src.store.integrity import CheckedPages

    calls, bad = [], {7}

    def check(p):
        calls.append(p)
        if p in bad:
            raise FormatError(f"page {p}")

    pages = CheckedPages(95, 10, check)  # 10 pages, the last of 5 entries
    assert pages.n_pages == 10 and not pages.all_checked()
    pages.check_ranges(np.array([3, 12, 41, 5]), np.array([4, 35, 40, 4]))  # (41, 40): empty
    assert sorted(calls) == [0, 1, 2, 3]
    pages.check_entries(0, 19)
    assert sorted(calls) == [0, 1, 2, 3]  # checked once
    with pytest.raises(FormatError, match="page 7"):
        pages.check_entries(70, 70)
    with pytest.raises(FormatError, match="page 7"):
        pages.check_all()
    bad.clear()
    pages.check_all()
    assert pages.all_checked() and sorted(calls) == [0, 1, 2, 3, 4, 5, 6, 7, 7, 7, 8, 9]


# ------------------------------------------------------------------------------- 8 bytes a piece
def test_a_plan_file_takes_at_most_12_bytes_a_document(tmp_path):
    """Issue 37: C4-like documents (lognormal lengths, a few longer than a bin) cost at most 12
    bytes each in the file (format 5: 20), and the file reads back the same pieces."""
    lens = np.random.default_rng(4).lognormal(5.48, 1.15, 200_000).astype(np.int64)
    plan = build_plan(lens, 2048, add_eot=True, region_tokens="auto")
    assert plan.split.shape[0] > 0  # some pieces start inside their document
    key = plan_cache_key("c" * 16, PlanSpec(2048, add_eot=True, region_tokens="auto"))
    save_plan(plan, tmp_path / "p.mmplan", key)
    size = (tmp_path / "p.mmplan").stat().st_size
    assert size / lens.shape[0] <= 12, size / lens.shape[0]
    assert same_plan(plan, load_plan(tmp_path / "p.mmplan", key))


def test_a_region_too_large_for_its_references_is_refused(monkeypatch):
    """A region of more documents (or pieces) than a uint32 reference reaches is refused with a
    ValueError naming the region and the way out, before anything is packed."""
    from mmpack._src.packing import plan_pieces

    monkeypatch.setattr(plan_pieces, "MAX_REGION_ITEMS", 3)
    with pytest.raises(ValueError, match="plan region 0 holds 5 documents .* region_tokens"):
        build_plan(np.ones(5, dtype=np.int64), 8, add_eot=True)
    build_plan(np.ones(3, dtype=np.int64), 8, add_eot=True)  # at the bound
    plan = build_plan(np.ones(6, dtype=np.int64), 8, add_eot=True, region_tokens=3)
    assert plan.n_regions == 2


def test_pieces_decode_alike_whole_and_bin_by_bin():
    """A bin's pieces (one binary search over the regions) are the whole decode's, split entries
    are relative to their region, and a reference past its region's entries is refused."""
    import dataclasses

    from mmpack._src.kernels.packed_rows import SPLIT_FLAG

    lens = np.random.default_rng(6).integers(0, 300, 3000)
    plan = build_plan(lens, 64, add_eot=True, region_tokens=5000)
    assert plan.n_regions > 10 and plan.split.shape[0] > 0
    plan.validate(lens)
    flat = [
        (int(d), int(s), int(n))
        for d, s, n in zip(plan.piece_doc, plan.piece_start, plan.piece_len)
    ]
    assert sum((plan.pieces(b) for b in range(plan.n_bins)), []) == flat
    assert (plan.split[0::2] < np.diff(plan.region_doc).max()).all()  # relative documents
    r = int(np.argmax(np.diff(plan.region_split) > 0))  # a region with split entries
    p = int(plan.bin_ptr[plan.region_bin[r]])
    ref = plan.piece_ref.copy()
    ref[p] = SPLIT_FLAG + int(plan.region_split[r + 1] - plan.region_split[r])  # one past
    bad = dataclasses.replace(plan, piece_ref=ref)
    with pytest.raises(FormatError, match="split entry outside its region"):
        bad.validate(lens)
    with pytest.raises(FormatError, match="split entry outside its region"):
        bad.pieces(int(plan.region_bin[r]))
