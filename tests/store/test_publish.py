"""Specification of :mod:`mmpack._src.store.publish`: a build is published by swapping its
checked temporary folder into place.  ``overwrite`` never replaces a folder that is not a store
(user files, links, files added during the build), a new store failing its own open is never
swapped in, stale temporary folders are removed by their lock (not their PID or a glob), and
builds work where flock is unsupported.

Run: ``.venv/bin/python -m pytest tests/store/test_publish.py -q``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _store_folders import BACKENDS, listing

import mmpack
import mmpack._src.store.publish as P
from mmpack.errors import FormatError
from mmpack.store import StoreWriter


def _watched(docs):
    """A generator that records how many documents were taken from it."""
    taken = []

    def gen():
        for d in docs:
            taken.append(1)
            yield d

    return gen(), taken


@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_refuses_a_folder_of_user_files_before_any_work(tmp_path, backend):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    (home / "corpus").mkdir()
    docs, taken = _watched([[1, 2, 3]] * 5)
    with pytest.raises(
        FileExistsError, match=r"is not an mmpack store \(it holds corpus, notes.txt\)"
    ):
        mmpack.build(home, docs, backend=backend, overwrite=True, fsync=False)
    assert taken == []  # refused before the first document was read
    assert (home / "notes.txt").read_text() == "precious" and (home / "corpus").is_dir()
    assert listing(tmp_path) == ["home"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_refuses_a_store_holding_other_files(tmp_path, backend):
    store = mmpack.build(tmp_path / "s", [[1, 2]], backend=backend, fsync=False)
    (tmp_path / "s" / "README.txt").write_text("mine")
    with pytest.raises(
        FileExistsError, match="an mmpack store with other files .it holds README.txt"
    ):
        mmpack.build(tmp_path / "s", [[3]], backend=backend, overwrite=True, fsync=False)
    assert mmpack.open(tmp_path / "s").fingerprint == store.fingerprint
    assert (tmp_path / "s" / "README.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "kind", ["file", "symlink to a store", "symlink to a file", "dangling symlink"]
)
def test_overwrite_refuses_files_and_links_before_any_work(tmp_path, kind):
    target = tmp_path / "t"
    if kind == "file":
        target.write_text("precious")
    else:
        dest = {
            "symlink to a store": tmp_path / "store",
            "symlink to a file": tmp_path / "f",
            "dangling symlink": tmp_path / "nowhere",
        }[kind]
        if kind == "symlink to a store":
            mmpack.build(dest, [[1]], fsync=False)
        elif kind == "symlink to a file":
            dest.write_text("x")
        os.symlink(dest, target)
    before = listing(tmp_path)
    docs, taken = _watched([[1]] * 3)
    with pytest.raises(FileExistsError, match="refusing to replace it"):
        mmpack.build(target, docs, overwrite=True, fsync=False)
    assert taken == []
    assert listing(tmp_path) == before
    if kind == "file":
        assert target.read_text() == "precious"
    else:
        assert target.is_symlink()


@pytest.mark.parametrize("backend", BACKENDS)
def test_overwrite_replaces_a_store_or_an_empty_folder(tmp_path, backend):
    (tmp_path / "empty").mkdir()
    assert mmpack.build(tmp_path / "empty", [[7]], backend=backend, overwrite=True, fsync=False)[
        0
    ].tolist() == [7]
    mmpack.build(tmp_path / "s", [[1]], backend=backend, fsync=False)
    mmpack.open(tmp_path / "s")  # its packing-plan cache folder is part of a store
    (tmp_path / "s" / "cache").mkdir()
    (tmp_path / "s" / "cache" / "plan-x.mmplan").write_bytes(b"x")
    store = mmpack.build(tmp_path / "s", [[2, 3]], backend=backend, overwrite=True, fsync=False)
    assert [d.tolist() for d in store] == [[2, 3]]
    assert listing(tmp_path) == ["empty", "s"]


def test_overwrite_rechecks_the_target_at_the_swap(tmp_path, monkeypatch):
    """A user file that appears in the target during the build is not swapped away."""
    target = tmp_path / "s"
    prev = mmpack.build(target, [[1]], fsync=False)

    def docs():
        yield [5]
        (target / "added-meanwhile.txt").write_text("mine")
        yield [6]

    with pytest.raises(FileExistsError, match="added-meanwhile.txt"):
        mmpack.build(target, docs(), overwrite=True, fsync=False)
    assert mmpack.open(target).fingerprint == prev.fingerprint
    assert (target / "added-meanwhile.txt").read_text() == "mine"
    assert listing(tmp_path) == ["s"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_failing_its_own_open_is_never_swapped_in(tmp_path, backend, monkeypatch):
    """Whatever goes wrong in the writing (here: decreasing offsets, checksummed as written), the
    complete new store is opened and checked in its temporary folder before the swap."""
    target = tmp_path / "s"
    prev = mmpack.build(target, [[1, 2], [3]], backend=backend, fsync=False)
    real = StoreWriter._write_offsets

    def reversed_offsets(self, values):
        return real(self, values[::-1].copy() if values.size > 1 else values)

    monkeypatch.setattr(StoreWriter, "_write_offsets", reversed_offsets)
    with pytest.raises(FormatError, match="offsets"):
        mmpack.build(target, [[4], [5, 6], [7, 8, 9]], backend=backend, overwrite=True, fsync=False)
    assert mmpack.open(target).fingerprint == prev.fingerprint
    assert listing(tmp_path) == ["s"]


def test_builds_work_where_flock_is_unsupported(tmp_path, monkeypatch):
    """Some network file systems refuse flock (ENOLCK): the build still works, and a cleaner that
    cannot take a lock keeps the folder."""

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(P.fcntl, "flock", no_flock)
    stale = tmp_path / ".s.mmpack-tmp-999999999-abcd1234"
    stale.mkdir()
    (stale / ".mmpack-lock").touch()
    store = mmpack.build(tmp_path / "s", [[1, 2]], fsync=False)
    assert store[0].tolist() == [1, 2]
    assert listing(tmp_path) == [stale.name, "s"]


_HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(60)
    """
)


