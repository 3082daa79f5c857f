"""Random corruption of store files: every corruption is refused by ``mmpack.open`` or
``verify()`` with a clear error, or (rarely: a flipped whitespace byte in JSON) changes nothing a
reader sees.  Never another exception type, never wrong data returned silently.

The corruptions are drawn from a fixed seed, so the figures are stable:

- per backend, random byte flips, truncations, extensions and deletions over every file of the
  store (memmap: ``tokens.bin``, ``offsets.bin``, ``mmpack.json``; zarr: the group and array
  ``zarr.json`` files and every chunk);
- edits of one metadata field to a junk value (number +-1, 0, -1, None, a string, a bool, 2**70,
  a list, ...) in ``mmpack.json`` / the group attributes / the Zarr array metadata, with the
  stale fingerprint kept, removed, or recomputed to match the edit (so that the fingerprint is
  not the only line of defence).

``test_fuzz_corruptions`` prints the counts; ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

import mmpack
import mmpack._src.store.backends._zarr_shards as shards
import mmpack._src.store.writer
from mmpack._src.store.format import StoreMeta
from mmpack.errors import FormatError

BYTE_TRIALS = 260  # per backend
META_TRIALS = 120  # per backend
# Zarr array metadata that does not change what is read while every chunk exists.
HARMLESS_ZARR_FIELDS = (
    "zarr.json:fill_value=",
    "zarr.json:storage_transformers=",
    "zarr.json:attributes",
    "zarr.json:dimension_names=",
)
JUNK = [None, "x", True, False, -1, 0, 2**70, 1.5, [], {}, [1, 2]]


def _corpus() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 60000, int(rng.integers(0, 120))) for _ in range(60)]
    docs[5] = docs[5][:0]
    return docs


def _build(tmp: Path, backend: str, monkeypatch) -> tuple[Path, list[np.ndarray]]:
    # Small checksum blocks and chunks, so that the store has many of each.
    monkeypatch.setattr(mmpack._src.store.writer, "STRIPE_BYTES", 1024)
    monkeypatch.setattr(shards, "INNER_CHUNK_BYTES", 128)
    monkeypatch.setattr(shards, "SHARD_BYTES", 2048)
    docs = _corpus()
    mmpack.build(tmp / backend, docs, backend=backend, fsync=False)
    return tmp / backend, docs


def _outcome(path: Path, docs: list[np.ndarray], dtype: np.dtype) -> str:
    """'refused' or 'harmless'; fails the test on any other exception or on wrong data."""
    try:
        store = mmpack.open(path)
        store.verify()
        got = [store[j] for j in range(len(store))]
    except (FormatError, OSError) as exc:
        assert str(path) in str(exc), f"the message does not name the store: {exc}"
        return "refused"
    except Exception as exc:  # pragma: no cover - this is the failure being tested for
        pytest.fail(
            f"corruption of {path} raised {type(exc).__module__}.{type(exc).__name__}: {exc}"
        )
    same = (
        store.dtype == dtype
        and len(got) == len(docs)
        and all(np.array_equal(a, b) for a, b in zip(got, docs))
    )
    assert same, f"corrupt store at {path} opened, verified and returned wrong data"
    return "harmless"


def _byte_corruption(rng: np.random.Generator, data: bytes) -> tuple[str, bytes | None]:
    kind = str(rng.choice(["flip", "flip", "truncate", "extend", "delete"]))
    if kind == "flip" and data:
        b = bytearray(data)
        b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
        return kind, bytes(b)
    if kind == "truncate" and data:
        return kind, data[: int(rng.integers(len(data)))]
    if kind == "extend" or not data:
        return "extend", data + rng.integers(
            0, 256, int(rng.integers(1, 9)), dtype=np.uint8
        ).tobytes()
    return "delete", None


def _leaves(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*prefix, k))
    elif isinstance(obj, list) and obj and all(isinstance(v, int) for v in obj):
        for i in range(len(obj)):
            yield (*prefix, i)
        yield prefix
    else:
        yield prefix


def _edit(obj, path, value):
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def _junk_for(rng, old):
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
        return old + int(rng.choice([-1, 1, 8, -8]))
    if isinstance(old, str) and rng.random() < 0.5:
        return str(
            rng.choice(["<u1", "<u2", "<u4", "<u8", "<i8", "zarr", "memmap", "xxh64", "zstd"])
        )
    return JUNK[int(rng.integers(len(JUNK)))]


def _meta_corruption(rng, root: Path, backend: str) -> tuple[Path, str, bytes]:
    """Edit one field of a metadata record; returns (file, description, new bytes)."""
    if backend == "memmap":
        file, where = root / "mmpack.json", ()
    else:
        choice = int(rng.integers(3))
        file = root / ("zarr.json", "tokens/zarr.json", "offsets/zarr.json")[choice]
        where = ("attributes", "mmpack") if choice == 0 else None
    obj = json.loads(file.read_text())
    leaves = list(_leaves(obj))
    if where is not None:
        leaves = [p for p in leaves if p[: len(where)] == where and len(p) > len(where)]
    field = leaves[int(rng.integers(len(leaves)))]
    old = obj
    for key in field:
        old = old[key]
    obj_val = _junk_for(rng, old)
    _edit(obj, field, obj_val)
    mode = "stale fingerprint"
    if where is not None:
        record = obj
        for key in where:
            record = record[key]
        mode = str(rng.choice(["stale fingerprint", "no fingerprint", "recomputed fingerprint"]))
        if field[-1] == "fingerprint":
            mode = "stale fingerprint"
        if mode == "no fingerprint":
            record.pop("fingerprint", None)
        elif mode == "recomputed fingerprint":
            try:
                record["fingerprint"] = StoreMeta.from_json(
                    {**record, "fingerprint": None}, root
                ).fingerprint
            except FormatError:
                pass  # the edit already makes the record invalid
    return (
        file,
        f"{file.relative_to(root)}:{'/'.join(map(str, field))}={obj_val!r} ({mode})",
        json.dumps(obj).encode(),
    )


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_fuzz_corruptions(backend, tmp_path, monkeypatch, capsys):
    root, docs = _build(tmp_path, backend, monkeypatch)
    dtype = mmpack.open(root).dtype
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    pristine = {f: (root / f).read_bytes() for f in files}
    rng = np.random.default_rng(2024)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    harmless_edits: list[str] = []

    def restore():
        for f, data in pristine.items():
            (root / f).write_bytes(data)

    for _ in range(BYTE_TRIALS):
        f = files[int(rng.integers(len(files)))]
        kind, data = _byte_corruption(rng, pristine[f])
        if data is None:
            (root / f).unlink()
        else:
            (root / f).write_bytes(data)
        outcome = _outcome(root, docs, dtype)
        if outcome == "harmless":  # e.g. a JSON whitespace byte
            assert f.suffix == ".json", f"{kind} of {f} went unnoticed"
        counts[(kind, outcome)] += 1
        restore()
    for _ in range(META_TRIALS):
        file, what, data = _meta_corruption(rng, root, backend)
        file.write_bytes(data)
        outcome = _outcome(root, docs, dtype)
        if outcome == "harmless":
            assert any(f in what for f in HARMLESS_ZARR_FIELDS), f"edit accepted: {what}"
            harmless_edits.append(what)
        counts[("metadata edit", outcome)] += 1
        restore()
    assert _outcome(root, docs, dtype) == "harmless"  # the restored store is intact

    tried = sum(counts.values())
    refused = sum(v for (_, o), v in counts.items() if o == "refused")
    harmless = tried - refused
    assert tried == BYTE_TRIALS + META_TRIALS
    # a harmless corruption leaves every token a reader sees unchanged (a JSON whitespace
    # byte, a Zarr fill value never used); they must stay rare
    assert harmless <= tried // 20, (counts, harmless_edits)
    with capsys.disabled():
        print(
            f"\n[fuzz {backend}] {tried} corruptions tried: {refused} refused, {harmless} harmless "
            f"(reads unchanged), 0 silently wrong; by kind: "
            + ", ".join(f"{k}/{o}={v}" for (k, o), v in sorted(counts.items()))
        )
