"""Corrupt stores are detected, interrupted builds are harmless.

Detection on open (cheap, always): file sizes against the metadata, the offsets invariants
(start at 0, never decrease, end at ``num_tokens``), the format name and version, malformed JSON,
missing files.  Detection on demand: ``verify()`` recomputes the block checksums and names the
block and byte range of a flipped byte.  (``tests/test_fuzz.py`` does the same with random
corruptions.)

Interrupted builds: a forked builder is SIGKILLed at deterministic points (``KILL_POINTS``:
while buffering, in a flush, while widening the dtype, in the Zarr conversion, in the metadata
write, right before and right after the rename), fresh and over an existing store, and a
subprocess builder is killed after random delays.  Afterwards the target is either absent, the
complete previous store (same fingerprint, verifies), or, for kill points after the rename, the
complete new store — never part of one; and the next build of the same target removes the
temporary folders the dead builder left.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _paths import ROOT

import mmpack
import mmpack._src.store.backends._zarr as zarr_backend
import mmpack._src.store.backends._zarr_shards as shards
import mmpack._src.store.format
import mmpack._src.store.publish
import mmpack._src.store.writer
from mmpack.errors import FormatError, StoreNotFoundError
from mmpack.store import StoreWriter

BACKENDS = ["memmap", "zarr"]


def _docs(seed: int, n: int = 40, high: int = 200) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, int(rng.integers(0, 30))) for _ in range(n)]


def _rewrite_offsets(path: Path, backend: str, edit: Callable[[np.ndarray], None]) -> None:
    """Rewrite the offsets array in place, keeping its size (and the metadata) unchanged."""
    if backend == "memmap":
        arr = np.fromfile(path / "offsets.bin", dtype="<i8")
        edit(arr)
        arr.tofile(path / "offsets.bin")
    else:
        import zarr

        arr = zarr.open_group(str(path), mode="r+")["offsets"]
        values = np.asarray(arr[:])
        edit(values)
        arr[:] = values


# =================================================================================== on open
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.__setitem__(0, 1), r"offsets\[0\] is 1, expected 0"),
        (lambda o: o.__setitem__(5, o[4] - 1), r"offsets decrease at document 4"),
        (lambda o: o.__setitem__(-1, o[-1] - 1), r"offsets end at \d+ but the store holds"),
        (lambda o: o.__setitem__(-1, o[-1] + 1), r"offsets end at \d+ but the store holds"),
    ],
)
def test_open_checks_offsets(tmp_path, backend, edit, message):
    mmpack.build(tmp_path / "s", _docs(1, high=60000), backend=backend)
    _rewrite_offsets(tmp_path / "s", backend, edit)
    with pytest.raises(FormatError, match=message):
        mmpack.open(tmp_path / "s")


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_reads_the_offsets_ends_and_each_page_on_first_use(tmp_path, monkeypatch, backend):
    """An open checks the offsets' ends and first and last pages, not every page (O(1)); a
    decrease on another page is refused by the first read that uses that page, by the whole
    index (``store.offsets``) and by ``verify()``, and reads elsewhere are served."""
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 64)  # pages of 8 entries
    mmpack.build(tmp_path / "s", [[j % 7 + 1] * (j % 5 + 1) for j in range(60)], backend=backend)
    _rewrite_offsets(tmp_path / "s", backend, lambda o: o.__setitem__(21, o[20] - 1))
    store = mmpack.open(tmp_path / "s")  # page 2 (entries 16..23) is not read
    assert store[3].tolist() == [4] * 4 and store[40].tolist() == [6] * 1
    for read in (lambda: store[19], lambda: store[23], lambda: store.offsets, store.verify):
        with pytest.raises(FormatError, match=r"offsets decrease at document 20"):
            read()
    assert store[5].tolist() == [6]  # other pages still serve
    with pytest.raises(FormatError, match=r"offsets decrease at document 20"):
        _ = mmpack.open(tmp_path / "s").doc_lens


def test_verify_reads_checksums_each_offsets_page_on_first_use(tmp_path, monkeypatch):
    """With ``verify_reads`` an offsets page that still increases but fails its checksum is
    refused by the first read that uses it; the open checks only the first and last pages."""
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 64)
    mmpack.build(tmp_path / "s", [[1] * 4] * 60)
    _rewrite_offsets(tmp_path / "s", "memmap", lambda o: o.__setitem__(28, o[28] + 1))
    store = mmpack.open(tmp_path / "s", verify_reads=True)
    assert store[10].tolist() == [1] * 4
    with pytest.raises(FormatError, match=r"offsets stripe 3 \(bytes 192..256\) fails"):
        store[27]
    with pytest.raises(FormatError, match=r"offsets stripe 3 "):
        _ = mmpack.open(tmp_path / "s", verify_reads=True).offsets


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("tokens.bin", lambda b: b[:-1], "holds .* bytes but the metadata says"),
        ("tokens.bin", lambda b: b + b"\0\0", "truncated or was replaced"),
        ("offsets.bin", lambda b: b[:8], "holds 8 bytes"),
        ("offsets.bin", lambda b: b"", "holds 0 bytes"),
        ("tokens.bin", None, "tokens.bin is missing: the store is incomplete"),
        ("offsets.bin", None, "offsets.bin is missing"),
        ("mmpack.json", None, "is not an mmpack store"),
        ("mmpack.json", lambda b: b[: len(b) // 2], "is not valid JSON"),
        ("mmpack.json", lambda b: b"\xff\xfe" + b, "is not valid JSON"),
        ("mmpack.json", lambda b: b"[1, 2]", "metadata is not a JSON object"),
    ],
)
def test_open_checks_memmap_files(tmp_path, file, change, message):
    mmpack.build(tmp_path / "s", _docs(2, high=60000))
    f = tmp_path / "s" / file
    if change is None:
        f.unlink()
    else:
        f.write_bytes(change(f.read_bytes()))
    with pytest.raises(FormatError, match=message):
        mmpack.open(tmp_path / "s")


def _edit_meta(path: Path, backend: str, **fields) -> None:
    if backend == "memmap":
        obj = json.loads((path / "mmpack.json").read_text())
        obj.update(fields)
        (path / "mmpack.json").write_text(json.dumps(obj))
    else:
        import zarr

        group = zarr.open_group(str(path), mode="r+")
        obj = dict(group.attrs)["mmpack"]
        obj.update(fields)
        group.attrs["mmpack"] = obj


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"version": 2},
            "format version 2 was written by a newer mmpack; this one reads versions up to 1",
        ),
        ({"version": "1"}, "invalid format version '1'"),
        ({"format": "arrow"}, "format is 'arrow', expected 'mmpack-token-store'"),
        ({"num_docs": 41, "fingerprint": None}, "holds|shape"),
        ({"num_tokens": 1, "fingerprint": None}, "checksums for|holds|shape"),
        ({"dtype": "<u8", "fingerprint": None}, "checksums for|holds|shape"),
        ({"num_docs": 41}, "fingerprint .* does not match the metadata"),
    ],
)
def test_open_checks_metadata(tmp_path, backend, fields, message):
    mmpack.build(tmp_path / "s", _docs(3, high=60000), backend=backend)
    fields = {k: v for k, v in fields.items()}
    _edit_meta(tmp_path / "s", backend, **fields)
    if fields.get("fingerprint", 0) is None:  # an edit made consistent: only the files can tell
        _drop_fingerprint(tmp_path / "s", backend)
    with pytest.raises(FormatError, match=message):
        mmpack.open(tmp_path / "s")


def _drop_fingerprint(path: Path, backend: str) -> None:
    if backend == "memmap":
        obj = json.loads((path / "mmpack.json").read_text())
        del obj["fingerprint"]
        (path / "mmpack.json").write_text(json.dumps(obj))
    else:
        import zarr

        group = zarr.open_group(str(path), mode="r+")
        obj = dict(group.attrs)["mmpack"]
        del obj["fingerprint"]
        group.attrs["mmpack"] = obj


def test_open_checks_zarr_arrays(tmp_path):
    import shutil

    mmpack.build(tmp_path / "s", _docs(4), backend="zarr")
    shutil.rmtree(tmp_path / "s" / "offsets")
    with pytest.raises(FormatError, match="lacks array|cannot read"):
        mmpack.open(tmp_path / "s")
    mmpack.build(tmp_path / "t", _docs(4), backend="zarr")
    (tmp_path / "t" / "tokens" / "zarr.json").write_text("{not json")
    with pytest.raises(FormatError, match="the Zarr store is corrupt|not a readable"):
        mmpack.open(tmp_path / "t")


def test_missing_path_is_store_not_found(tmp_path):
    with pytest.raises(StoreNotFoundError) as info:
        mmpack.open(tmp_path / "absent")
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path / "absent") in str(info.value)


# =================================================================================== verify()
@pytest.mark.parametrize("array", ["tokens", "offsets"])
def test_verify_names_the_block_of_a_flipped_byte(tmp_path, monkeypatch, array):
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 64)
    docs = _docs(5, n=60, high=60000)
    store = mmpack.build(tmp_path / "s", docs)
    assert (
        store.verify()["blocks"]
        == len(store.meta["checksum"]["tokens"]) + len(store.meta["checksum"]["offsets"])
        > 10
    )
    f = tmp_path / "s" / f"{array}.bin"
    data = bytearray(f.read_bytes())
    # flip a high byte of offsets (keeps them increasing) or any token byte
    rng = np.random.default_rng(0)
    for _ in range(5):
        pos = (
            int(rng.integers(len(data))) if array == "tokens" else 8 * int(rng.integers(1, 60)) + 6
        )
        data[pos] ^= 0x01
        f.write_bytes(data)
        if array == "offsets":
            with pytest.raises(FormatError, match="offsets"):
                mmpack.open(tmp_path / "s").verify()
        else:
            block = pos // 64
            lo, hi = block * 64, min(len(data), block * 64 + 64)
            with pytest.raises(
                FormatError, match=rf"tokens stripe {block} \(bytes {lo}..{hi}\) fails its checksum"
            ):
                mmpack.open(tmp_path / "s").verify()
        data[pos] ^= 0x01
        f.write_bytes(data)
        mmpack.open(tmp_path / "s").verify()


def test_verify_offsets_block(tmp_path, monkeypatch):
    """A flip that keeps the offsets valid (a middle offset moved within its neighbours) is
    invisible to the cheap checks; only the checksum finds it, and names the block."""
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 64)
    store = mmpack.build(tmp_path / "s", [[1] * 4] * 30)
    mmpack.open(tmp_path / "s").verify()
    _rewrite_offsets(tmp_path / "s", "memmap", lambda o: o.__setitem__(20, o[20] + 1))
    assert mmpack.open(tmp_path / "s").doc_lens[19] == 5  # opens: the index is still valid
    with pytest.raises(FormatError, match=r"offsets stripe 2 \(bytes 128..192\)"):
        mmpack.open(tmp_path / "s").verify()
    assert store.fingerprint  # the old object is unaffected by the check


def test_verify_zarr(tmp_path, monkeypatch):
    import zarr

    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 256)
    monkeypatch.setattr(shards, "INNER_CHUNK_BYTES", 256)  # shards of one 128-token chunk
    monkeypatch.setattr(shards, "SHARD_BYTES", 256)
    mmpack.build(tmp_path / "s", _docs(6, n=80, high=60000), backend="zarr")
    mmpack.open(tmp_path / "s").verify()
    # a value changed through zarr itself: every chunk still decodes, the checksum differs
    arr = zarr.open_group(str(tmp_path / "s"), mode="r+")["tokens"]
    arr[300] = int(arr[300]) ^ 1
    with pytest.raises(FormatError, match=r"tokens stripe 2 \(bytes 512..768\) fails its checksum"):
        mmpack.open(tmp_path / "s").verify()
    # a chunk that no longer decodes: a FormatError naming the range, not a codec error
    chunk = tmp_path / "s" / "tokens" / "c" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-7])
    store = mmpack.open(tmp_path / "s")
    with pytest.raises(FormatError, match=r"cannot read tokens \[\d+, \d+\) .*corrupt"):
        store.verify()
    with pytest.raises(FormatError, match="corrupt"):
        store.read_range(128, 256)


# =================================================================================== kills
PREV = _docs(10, n=30, high=200)
NEW = [*_docs(11, n=30, high=200), [70000, 1], *_docs(12, n=30, high=200)]  # widens to uint32


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _after_calls(n: int, fn: Callable, before: bool = True) -> Callable:
    """Wrap ``fn`` to SIGKILL the process at its ``n``-th call (before or after running it)."""
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if before and calls[0] == n:
            _kill()
        out = fn(*args, **kwargs)
        if not before and calls[0] == n:
            _kill()
        return out

    return wrapper


def _when_path(fn: Callable, test: Callable[..., bool], before: bool = True) -> Callable:
    def wrapper(*args, **kwargs):
        if before and test(*args):
            _kill()
        out = fn(*args, **kwargs)
        if not before and test(*args):
            _kill()
        return out

    return wrapper


def _gen_kill(k: int):
    def docs():
        for j, d in enumerate(NEW):
            if j == k:
                _kill()
            yield d

    return docs()


S = mmpack._src.store.writer
P = mmpack._src.store.publish  # the rename itself
W = StoreWriter
# name -> (backends, installs the kill point in the child, the rename happened before the kill)
KILL_POINTS: dict[str, tuple[tuple[str, ...], Callable[[], None], bool]] = {
    "buffering, doc 0": (("memmap", "zarr"), lambda: None, False),
    "buffering, doc 5": (("memmap", "zarr"), lambda: None, False),
    "buffering, doc 45": (("memmap", "zarr"), lambda: None, False),
    "first flush, before writing": (
        ("memmap", "zarr"),
        lambda: setattr(W, "_write_block", _after_calls(1, W._write_block)),
        False,
    ),
    "first flush, between tokens and offsets": (
        ("memmap",),
        lambda: setattr(W, "_write_offsets", _after_calls(2, W._write_offsets)),
        False,
    ),
    "third flush": (
        ("memmap",),
        lambda: setattr(W, "_write_block", _after_calls(3, W._write_block)),
        False,
    ),
    "widening, start": (
        ("memmap", "zarr"),
        lambda: setattr(W, "_widen", _after_calls(1, W._widen)),
        False,
    ),
    "widening, before replacing the file": (
        ("memmap",),
        lambda: setattr(
            S.os, "replace", _when_path(S.os.replace, lambda a, *r: str(a).endswith(".widen"))
        ),
        False,
    ),
    "final flush in commit": (
        ("memmap",),
        lambda: setattr(W, "_commit", _after_calls(1, W._commit)),
        False,
    ),
    "metadata write, before its rename": (
        ("memmap",),
        lambda: setattr(
            mmpack._src.store.format.os,
            "replace",
            _when_path(
                mmpack._src.store.format.os.replace, lambda a, b, *r: str(b).endswith("mmpack.json")
            ),
        ),
        False,
    ),
    "zarr conversion, start": (
        ("zarr",),
        lambda: setattr(
            zarr_backend.ZarrBackend,
            "commit",
            staticmethod(_after_calls(1, zarr_backend.ZarrBackend.commit)),
        ),
        False,
    ),
    "zarr conversion, between the arrays": (
        ("zarr",),
        lambda: setattr(
            Path, "unlink", _when_path(Path.unlink, lambda p, *r: p.name == "tokens.bin")
        ),
        False,
    ),
    "zarr conversion, done": (
        ("zarr",),
        lambda: setattr(
            zarr_backend.ZarrBackend,
            "commit",
            staticmethod(_after_calls(1, zarr_backend.ZarrBackend.commit, before=False)),
        ),
        False,
    ),
    "validating the new store, before the rename": (
        ("memmap", "zarr"),
        lambda: setattr(S, "_check_new_store", _after_calls(1, S._check_new_store)),
        False,
    ),
    "right before the rename": (
        ("memmap", "zarr"),
        lambda: setattr(S, "_swap_into_place", _after_calls(1, S._swap_into_place)),
        False,
    ),
    "right after the rename": (
        ("memmap", "zarr"),
        lambda: setattr(S, "_swap_into_place", _after_calls(1, S._swap_into_place, before=False)),
        True,
    ),
    "reopening the new store": (
        ("memmap",),
        lambda: setattr(S, "open_store", _after_calls(1, S.open_store)),
        True,
    ),
}
_GEN_K = {"buffering, doc 0": 0, "buffering, doc 5": 5, "buffering, doc 45": 45}
# Only with a previous store: the exchange of two folders, and the two-rename fallback (its
# renames are the 2nd and 3rd: the 1st gives the staged, locked temporary folder its name)
OVERWRITE_ONLY: dict[str, tuple[Callable[[], None], bool | None]] = {
    "after the exchange, before removing the old store": (
        lambda: setattr(
            P, "_renameat2_exchange", _after_calls(1, P._renameat2_exchange, before=False)
        ),
        True,
    ),
    "fallback rename: old store moved aside, new not yet in place": (
        lambda: (
            setattr(P, "_renameat2_exchange", lambda a, b: False),
            setattr(S.os, "rename", _after_calls(3, S.os.rename)),
        ),
        None,
    ),  # the target may be absent here (the previous store sits in .<name>.mmpack-old-*)
    "fallback rename: done, before removing the old store": (
        lambda: (
            setattr(P, "_renameat2_exchange", lambda a, b: False),
            setattr(S.os, "rename", _after_calls(3, S.os.rename, before=False)),
        ),
        True,
    ),
}


def _fork_and_build(
    target: Path, backend: str, install: Callable[[], None], k: int | None, overwrite: bool
) -> None:
    pid = os.fork()
    if pid == 0:  # the child: build, and die at the kill point
        try:
            install()
            docs = _gen_kill(k) if k is not None else iter(NEW)
            mmpack.build(
                target, docs, backend=backend, overwrite=overwrite, buffer_tokens=50, fsync=False
            )
        finally:
            os._exit(3)  # reaching this means the kill point never fired
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the builder was not killed (exit status {status}): the kill point was never reached"
    )


def _assert_after_kill(
    target: Path, backend: str, prev_fp: str | None, swapped: bool | None, new_fp: str
) -> str:
    """Check the target after the kill; return which state it is in."""
    if not target.exists():
        assert prev_fp is None or swapped is None, "the previous store vanished"
        state = "absent"
    else:
        store = mmpack.open(target)
        store.verify()
        if store.fingerprint == new_fp:
            assert swapped is not False, "the new store appeared before its rename"
            assert [d.tolist() for d in store] == [list(d) for d in NEW]
            state = "new"
        else:
            assert swapped is not True and store.fingerprint == prev_fp, "a half store"
            assert [d.tolist() for d in store] == [list(d) for d in PREV]
            state = "previous"
    # the next build removes what the dead builder left and succeeds
    leftovers = [p.name for p in target.parent.iterdir() if p.name != target.name]
    mmpack.build(target, [[1, 2]], backend=backend, overwrite=True, fsync=False)
    assert [p.name for p in target.parent.iterdir()] == [target.name], leftovers
    return state


def _all_kill_cases() -> list[tuple[str, str, bool]]:
    cases = []
    for name, (backends, _, _) in KILL_POINTS.items():
        for backend in backends:
            cases += [(name, backend, False), (name, backend, True)]
    for name in OVERWRITE_ONLY:
        for backend in BACKENDS:
            cases.append((name, backend, True))
    return cases


KILL_CASES = _all_kill_cases()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize(
    ("point", "backend", "overwrite"),
    KILL_CASES,
    ids=[f"{p}-{b}-{'overwrite' if o else 'fresh'}" for p, b, o in KILL_CASES],
)
def test_kill_at_point(tmp_path, point, backend, overwrite):
    (tmp_path / "t").mkdir()
    target = tmp_path / "t" / "store"
    new_fp = mmpack.build(tmp_path / "expected", NEW, backend=backend, fsync=False).fingerprint
    prev_fp = None
    if overwrite:
        prev_fp = mmpack.build(target, PREV, backend=backend, fsync=False).fingerprint
    if point in KILL_POINTS:
        _, install, swapped = KILL_POINTS[point]
    else:
        install, swapped = OVERWRITE_ONLY[point]
    _fork_and_build(target, backend, install, _GEN_K.get(point), overwrite)
    state = _assert_after_kill(target, backend, prev_fp, swapped, new_fp)
    if swapped is False:
        assert state == ("previous" if overwrite else "absent")
    elif swapped is True:
        assert state == "new"


def test_kill_point_count():
    """The figure quoted in docs/reliability.md."""
    assert len(KILL_POINTS) + len(OVERWRITE_ONLY) == 20
    assert len(KILL_CASES) == 56


_SLOW_BUILDER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import mmpack

    def docs():
        rng = np.random.default_rng(int(sys.argv[3]))
        for j in range(400):
            time.sleep(0.002)
            high = 200 if j < 150 else 70000 if j < 300 else 2**40
            yield rng.integers(0, high, int(rng.integers(0, 40)))

    print("start", flush=True)
    mmpack.build(sys.argv[1], docs(), backend=sys.argv[2], overwrite=True, buffer_tokens=300)
    print("done", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_after_random_delays(tmp_path, backend):
    """A real builder process (slow generator, flushes, two widenings) killed at random times."""
    target = tmp_path / "store"
    prev_fp = mmpack.build(target, PREV, backend=backend, fsync=False).fingerprint
    rng = np.random.default_rng(99)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    states = []
    for trial in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SLOW_BUILDER, str(target), backend, str(trial)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout.readline() == b"start\n"
        time.sleep(float(rng.uniform(0.0, 1.0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if target.exists():
            store = mmpack.open(target)
            store.verify()
            if store.fingerprint == prev_fp:
                states.append("previous")
            else:  # the builder finished before the kill: a complete new store
                assert len(store) == 400
                states.append("new")
                prev_fp = store.fingerprint
        else:
            pytest.fail("the target vanished")
    mmpack.build(target, [[1]], backend=backend, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["store"]
    assert "previous" in states


# ---------------------------------------------- the build's write paths against the naive file
def _path_sources() -> dict[str, tuple[Callable[[StoreWriter], None], list[np.ndarray]]]:
    """Each write path of a build: how it adds its documents, and the documents."""
    rng = np.random.default_rng(11)
    flat = rng.integers(0, 60_000, 200_000).astype(np.uint16)
    slices = np.split(flat, range(53, flat.size, 53))
    apart = [d.copy() for d in slices]
    wide = [d.astype(np.uint32) * (1 if j < 2000 else 70) for j, d in enumerate(slices)]

    def batch(w: StoreWriter) -> None:
        w.add_batch(flat, np.diff(np.r_[0, np.arange(53, flat.size, 53), flat.size]))

    return {
        "list": (lambda w: w.add_many(slices), slices),
        "apart": (lambda w: w.add_many(apart), apart),
        "generator": (lambda w: w.add_many(iter(apart)), apart),
        "add_batch": (batch, slices),
        "widening": (lambda w: w.add_many(wide), wide),
        "widening generator": (lambda w: w.add_many(iter(wide)), wide),
    }


@pytest.mark.parametrize("path", list(_path_sources()))
def test_every_write_path_gives_the_naive_file_and_verify_finds_a_flip(tmp_path, monkeypatch, path):
    """Blocks are hashed from the file on the hash thread: the digests are those of the naive
    concatenation (so nothing is hashed before it is written), and a byte flipped later in any
    block is found by ``verify``."""
    from mmpack._src.store.integrity import stripe_digest

    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 4096)
    add, docs = _path_sources()[path]
    with StoreWriter(tmp_path / "s", fsync=False) as w:
        add(w)
    store = w.store
    assert store is not None
    naive = np.concatenate(docs).astype(store.dtype).tobytes()
    f = tmp_path / "s" / "tokens.bin"
    assert f.read_bytes() == naive
    want = [stripe_digest(naive[a : a + 4096]) for a in range(0, len(naive), 4096)]
    assert list(store.meta["checksum"]["tokens"]) == want
    assert np.array_equal(store.doc_lens, [d.size for d in docs])
    data = bytearray(naive)
    for pos in (0, len(data) // 2 + 3, len(data) - 1):
        data[pos] ^= 0x10
        f.write_bytes(data)
        with pytest.raises(FormatError, match=rf"tokens stripe {pos // 4096} "):
            mmpack.open(tmp_path / "s").verify()
        data[pos] ^= 0x10
    f.write_bytes(data)
    mmpack.open(tmp_path / "s").verify()


@pytest.mark.parametrize("source", ["list", "apart", "generator"])
def test_a_refused_document_after_direct_writes_rolls_back_exactly(tmp_path, monkeypatch, source):
    """A bad token in the middle of a chunk whose documents were already handed to the writer
    (several blocks written): the documents before it are kept, nothing of it or after it, and
    documents added afterwards follow them exactly."""
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 4096)
    flat = (np.arange(300_000, dtype=np.uint16) * 7) % 50_000
    docs: list[np.ndarray] = np.split(flat, range(101, flat.size, 101))
    if source != "list":
        docs = [d.copy() for d in docs]
    bad = [d.astype(np.int64) for d in docs[:3]]
    bad[1][7] = -1
    mixed = docs[:2000] + bad + docs[2000:]
    with StoreWriter(tmp_path / "s", dtype=np.uint16, fsync=False) as w:
        with pytest.raises(ValueError, match="-1"):
            w.add_many(mixed if source != "generator" else iter(mixed))
        assert len(w._tokens.path.read_bytes()) <= (2001 * 101) * 2  # nothing past it survives
        w.add_many(docs[5:9])
    kept = docs[:2000] + [bad[0].astype(np.uint16)] + docs[5:9]
    assert (tmp_path / "s" / "tokens.bin").read_bytes() == np.concatenate(kept).tobytes()
    assert np.array_equal(w.store.doc_lens, [d.size for d in kept])
    w.store.verify()


def _writer_threads() -> int:
    import threading

    return sum(t.name.startswith(("mmpack-write", "mmpack-hash")) for t in threading.enumerate())


def _settled(count: Callable[[], int], most: int) -> int:
    """``count()`` once it is at most ``most`` (threads end by themselves), or after 2 s."""
    deadline = time.monotonic() + 2
    while count() > most and time.monotonic() < deadline:
        time.sleep(0.01)
    return count()


def test_many_builds_leak_no_thread_descriptor_or_folder(tmp_path):
    """200 builds through every path (list, apart, generator, failing source): the writer and
    hash threads end, no descriptor stays open, no temporary folder stays behind."""
    flat = (np.arange(30_000, dtype=np.uint16) * 5) % 4000
    slices = np.split(flat, range(40, flat.size, 40))
    apart = [d.copy() for d in slices]

    def failing():
        yield from slices[:10]
        raise RuntimeError("source failed")

    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    mmpack.build(tmp_path / "warm", slices, fsync=False)
    before = fds()
    for _ in range(50):
        mmpack.build(tmp_path / "a", slices, fsync=False, overwrite=True)
        mmpack.build(tmp_path / "b", apart, fsync=False, overwrite=True)
        mmpack.build(tmp_path / "c", iter(apart), fsync=False, overwrite=True)
        with pytest.raises(RuntimeError, match="source failed"):
            mmpack.build(tmp_path / "d", failing(), fsync=False)
    assert _settled(_writer_threads, 0) == 0
    assert _settled(fds, before) <= before
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c", "warm"]


@pytest.mark.parametrize("where", ["source", "write"])
def test_keyboard_interrupt_mid_build_leaves_nothing(tmp_path, monkeypatch, where):
    """``KeyboardInterrupt`` from the source or while the writer thread writes: it propagates,
    no store and no temporary folder stay, and the writer threads end."""
    import mmpack._src.store.stripe_writer as BW

    flat = (np.arange(1_200_000, dtype=np.uint16) * 3) % 9000  # 2.4 MB: written from place
    docs = [d.copy() for d in np.split(flat, range(700, flat.size, 700))]

    def source():
        for j, d in enumerate(docs):
            if where == "source" and j == 400:
                raise KeyboardInterrupt
            yield d

    taken = threading.Event()

    def ctrl_c(signum, frame):  # Python's own handler, and a mark that the main thread ran it
        taken.set()
        raise KeyboardInterrupt

    if where == "write":
        real, calls = BW._pwritev, []

        def interrupted(*a):
            if not calls:  # one Ctrl-C (a second one would interrupt the cleanup itself)
                os.kill(os.getpid(), signal.SIGINT)  # handled by the main thread, waiting
                taken.wait(10.0)  # the write stays in flight until the main thread has it
            calls.append(1)
            return real(*a)

        monkeypatch.setattr(BW, "_pwritev", interrupted)
        docs = np.split(flat, range(700, flat.size, 700))  # adjacent: written from place
    # CPython runs a signal's handler at the next bytecode of the main thread; if that is inside
    # a finalizer the garbage collector started, the KeyboardInterrupt is printed and dropped
    # ("Exception ignored in ...") whatever the library does.  The collector stays off here so
    # the interrupt lands in the build's own code, which is what this test checks.  The handler
    # is set here: a library another test imported in this process may have replaced SIGINT's.
    previous = signal.signal(signal.SIGINT, ctrl_c)
    gc.disable()
    try:
        with pytest.raises(KeyboardInterrupt):
            mmpack.build(tmp_path / "s", source() if where == "source" else docs, dtype=np.uint16)
    finally:
        gc.enable()
        signal.signal(signal.SIGINT, previous)
    assert where == "source" or taken.is_set()
    assert os.listdir(tmp_path) == []
    assert _settled(_writer_threads, 0) == 0
