"""Joined stores (mmpack._src.joins.parts, mmpack._src.joins.join): every read equals the single store built
from the parts' documents in order; the manifest is small, refuses changed or missing parts and is
published atomically.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/joins/test_parts.py``
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _joins import corpus as _corpus
from _joins import parts_on_disk as _parts_on_disk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import Mixture, PackedDataset, WindowDataset
from mmpack._src.joins.parts import JOIN_FILE, JoinedStore
from mmpack.errors import (
    FormatError,
    StateMismatchError,
    StoreExistsError,
    StoreNotFoundError,
)

_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

doc_st = st.lists(st.integers(0, 70_000), max_size=25)
part_st = st.one_of(
    st.just([]), st.lists(doc_st, min_size=1, max_size=1), st.lists(doc_st, max_size=8)
)
parts_st = st.lists(part_st, min_size=1, max_size=5)


def _make(tmp, parts, *, dtype_of=lambda k: None, backend_of=lambda k: "memmap"):
    """Build the parts, their join, and the single store of all their documents in order."""
    tmp.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, docs in enumerate(parts):
        p = tmp / f"part{k}"
        mmpack.build(
            p, [np.array(d, dtype=np.int64) for d in docs], dtype=dtype_of(k), backend=backend_of(k)
        )
        paths.append(p)
    everything = [np.array(d, dtype=np.int64) for docs in parts for d in docs]
    single = mmpack.build(tmp / "single", everything)
    joined = mmpack.join(paths, tmp / "joined")
    return single, joined, paths


@pytest.fixture
def fresh(tmp_path):
    counter = [0]

    def next_dir():
        counter[0] += 1
        d = tmp_path / f"case{counter[0]}"
        return d

    return next_dir


@_SETTINGS
@given(
    parts=parts_st,
    seqlen=st.integers(1, 12),
    stride=st.integers(1, 14),
    eot=st.sampled_from([None, 7]),
    labels=st.booleans(),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_every_window_equals_the_single_store(
    fresh, parts, seqlen, stride, eot, labels, drop_last, data
):
    single, joined, _ = _make(fresh(), parts)
    assert joined.tokens is None and isinstance(joined, JoinedStore)
    assert len(joined) == len(single) and joined.num_tokens == single.num_tokens
    np.testing.assert_array_equal(joined.offsets, single.offsets)
    a = WindowDataset(single, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last)
    b = WindowDataset(joined, seqlen, stride, eot=eot, labels=labels, drop_last=drop_last)
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=f"window {i} {key}")
    if len(a):
        idx = data.draw(st.lists(st.integers(0, len(a) - 1), max_size=20))
        x, y = a.__getitems__(idx), b.__getitems__(idx)
        for r in range(len(idx)):
            for key in x[r]:
                np.testing.assert_array_equal(x[r][key], y[r][key])


@_SETTINGS
@given(parts=parts_st, data=st.data())
def test_read_ranges_across_part_boundaries(fresh, parts, data):
    single, joined, _ = _make(fresh(), parts, dtype_of=lambda k: "uint32" if k == 1 else None)
    n = single.num_tokens
    flat = single.read_range(0, n)
    ranges = data.draw(
        st.lists(
            st.integers(0, n).flatmap(lambda s: st.tuples(st.just(s), st.integers(0, n - s))),
            max_size=12,
        )
    )
    starts = np.array([s for s, _ in ranges], dtype=np.int64)
    lengths = np.array([m for _, m in ranges], dtype=np.int64)
    src, at = joined.read_ranges(starts, lengths)
    assert src.dtype == joined.dtype
    for s, m, a in zip(starts, lengths, at):
        np.testing.assert_array_equal(src[a : a + m], flat[s : s + m])
    for j in range(len(single)):
        np.testing.assert_array_equal(joined[j], single[j])


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parts=parts_st,
    seqlen=st.integers(2, 30),
    eot=st.sampled_from([None, 3]),
    long_docs=st.sampled_from(["split", "truncate"]),
)
def test_every_packed_row_equals_the_single_store(fresh, parts, seqlen, eot, long_docs):
    single, joined, _ = _make(fresh(), parts)
    a = PackedDataset(single, seqlen, eot=eot, long_docs=long_docs)
    b = PackedDataset(joined, seqlen, eot=eot, long_docs=long_docs)
    assert len(a) == len(b)
    if len(a):
        x, y = a.__getitems__(list(range(len(a)))), b.__getitems__(list(range(len(a))))
        for r in range(len(a)):
            for key in x[r]:
                np.testing.assert_array_equal(x[r][key], y[r][key])
        for i in range(len(a)):
            for key, value in a[i].items():
                np.testing.assert_array_equal(value, b[i][key])
    assert (joined.path / "cache").is_dir() or len(a) == 0  # the plan is cached in the join


def test_zarr_and_nested_parts(tmp_path):
    docs = _corpus()
    paths = _parts_on_disk(
        tmp_path, docs, [0, 20, 35, 60], backend_of=lambda k: "zarr" if k == 1 else "memmap"
    )
    inner = mmpack.join(paths[:2], tmp_path / "inner")
    outer = mmpack.join([inner, paths[2]], tmp_path / "outer")
    single = mmpack.build(tmp_path / "single", docs)
    a, b = WindowDataset(single, 33, eot=9), WindowDataset(outer, 33, eot=9)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i]["input_ids"], b[i]["input_ids"])
    assert outer.verify()["parts"] == 2


def test_mixture_sampler_and_pickle(tmp_path):
    docs = _corpus()
    paths = _parts_on_disk(tmp_path, docs, [0, 30, 60])
    joined = mmpack.join(paths, tmp_path / "j")
    single = mmpack.build(tmp_path / "single", docs)
    mix_a = Mixture([WindowDataset(single, 16), WindowDataset(single, 16, 5)], [0.5, 0.5], seed=3)
    mix_b = Mixture([WindowDataset(joined, 16), WindowDataset(joined, 16, 5)], [0.5, 0.5], seed=3)
    assert len(mix_a) == len(mix_b)
    for i in range(min(len(mix_a), 50)):
        np.testing.assert_array_equal(mix_a[i]["input_ids"], mix_b[i]["input_ids"])
    view = pickle.loads(pickle.dumps(WindowDataset(joined, 16, eot=1)))
    assert isinstance(view.store, JoinedStore)
    np.testing.assert_array_equal(
        view[3]["input_ids"], WindowDataset(single, 16, eot=1)[3]["input_ids"]
    )


def test_dataloader_workers(tmp_path):
    import torch

    from mmpack.torch import collate

    docs = _corpus()
    joined = mmpack.join(_parts_on_disk(tmp_path, docs, [0, 10, 60]), tmp_path / "j")
    single = mmpack.build(tmp_path / "single", docs)
    loader = torch.utils.data.DataLoader(
        WindowDataset(joined, 16), batch_size=4, num_workers=1, collate_fn=collate
    )
    expected = WindowDataset(single, 16)
    rows = torch.cat([b["input_ids"] for b in loader]).numpy()
    np.testing.assert_array_equal(
        rows, np.stack([expected[i]["input_ids"] for i in range(len(expected))])
    )


def test_changed_missing_and_corrupt_parts_are_refused(tmp_path):
    docs = _corpus()
    paths = _parts_on_disk(tmp_path, docs, [0, 30, 60])
    mmpack.join(paths, tmp_path / "j")
    view = pickle.dumps(mmpack.open(tmp_path / "j"))
    # a part rebuilt with other content: refused by fingerprint, at open and at unpickling
    mmpack.build(paths[1], docs[30:59], overwrite=True)
    with pytest.raises(StateMismatchError, match="part 1"):
        mmpack.open(tmp_path / "j")
    with pytest.raises(StateMismatchError):
        pickle.loads(view)
    mmpack.build(paths[1], docs[30:60], overwrite=True)  # the same content again: accepted
    assert len(mmpack.open(tmp_path / "j")) == 60
    # a part whose bytes changed in place: the fingerprint cannot see it, verify does
    tokens = paths[0] / "tokens.bin"
    raw = bytearray(tokens.read_bytes())
    raw[5] ^= 0xFF
    tokens.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="part 0"):
        mmpack.open(tmp_path / "j").verify()
    # a missing part
    shutil.move(paths[0], tmp_path / "elsewhere")
    with pytest.raises(StoreNotFoundError, match="part 0"):
        mmpack.open(tmp_path / "j")


def test_append_publishes_a_new_manifest(tmp_path):
    docs = _corpus(90)
    paths = _parts_on_disk(tmp_path, docs, [0, 30, 60, 90])
    j = mmpack.join(paths[:2], tmp_path / "j")
    old_file = j.meta["offsets"]["file"]
    old_view = WindowDataset(j, 8)
    before = [old_view[i]["input_ids"].copy() for i in range(len(old_view))]
    with pytest.raises(StoreExistsError, match="append"):
        mmpack.join(paths[2:], tmp_path / "j")
    j2 = mmpack.join(paths[2:], tmp_path / "j", append=True)
    assert len(j2) == 90 and j2.fingerprint != j.fingerprint
    assert not (tmp_path / "j" / old_file).exists()
    for i, row in enumerate(before):  # the reader that opened the old join still reads it
        np.testing.assert_array_equal(old_view[i]["input_ids"], row)
    single = mmpack.build(tmp_path / "single", docs)
    np.testing.assert_array_equal(j2.offsets, single.offsets)
    a, b = WindowDataset(single, 8, eot=2), WindowDataset(mmpack.open(tmp_path / "j"), 8, eot=2)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i]["input_ids"], b[i]["input_ids"])
    j3 = mmpack.join(paths[:1], tmp_path / "j", overwrite=True)
    assert len(j3) == 30 and all(p.exists() for p in paths)  # parts are never deleted


def test_bad_arguments(tmp_path):
    docs = _corpus()
    paths = _parts_on_disk(tmp_path, docs, [0, 30, 60])
    with pytest.raises(ValueError, match="empty"):
        mmpack.join([], tmp_path / "j")
    with pytest.raises(TypeError, match="list"):
        mmpack.join(str(paths[0]), tmp_path / "j")
    with pytest.raises(StoreExistsError, match="not a joined store"):
        mmpack.join(paths[:1], paths[1], overwrite=True)
    with pytest.raises(StoreNotFoundError):
        mmpack.join(paths, tmp_path / "nothing", append=True)
    with pytest.raises(StoreNotFoundError):
        mmpack.join([tmp_path / "nope"], tmp_path / "j")
    mmpack.join(paths, tmp_path / "j")
    with pytest.raises(ValueError, match="itself"):
        mmpack.join([tmp_path / "j"], tmp_path / "j", append=True)
    assert sorted(os.listdir(tmp_path)) == ["j", "p0", "p1"]  # nothing half-written left
    manifest = tmp_path / "j" / JOIN_FILE
    raw = json.loads(manifest.read_text())
    raw["parts"][0]["num_docs"] += 1
    manifest.write_text(json.dumps(raw))
    with pytest.raises(FormatError):
        mmpack.open(tmp_path / "j")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "mmpack", *map(str, args)],
        capture_output=True,
        check=False,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def test_cli_join_info_verify(tmp_path):
    docs = _corpus()
    paths = _parts_on_disk(tmp_path, docs, [0, 20, 40, 60])
    r = _cli("join", paths[0], paths[1], "-o", tmp_path / "j")
    assert r.returncode == 0, r.stderr
    assert "2 parts" in r.stdout
    r = _cli("join", paths[2], "-o", tmp_path / "j")
    assert r.returncode == 1 and "--append" in r.stderr and "Traceback" not in r.stderr
    r = _cli("join", paths[2], "-o", tmp_path / "j", "--append")
    assert r.returncode == 0, r.stderr
    r = _cli("verify", tmp_path / "j")
    assert r.returncode == 0 and "3 parts" in r.stdout, r.stdout + r.stderr
    r = _cli("info", tmp_path / "j")
    assert r.returncode == 0 and "60" in r.stdout and "parts" in r.stdout, r.stdout + r.stderr


def test_streaming_packer_reads_a_join(tmp_path):
    docs = _corpus(80)
    joined = mmpack.join(_parts_on_disk(tmp_path, docs, [0, 0, 25, 26, 80]), tmp_path / "j")
    single = mmpack.build(tmp_path / "single", docs)
    out = []
    for store in (single, joined):
        packer = mmpack.StreamingPacker(
            store, batch_size=4, seqlen=48, buffer_size=16, mode="causal", drop_last=False
        )
        out.append(
            [
                b["input_ids"].numpy()
                if hasattr(b["input_ids"], "numpy")
                else np.asarray(b["input_ids"])
                for b in packer
            ]
        )
    assert len(out[0]) == len(out[1]) > 0
    for x, y in zip(*out):
        np.testing.assert_array_equal(x, y)


def test_readers_racing_appends_see_whole_joins(tmp_path):
    import threading

    docs = _corpus(120, seed=5)
    cuts = list(range(0, 121, 10))
    paths = _parts_on_disk(tmp_path, docs, cuts)
    single = mmpack.build(tmp_path / "single", docs)
    mmpack.join(paths[:1], tmp_path / "j")
    valid = {c: single.offsets[: c + 1] for c in cuts[1:]}
    errors, opened, stop = [], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                j = mmpack.open(tmp_path / "j")
                n = len(j)
                assert n in valid, n
                np.testing.assert_array_equal(j.offsets, valid[n])
                np.testing.assert_array_equal(
                    j.read_range(0, j.num_tokens), single.read_range(0, j.num_tokens)
                )
                opened.append(n)
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for p in paths[1:]:
        mmpack.join([p], tmp_path / "j", append=True)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(mmpack.open(tmp_path / "j")) == 120 and opened
    assert len(list((tmp_path / "j").glob("offsets-*.bin"))) == 1  # old offsets files removed
