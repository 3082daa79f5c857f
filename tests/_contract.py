"""The store contract every layout meets, shared by the tests of each layout: a store opened
from any backend (local memmap, local Zarr, remote memmap, remote Zarr, joined parts, ...) gives
exactly the windows and packed rows of the reference store built from the same documents."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _s3 import BUCKET

import mmpack


def assert_views_equal(
    store, reference, seqlen: int = 64, every_row: bool = True, same_fingerprint: bool = True
) -> None:
    """Every window and packed row of ``store`` equals ``reference``'s: shuffled batches through
    ``__getitems__`` (every column, the cut counts and each row's ``cu_seqlens``), then single
    rows (all of them, or the first, middle and last), the store's metadata and documents.
    (A join of parts has its own fingerprint: ``same_fingerprint=False``.)"""
    if same_fingerprint:
        assert store.fingerprint == reference.fingerprint
    assert len(store) == len(reference)
    np.testing.assert_array_equal(store.offsets, reference.offsets)
    for j in sorted({0, len(reference) // 2, len(reference) - 1}):
        np.testing.assert_array_equal(store[j], reference[j])
    for make in (
        lambda s: mmpack.WindowDataset(s, seqlen, seqlen // 2, eot=65535, labels=True),
        lambda s: mmpack.PackedDataset(s, seqlen, eot=65535, pad_id=0),
    ):
        a, b = make(store), make(reference)
        assert len(a) == len(b)
        order = np.random.default_rng(1).permutation(len(a))
        for lo in range(0, len(order), 29):
            got, want = a.__getitems__(order[lo : lo + 29]), b.__getitems__(order[lo : lo + 29])
            assert sorted(got.columns) == sorted(want.columns)
            for key in want.columns:
                np.testing.assert_array_equal(got.columns[key], want.columns[key])
            np.testing.assert_array_equal(got.num_cuts, want.num_cuts)
            for r, n in enumerate(want.num_cuts):
                np.testing.assert_array_equal(got.cu_seqlens[r, :n], want.cu_seqlens[r, :n])
        rows = range(len(a)) if every_row else sorted({0, len(a) // 2, len(a) - 1})
        for i in rows:
            want_row = b[i]
            got_row = a[i]
            assert sorted(got_row) == sorted(want_row)
            for key, value in want_row.items():
                np.testing.assert_array_equal(got_row[key], value)


def assert_workers_serve(
    ds,
    want,
    context: str,
    *,
    seed: int = 3,
    keys=("input_ids", "position_ids", "cu_seqlens"),
) -> None:
    """A DataLoader with two workers (``context``: "fork" or "spawn") over ``ds`` yields, batch by
    batch in the sampler's order, what ``want`` (the same view over the reference store) gives:
    a store the parent already used must reopen (spawn) or survive the fork in each worker."""
    from torch.utils.data import BatchSampler, DataLoader

    from mmpack.torch import collate

    sampler = mmpack.ResumableSampler(len(ds), seed=seed)
    batches = BatchSampler(sampler, 8, False)
    loader = DataLoader(
        ds,
        batch_sampler=batches,
        num_workers=2,
        collate_fn=collate,
        multiprocessing_context=context,
        timeout=60,
    )
    order = list(sampler)
    n = 0
    for b, batch in enumerate(loader):
        expect = collate(want.__getitems__(order[b * 8 : (b + 1) * 8]))
        for key in keys:
            assert (batch[key] == expect[key]).all(), key
        n += 1
    assert n == -(-len(ds) // 8)


def _url() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/c"


def _joined(tmp: Path, docs, **_):
    cut = len(docs) // 3
    parts = [
        mmpack.build(tmp / f"p{k}", chunk, fsync=False)
        for k, chunk in enumerate((docs[:cut], docs[cut : 2 * cut], docs[2 * cut :]))
    ]
    return mmpack.join([p.location for p in parts], tmp / "joined")


LAYOUTS: dict[str, Callable] = {
    "memmap": lambda tmp, docs, **_: mmpack.build(tmp / "s", docs, fsync=False),
    "zarr": lambda tmp, docs, **_: mmpack.build(tmp / "z", docs, backend="zarr", fsync=False),
    "file-url": lambda tmp, docs, **_: mmpack.build(f"file://{tmp}/f", docs),
    "s3-memmap": lambda tmp, docs, s3: mmpack.build(_url(), docs, storage_options=s3.options),
    "s3-zarr": lambda tmp, docs, s3: mmpack.build(
        _url(), docs, backend="zarr", storage_options=s3.options
    ),
    "s3-memmap-cached": lambda tmp, docs, s3: mmpack.open(
        mmpack.build(_url(), docs, storage_options=s3.options).location,
        storage_options=s3.options,
        cache_dir=tmp / "node",
        cache_limit=1 << 26,
    ),
    "joined-parts": _joined,
}
