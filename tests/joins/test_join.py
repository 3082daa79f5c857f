"""Joined stores at their edges: a join that would contain itself is refused before anything is
written (and a cyclic manifest is a FormatError); thousands of parts open and read under the
common limit of 1024 open files; ``verify_reads=True`` checks every part's blocks on first read;
remote parts open with the ``storage_options`` the caller gives, never stored in the manifest.

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/joins/test_join.py``
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from _joins import corpus as _corpus
from _joins import edit_manifest as _edit_manifest
from _paths import ROOT
from _s3 import BUCKET, isolate_cache_and_env

import mmpack
from mmpack import WindowDataset
from mmpack._src.joins.parts import JOIN_FILE, JoinedStore
from mmpack.errors import FormatError


# ----------------------------------------------------------------------------- cycles
def test_a_join_that_would_contain_itself_is_refused_before_writing(tmp_path):
    docs = _corpus()
    mmpack.build(tmp_path / "p", docs[:30])
    mmpack.build(tmp_path / "q", docs[30:])
    a = mmpack.join([tmp_path / "p"], tmp_path / "A")
    mmpack.join([tmp_path / "A", tmp_path / "q"], tmp_path / "B")
    before = {f.name: f.read_bytes() for f in (tmp_path / "A").iterdir()}
    for kwargs in ({"overwrite": True}, {"append": True}):
        with pytest.raises(ValueError, match=r"part 0 .*B.* contains the join .*A.* itself"):
            mmpack.join([tmp_path / "B"], tmp_path / "A", **kwargs)
        assert {f.name: f.read_bytes() for f in (tmp_path / "A").iterdir()} == before
    # deeper: C holds B holds A
    mmpack.join([tmp_path / "B"], tmp_path / "C")
    with pytest.raises(ValueError, match=r"contains the join .*A.* itself \(.*C.*B.*A"):
        mmpack.join([tmp_path / "q", tmp_path / "C"], tmp_path / "A", overwrite=True)
    assert mmpack.open(tmp_path / "A").fingerprint == a.fingerprint
    assert len(mmpack.open(tmp_path / "B")) == 60


# ----------------------------------------------------------------------------- descriptors
_MANY_PARTS = textwrap.dedent(
    """
    import os, pickle, resource, shutil, sys
    from pathlib import Path
    import numpy as np
    import mmpack
    from mmpack import WindowDataset

    root, n, every_open = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "all"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    bases = []
    for b in range(7):  # seven distinct parts, copied round-robin (a build costs ~10 ms)
        docs = [np.arange(b * 10, b * 10 + 3), np.full(b % 3, b)]
        mmpack.build(root / f"base{b}", docs, fsync=False)
        bases.append(docs)
    paths = []
    for k in range(n):
        shutil.copytree(root / f"base{k % 7}", root / "parts" / f"p{k}")
        paths.append(root / "parts" / f"p{k}")
    joined = mmpack.join(paths, root / "j", fsync=False)
    expected = np.concatenate([d for k in range(n) for d in bases[k % 7]])
    opens = [lambda: joined, lambda: mmpack.open(root / "j", verify_reads=True)]
    if every_open:
        opens += [lambda: mmpack.open(root / "j"), lambda: pickle.loads(pickle.dumps(joined))]
    for store in (again() for again in opens):  # one at a time: each maps 2 files per part
        assert len(store) == 2 * n
        np.testing.assert_array_equal(store.read_range(0, store.num_tokens), expected)
        assert np.concatenate([store[i] for i in range(0, len(store), 97)]).size > 0
        w = WindowDataset(store, 5)
        rows = np.stack([r["input_ids"] for r in w.__getitems__(np.arange(len(w)))])
        np.testing.assert_array_equal(rows.reshape(-1), expected[: rows.size])
    assert joined.verify()["parts"] == n
    print("open fds", len(os.listdir("/proc/self/fd")))
    """
)


def _many_parts(tmp_path, n, opens):
    out = subprocess.run(
        [sys.executable, "-c", _MANY_PARTS, str(tmp_path), str(n), opens],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) < 100  # the parts hold no descriptor


def test_1500_parts_open_and_read_under_1024_open_files(tmp_path):
    _many_parts(tmp_path, 1500, "some")


@pytest.mark.slow
def test_10000_parts_open_and_read_under_1024_open_files(tmp_path):
    _many_parts(tmp_path, 10_000, "all")


def test_a_dropped_store_unmaps_its_files_at_once(tmp_path):
    """A store's mappings go with its last reference, not at the next garbage collection: the
    lazily checked offsets pages and plan chunks hold no cycle back to their owner (three joins
    of 10^4 parts alive at once would exceed the kernel's map count)."""
    import gc

    def maps():  # this test's files only: other tests' threads in the worker map files too
        return sum(
            str(tmp_path) in line for line in Path("/proc/self/maps").read_text().splitlines()
        )

    for k in range(20):
        mmpack.build(tmp_path / f"p{k}", _corpus()[k : k + 3], fsync=False)
    joined = mmpack.join([tmp_path / f"p{k}" for k in range(20)], tmp_path / "j", fsync=False)
    del joined
    gc.collect()
    gc.disable()
    try:
        for verify_reads in (False, True):
            before = maps()
            store = mmpack.open(tmp_path / "j", verify_reads=verify_reads)
            store.read_range(0, store.num_tokens)
            assert maps() >= before + 20
            del store
            assert maps() <= before
    finally:
        gc.enable()


def test_running_out_of_descriptors_names_the_limit_and_the_part(tmp_path, monkeypatch):
    import resource

    from mmpack._src.store.backends import _memmap

    docs = _corpus()
    for k in range(4):
        mmpack.build(tmp_path / f"p{k}", docs[k * 15 : (k + 1) * 15])
    mmpack.join([tmp_path / f"p{k}" for k in range(4)], tmp_path / "j")
    real, calls = _memmap.map_readonly, []

    def failing(path, dtype, count):
        calls.append(path)
        if "p2" in str(path):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real(path, dtype, count)

    monkeypatch.setattr(_memmap, "map_readonly", failing)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with pytest.raises(OSError, match=rf"part 2 \(\.\./p2\).*{soft} open files") as info:
        mmpack.open(tmp_path / "j")
    assert info.value.errno == errno.EMFILE


# ----------------------------------------------------------------------------- verify_reads
def test_verify_reads_checks_every_parts_blocks_on_first_read(tmp_path):
    docs = _corpus(90)
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"p{k}")
        mmpack.build(paths[-1], docs[k * 30 : (k + 1) * 30])
    inner = mmpack.join(paths[:2], tmp_path / "inner")
    mmpack.join([inner, paths[2]], tmp_path / "j")
    clean = mmpack.open(tmp_path / "j", verify_reads=True)
    assert clean.verify_reads and clean.tokens is None
    single = mmpack.build(tmp_path / "single", docs)
    a, b = WindowDataset(single, 16), WindowDataset(clean, 16)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i]["input_ids"], b[i]["input_ids"])
    again = pickle.loads(pickle.dumps(clean))
    assert again.verify_reads
    # one flipped byte in the second part (inside the nested join): caught on read, naming it
    raw = bytearray((paths[1] / "tokens.bin").read_bytes())
    raw[3] ^= 0x40
    (paths[1] / "tokens.bin").write_bytes(bytes(raw))
    store = mmpack.open(tmp_path / "j", verify_reads=True)
    lo = int(sum(d.size for d in docs[:30]))  # where the second part begins
    np.testing.assert_array_equal(store.read_range(0, lo), single.read_range(0, lo))
    with pytest.raises(FormatError, match=r"p1: tokens stripe 0 .* fails its checksum"):
        store.read_range(lo, lo + 5)
    with pytest.raises(FormatError, match="fails its checksum"):
        WindowDataset(mmpack.open(tmp_path / "j", verify_reads=True), 16)[len(a) // 2]
    with pytest.raises(FormatError, match="fails its checksum"):
        pickle.loads(pickle.dumps(store)).read_range(lo, lo + 5)
    # a join of memmap parts only reads from their mappings, each range checked by its part
    flat = mmpack.open(mmpack.join(paths, tmp_path / "flat").path, verify_reads=True)
    np.testing.assert_array_equal(flat.read_range(0, lo), single.read_range(0, lo))
    with pytest.raises(FormatError, match=r"p1: tokens stripe 0 .* fails its checksum"):
        flat.read_range(lo - 5, lo + 5)  # across parts 0 and 1
    # without verify_reads the flipped byte is served (the documented default)
    assert mmpack.open(tmp_path / "j").read_range(lo, lo + 5).size == 5


def test_verify_reads_checks_the_joins_own_offsets_at_open(tmp_path):
    docs = _corpus()
    mmpack.build(tmp_path / "p", docs)
    j = mmpack.join([tmp_path / "p"], tmp_path / "j")
    offsets = tmp_path / "j" / j.meta["offsets"]["file"]
    raw = bytearray(offsets.read_bytes())
    raw[8 * 20] ^= 0x01  # document 20's offset off by one (still increasing)
    offsets.write_bytes(bytes(raw))
    mmpack.open(tmp_path / "j")  # the structure still holds
    with pytest.raises(FormatError, match="global offsets stripe 0 fails its checksum"):
        mmpack.open(tmp_path / "j", verify_reads=True)


# ----------------------------------------------------------------------------- remote parts
@pytest.fixture
def _cache_home(tmp_path, monkeypatch):
    isolate_cache_and_env(tmp_path, monkeypatch)


def test_remote_parts_open_with_the_callers_storage_options(s3_server, tmp_path, _cache_home):
    docs = _corpus(80, seed=4)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/part"
    opts = s3_server.options
    mmpack.build(url, docs[:50], storage_options=opts)
    mmpack.build(tmp_path / "local", docs[50:])
    single = mmpack.build(tmp_path / "single", docs)
    remote = mmpack.open(url, storage_options=opts)
    joined = mmpack.join([remote, tmp_path / "local"], tmp_path / "j")
    by_url = mmpack.join([url, tmp_path / "local"], tmp_path / "j2", storage_options=opts)
    manifest = (tmp_path / "j" / JOIN_FILE).read_text()
    assert opts["secret_access_key"] not in manifest and opts["endpoint"] not in manifest
    with pytest.raises(OSError, match=r"part 0 \(s3://.*storage_options"):
        mmpack.open(tmp_path / "j")  # no credentials: a clear error naming the part
    reopened = mmpack.open(tmp_path / "j", storage_options=opts)
    checked = mmpack.open(tmp_path / "j", storage_options=opts, verify_reads=True)
    for store in (joined, by_url, reopened, checked, pickle.loads(pickle.dumps(reopened))):
        assert isinstance(store, JoinedStore)
        np.testing.assert_array_equal(store.read_range(0, store.num_tokens), single.tokens)
        np.testing.assert_array_equal(
            WindowDataset(store, 32)[3]["input_ids"], WindowDataset(single, 32)[3]["input_ids"]
        )
    assert mmpack.join([tmp_path / "j"], tmp_path / "outer", storage_options=opts).verify()
    appended = mmpack.join([tmp_path / "local"], tmp_path / "j", append=True, storage_options=opts)
    assert len(appended) == 80 + 30


# ----------------------------------------------------------------------------- foreign parts
def test_parts_in_other_tools_formats_reopen_with_their_options(tmp_path, monkeypatch):
    """An EOS-separated part needs its ``eos`` to be opened again: the manifest records the
    part's format and options (never its cache folder), so the join reopens, pickles and
    verifies on read."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))
    flat = np.array([5, 6, 0, 7, 0, 8, 9, 9, 0], dtype=np.uint32)
    np.save(tmp_path / "olmo.npy", flat)
    olmo = mmpack.open(tmp_path / "olmo.npy", eos=0, cache_dir=tmp_path / "mine")
    mmpack.build(tmp_path / "native", [[1, 2], [3]])
    joined = mmpack.join([olmo, tmp_path / "native"], tmp_path / "j")
    part = json.loads((tmp_path / "j" / JOIN_FILE).read_text())["parts"][0]
    assert part["format"] == "eos-separated" and part["options"] == {"eos": 0}
    for store in (
        joined,
        mmpack.open(tmp_path / "j"),
        mmpack.open(tmp_path / "j", verify_reads=True),
        pickle.loads(pickle.dumps(mmpack.open(tmp_path / "j", verify_reads=True))),
    ):
        assert [d.tolist() for d in store] == [[5, 6, 0], [7, 0], [8, 9, 9, 0], [1, 2], [3]]
    _edit_manifest(tmp_path / "j", lambda raw: raw["parts"][0].update(options=[1]))
    with pytest.raises(FormatError, match="inconsistent"):
        mmpack.open(tmp_path / "j")