def _temp_folder(parent: Path, name: str, pid: int, locked: bool) -> Path:
    folder = parent / f".{name}.mmpack-tmp-{pid}-abcd1234"
    folder.mkdir()
    if locked:
        (folder / ".mmpack-lock").touch()
    return folder


def test_live_builders_temp_folders_are_kept(tmp_path):
    """Liveness is the builder's flock on the lock file in its folder, not its PID: a folder whose
    lock another process holds is kept even under a PID that does not exist here (another PID
    namespace); one whose lock can be taken is removed even under a live PID."""
    live = _temp_folder(tmp_path, "store", 999999999, locked=True)  # PID unknown here
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(live / ".mmpack-lock")], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        dead = _temp_folder(tmp_path, "store", holder.pid, locked=True)  # live PID, free lock
        (dead / "tokens.bin").write_bytes(b"x" * 10)
        moved_aside = _temp_folder(tmp_path, "store", 999999998, locked=False)
        other = _temp_folder(tmp_path, "other", 999999997, locked=True)  # another target's
        mmpack.build(tmp_path / "store", [[1]], fsync=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["store", live.name, other.name]
        )
        assert not dead.exists() and not moved_aside.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.parametrize(
    ("name", "other"), [("a*", "abc"), ("corpus[v2]", "corpusv"), ("s?", "st"), ("x", "x.y")]
)
def test_stale_cleanup_matches_exact_names(tmp_path, name, other):
    """Target names are names, not glob patterns: building ``a*`` leaves the temporary folder of
    a build of ``abc`` alone, and ``corpus[v2]`` removes its own dead builders' folders."""
    theirs = _temp_folder(tmp_path, other, 999999999, locked=False)
    ours = _temp_folder(tmp_path, name, 999999999, locked=True)
    mmpack.build(tmp_path / name, [[1]], fsync=False)
    assert theirs.exists() and not ours.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, theirs.name])
    # and the finished store carries no lock file
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == [
        "mmpack.json",
        "offsets.bin",
        "tokens.bin",
    ]
