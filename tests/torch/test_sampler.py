"""Specification of :class:`mmpack.ResumableSampler`.

Every test of a shuffled order runs with each order of ``_orders.ORDERS`` (the global order and
the block-window order), against the list models of ``_orders``."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import resource
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest
import torch
from _datasets import IndexDataset
from _orders import ORDERS, epoch_order, make_sampler, order_kwargs, orders, sampler_kwargs
from _paths import ROOT, TESTS
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from mmpack import Permutation, ResumableSampler
from mmpack._src.sampling.sampler_state import STATE_FIELDS
from mmpack.sampling import BlockOrder, uniform_bounds


def reference_share(
    n, *, shuffle=True, seed=0, epoch=0, rank=0, world_size=1, drop_last=False, order="global"
):
    """DistributedSampler's recipe over a materialised epoch order."""
    order = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle, order=order)
    if drop_last:
        order = order[: (n // world_size) * world_size]
    else:
        total = -(-n // world_size) * world_size
        while len(order) < total:
            order += order[: total - len(order)]
    return order[rank::world_size]


_SIZES = [0, 1, 2, 3, 7, 13, 64, 97, 127, 128, 129, 1000]


# -- epochs are permutations ---------------------------------------------------------------------


@orders
@pytest.mark.parametrize("n", [1, 2, 3, 5, 101, 1009, 2**10, 2**10 + 1, 10**6])
def test_each_epoch_is_a_permutation(n, order):
    sampler = make_sampler(n, order, seed=11)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = np.fromiter(sampler, dtype=np.int64, count=len(sampler))
        np.testing.assert_array_equal(np.sort(got), np.arange(n))
    assert len(sampler) == n


@orders
def test_epochs_and_seeds_differ_and_are_pure(order):
    n = 500
    runs = {}
    for seed, epoch in itertools.product((0, 1), (0, 1, 2)):
        s = make_sampler(n, order, seed=seed)
        s.set_epoch(epoch)
        runs[seed, epoch] = list(s)
        assert runs[seed, epoch] == epoch_order(n, seed=seed, epoch=epoch, order=order)
        again = make_sampler(n, order, seed=seed)
        again.set_epoch(epoch)
        assert list(again) == runs[seed, epoch]
    assert len({tuple(v) for v in runs.values()}) == 6
    s = make_sampler(n, order, seed=0)
    assert list(s) == list(s) == runs[0, 0]  # no set_epoch: same epoch again


def test_no_shuffle_is_identity_and_matches_distributed_sampler():
    for n, ws, drop_last in itertools.product((1, 7, 10, 13), (1, 2, 3, 4), (False, True)):
        for rank in range(ws):
            ours = ResumableSampler(n, shuffle=False, rank=rank, world_size=ws, drop_last=drop_last)
            theirs = DistributedSampler(
                range(n), num_replicas=ws, rank=rank, shuffle=False, drop_last=drop_last
            )
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


# -- ranks -----------------------------------------------------------------------------------------


@orders
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 13, 31, 100, 101])
def test_ranks_disjoint_and_complete(n, drop_last, order):
    for ws in range(1, 8):
        shares = []
        for rank in range(ws):
            s = make_sampler(n, order, seed=4, rank=rank, world_size=ws, drop_last=drop_last)
            s.set_epoch(2)
            got = list(s)
            assert got == reference_share(
                n, seed=4, epoch=2, rank=rank, world_size=ws, drop_last=drop_last, order=order
            )
            expected_len = n // ws if drop_last else -(-n // ws)
            assert len(got) == len(s) == expected_len
            shares.append(got)
        flat = [i for share in shares for i in share]
        if drop_last:
            assert len(flat) == len(set(flat)) == (n // ws) * ws  # disjoint, nothing repeated
        else:
            assert set(flat) == set(range(n))  # complete
            # the only repeats are the padding, which wraps to the start of the epoch order
            assert len(flat) - len(set(flat)) == -(-n // ws) * ws - n


# -- resuming ---------------------------------------------------------------------------------------


def _draw(sampler, k):
    it = iter(sampler)
    return [next(it) for _ in range(k)], it


@pytest.mark.parametrize(
    "n, ws, rank, drop_last",
    [
        (1, 1, 0, False),
        (2, 1, 0, False),
        (97, 1, 0, False),
        (97, 3, 2, False),
        (97, 4, 1, True),
        (20000, 2, 1, False),
    ],
)
@orders
def test_resume_after_k_draws(n, ws, rank, drop_last, order):
    kw = dict(seed=9, rank=rank, world_size=ws, drop_last=drop_last, **order_kwargs(order, n))
    ref = ResumableSampler(n, **kw)
    ref.set_epoch(3)
    full = list(ref)
    length = len(ref)
    for k in sorted(
        {0, 1, min(5, length), length // 2, max(length - 1, 0), length, min(8193, length)}
    ):
        s = ResumableSampler(n, **kw)
        s.set_epoch(3)
        head, _ = _draw(s, k)
        state = s.state_dict()
        assert state["position"] == k and state["epoch"] == 3
        fresh = ResumableSampler(n, **kw)
        fresh.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert fresh.epoch == 3
        assert head + list(fresh) == full
        # later epochs follow through set_epoch
        fresh.set_epoch(4)
        ref.set_epoch(4)
        assert list(fresh) == list(ref)
        ref.set_epoch(3)


@orders
def test_resume_after_full_epoch_yields_nothing_then_next_epoch(order):
    s = make_sampler(50, order, seed=1)
    s.set_epoch(5)
    list(s)
    state = s.state_dict()
    assert (state["epoch"], state["position"]) == (5, 50)
    fresh = make_sampler(50, order, seed=1)
    fresh.load_state_dict(state)
    assert list(fresh) == []
    fresh.set_epoch(6)
    s.set_epoch(6)
    assert list(fresh) == list(s)


@orders
def test_resume_across_epoch_boundary(order):
    n = 300
    s = make_sampler(n, order, seed=2, world_size=2, rank=1)
    list(s)
    s.set_epoch(1)
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["position"] == 0
    head, _ = _draw(s, 40)
    state = s.state_dict()
    fresh = make_sampler(n, order, seed=2, world_size=2, rank=1)
    fresh.set_epoch(0)
    fresh.load_state_dict(state)  # load after set_epoch: the state's epoch wins
    fresh.set_epoch(1)  # re-selecting the same epoch keeps the resume position
    ref = make_sampler(n, order, seed=2, world_size=2, rank=1)
    ref.set_epoch(1)
    assert head + list(fresh) == list(ref)


@orders
def test_set_epoch_to_another_epoch_discards_loaded_position(order):
    s = make_sampler(100, order, seed=3)
    _draw(s, 30)
    state = s.state_dict()
    fresh = make_sampler(100, order, seed=3)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    ref = make_sampler(100, order, seed=3)
    ref.set_epoch(1)
    assert list(fresh) == list(ref)


@orders
def test_state_dict_tracks_the_latest_iterator(order):
    s = make_sampler(100, order, seed=3)
    assert s.state_dict()["position"] == 0
    _, it = _draw(s, 10)
    assert s.state_dict()["position"] == 10
    next(it)
    assert s.state_dict()["position"] == 11
    loaded = make_sampler(100, order, seed=3)
    loaded.load_state_dict(s.state_dict())
    assert loaded.state_dict() == s.state_dict()  # saving right after loading loses nothing
    _draw(s, 3)  # a new iterator restarts the epoch
    assert s.state_dict()["position"] == 3
    state = s.state_dict()
    assert tuple(state) == STATE_FIELDS  # one schema for every order
    plain = {
        k: v for k, v in state.items() if k not in ("shuffle", "skips", "replays", "fingerprint")
    }
    blocks = order == "blocks"
    assert all(type(v) in (int, bool) or (v is None and not blocks) for v in plain.values())
    assert state["shuffle"] == (True if order == "global" else "blocks")
    assert state["skips"] == state["replays"] == []


@orders
def test_any_rank_may_load_another_ranks_state(order):
    a = make_sampler(1000, order, seed=1, world_size=4, rank=0)
    _draw(a, 17)
    b = make_sampler(1000, order, seed=1, world_size=4, rank=3)
    b.load_state_dict(a.state_dict())
    assert list(b) == reference_share(1000, seed=1, rank=3, world_size=4, order=order)[17:]


@given(
    n=st.integers(0, 3000),
    ws=st.integers(1, 7),
    data=st.data(),
    drop_last=st.booleans(),
    shuffle=st.sampled_from([False, True, "blocks"]),
    epoch=st.integers(0, 2**40),
)
def test_resume_property(n, ws, data, drop_last, shuffle, epoch):
    rank = data.draw(st.integers(0, ws - 1))
    kw = dict(seed=5, rank=rank, world_size=ws, drop_last=drop_last, **sampler_kwargs(n, shuffle))
    s = ResumableSampler(n, **kw)
    s.set_epoch(epoch)
    expected = reference_share(
        n, seed=5, epoch=epoch, rank=rank, world_size=ws, drop_last=drop_last, shuffle=shuffle
    )
    k = data.draw(st.integers(0, len(s)))
    head, _ = _draw(s, k)
    fresh = ResumableSampler(n, **kw)
    fresh.load_state_dict(s.state_dict())
    assert head + list(fresh) == expected
    lo = data.draw(st.integers(0, len(s)))
    hi = data.draw(st.integers(lo, len(s)))
    assert s.indices(lo, hi, epoch=epoch).tolist() == expected[lo:hi]


# -- validation ---------------------------------------------------------------------------------------


def test_constructor_validation():
    with pytest.raises(TypeError, match="n must be an int"):
        ResumableSampler(10.0)
    with pytest.raises(TypeError, match="n must be an int"):
        ResumableSampler(True)
    with pytest.raises(ValueError, match="n=-1"):
        ResumableSampler(-1)
    with pytest.raises(ValueError, match="world_size=0"):
        ResumableSampler(10, world_size=0)
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        ResumableSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="rank=-1"):
        ResumableSampler(10, rank=-1, world_size=2)
    with pytest.raises(TypeError, match="shuffle"):
        ResumableSampler(10, shuffle=1)
    with pytest.raises(ValueError, match="seed=-3"):
        ResumableSampler(10, seed=-3)
    with pytest.raises(ValueError, match="epoch"):
        ResumableSampler(10).set_epoch(-1)
    assert len(ResumableSampler(np.int64(10))) == 10
    assert list(ResumableSampler(0)) == [] and len(ResumableSampler(0, world_size=3)) == 0


@pytest.mark.parametrize(
    "bounds, error, message",
    [
        ([0, 4, 10], None, None),
        (np.array([0, 4, 10], dtype=np.uint8), None, None),
        ([1, 4, 10], ValueError, r"start at 0, got block_bounds\[0\]=1"),
        ([0, 4, 9], ValueError, r"end at n=10 .*block_bounds\[-1\]=9"),
        ([0, 4, 4, 10], ValueError, r"strictly increasing, got block_bounds\[2\]=4 after"),
        ([0, 6, 4, 10], ValueError, r"block_bounds\[2\]=4 after block_bounds\[1\]=6"),
        ([], ValueError, "at least one value"),
        ([0.0, 10.0], TypeError, "integer array, got dtype float64"),
        ([[0, 10]], TypeError, r"shape \(1, 2\)"),
        ([False, True], TypeError, "dtype bool"),
    ],
)
def test_block_bounds_are_validated(bounds, error, message):
    if error is None:
        s = ResumableSampler(10, shuffle="blocks", block_bounds=bounds)
        assert sorted(s) == list(range(10)) and s.block_order.n_blocks == 2
        return
    with pytest.raises(error, match=message):
        ResumableSampler(10, shuffle="blocks", block_bounds=bounds)


def test_block_order_arguments_are_validated():
    with pytest.raises(ValueError, match="needs block_bounds"):
        ResumableSampler(10, shuffle="blocks")
    with pytest.raises(ValueError, match="only used with shuffle='blocks', got shuffle=True"):
        ResumableSampler(10, block_bounds=[0, 10])
    with pytest.raises(ValueError, match="window_blocks=0"):
        ResumableSampler(10, shuffle="blocks", block_bounds=[0, 10], window_blocks=0)
    with pytest.raises(TypeError, match="window_blocks"):
        ResumableSampler(10, shuffle="blocks", block_bounds=[0, 10], window_blocks=2.0)
    with pytest.raises(TypeError, match="shuffle must be a bool or 'blocks', got str 'block'"):
        ResumableSampler(10, shuffle="block", block_bounds=[0, 10])
    assert list(ResumableSampler(0, shuffle="blocks", block_bounds=[0])) == []
    s = ResumableSampler(10, shuffle="blocks", block_bounds=[0, 5, 10], window_blocks=1)
    assert "blocks=2, window_blocks=1" in repr(s) and s.shuffle == "blocks"


# -- huge n ------------------------------------------------------------------------------------------


@orders
def test_huge_n_is_instant_and_constant_memory(order):
    n = 10**11
    # the block order: 20000 blocks of 5 * 10**6 samples (160 KB of bounds), windows of 256
    kw = (
        {}
        if order == "global"
        else {"shuffle": "blocks", "block_bounds": uniform_bounds(n, 5 * 10**6)}
    )
    list(ResumableSampler(20_000, seed=1))  # warm the compiled kernels
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    t0 = time.perf_counter()
    s = ResumableSampler(n, seed=1, world_size=3, rank=1, **kw)
    head, _ = _draw(s, 20_000)
    state = s.state_dict()
    state["position"] = len(s) // 2
    fresh = ResumableSampler(n, seed=1, world_size=3, rank=1, **kw)
    fresh.load_state_dict(state)
    tail, _ = _draw(fresh, 1000)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    # the block order holds O(blocks): per sampler its bounds and block sizes, plus the
    # O(blocks) temporaries of an epoch's window offsets
    allowance = 0 if order == "global" else 8 * kw["block_bounds"].nbytes
    assert peak < 2 * 2**20 + allowance, f"traced peak {peak} bytes"
    assert rss_growth_kib < 16 * 1024, f"RSS grew by {rss_growth_kib} KiB"
    assert elapsed < 2.0
    assert len(s) == -(-n // 3)
    assert len(set(head)) == len(head) and all(0 <= i < n for i in head)
    positions = np.arange(len(s) // 2, len(s) // 2 + 1000, dtype=np.int64) * 3 + 1
    if order == "global":
        assert tail == Permutation(n, seed=1).map(positions).tolist()
    else:
        again = BlockOrder(n, kw["block_bounds"], seed=1)  # a fresh order, nothing cached
        assert tail == again.map(positions, 0).tolist()


# -- DataLoader ---------------------------------------------------------------------------------------


@pytest.mark.slow
@orders
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(context, order):
    n = 45
    sampler = make_sampler(n, order, seed=8, world_size=2, rank=1)
    sampler.set_epoch(1)
    expected = list(sampler)
    loader = DataLoader(
        IndexDataset(n),
        sampler=sampler,
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
    )
    got = torch.cat([b.reshape(-1) for b in loader]).tolist()
    assert got == expected


_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from mmpack import ResumableSampler
    from _datasets import IndexDataset
    from _orders import order_kwargs

    jobs = json.load(open(sys.argv[1]))
    results = []
    for job in jobs:
        sampler = ResumableSampler(job["n"], seed=job["seed"], **order_kwargs(job["order"], job["n"]))
        loader = StatefulDataLoader(
            IndexDataset(job["n"]), sampler=sampler, batch_size=job["batch_size"], num_workers=job["num_workers"]
        )
        loader.load_state_dict(torch.load(job["state"], weights_only=False))
        rest = [b.reshape(-1).tolist() for b in loader]
        sampler.set_epoch(1)
        following = [b.reshape(-1).tolist() for b in loader]
        results.append({"rest": rest, "following": following})
    json.dump(results, open(sys.argv[2], "w"))
    """
)


@pytest.mark.slow
def test_stateful_dataloader_resumes_exactly_in_a_fresh_process(tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    n, seed, batch_size, k = 103, 6, 4, 7
    jobs, expected = [], []
    for num_workers, order in itertools.product((0, 2), ORDERS):

        def make_loader():
            sampler = make_sampler(n, order, seed=seed)
            loader = StatefulDataLoader(
                IndexDataset(n), sampler=sampler, batch_size=batch_size, num_workers=num_workers
            )
            return sampler, loader

        sampler, loader = make_loader()
        epoch0 = [b.reshape(-1).tolist() for b in loader]
        sampler.set_epoch(1)
        epoch1 = [b.reshape(-1).tolist() for b in loader]
        assert sorted(sum(epoch0, [])) == list(range(n))

        sampler, loader = make_loader()
        it = iter(loader)
        head = [next(it).reshape(-1).tolist() for _ in range(k)]
        assert head == epoch0[:k]
        state = loader.state_dict()
        path = tmp_path / f"state{num_workers}{order}.pt"
        torch.save(state, path)
        del it, loader
        jobs.append(
            {
                "n": n,
                "seed": seed,
                "batch_size": batch_size,
                "num_workers": num_workers,
                "order": order,
                "state": str(path),
            }
        )
        expected.append({"rest": epoch0[k:], "following": epoch1})

    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "jobs.json"), str(tmp_path / "out.json")],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    results = json.loads((tmp_path / "out.json").read_text())
    assert results == expected


# -- issue 13: exact resume of a plain DataLoader, epochs carried by the indices -------------------


@pytest.mark.slow
@orders
def test_plain_dataloader_resumes_exactly_from_the_consumed_count(order):
    """With workers a plain DataLoader draws ahead of the loop: ``state_dict()`` alone would
    resume after the prefetched indices; ``state_dict(consumed=...)`` resumes right after the
    last sample the loop used."""
    n, batch_size = 103, 4
    sampler = make_sampler(n, order, seed=6)
    sampler.set_epoch(2)
    epoch = list(sampler)
    loader = DataLoader(IndexDataset(n), sampler=sampler, batch_size=batch_size, num_workers=2)
    it = iter(loader)
    seen = [next(it).reshape(-1).tolist() for _ in range(10)]
    consumed = sum(map(len, seen))
    assert consumed == 40 and list(itertools.chain(*seen)) == epoch[:40]
    assert sampler.state_dict()["position"] > 40  # the workers' prefetch
    state = sampler.state_dict(consumed=consumed)
    assert (state["epoch"], state["position"]) == (2, 40)
    del it

    fresh = make_sampler(n, order, seed=6)
    fresh.load_state_dict(state)
    rest = [
        b.reshape(-1).tolist()
        for b in DataLoader(IndexDataset(n), sampler=fresh, batch_size=batch_size, num_workers=2)
    ]
    assert list(itertools.chain(*rest)) == epoch[40:]
    # the resumed loop counts from 0 again: 8 more consumed -> position 48
    again = make_sampler(n, order, seed=6)
    again.load_state_dict(state)
    assert again.state_dict(consumed=0)["position"] == 40
    it = iter(again)
    for _ in range(20):
        next(it)
    assert again.state_dict(consumed=8)["position"] == 48


@orders
def test_consumed_is_validated(order):
    sampler = make_sampler(10, order, seed=1)
    assert sampler.state_dict(consumed=0)["position"] == 0
    with pytest.raises(ValueError, match="consumed=1"):
        sampler.state_dict(consumed=1)  # nothing handed out yet
    it = iter(sampler)
    for _ in range(3):
        next(it)
    for bad in (4, -1):
        with pytest.raises(ValueError, match=f"consumed={bad}"):
            sampler.state_dict(consumed=bad)
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match="consumed"):
            sampler.state_dict(consumed=bad)
    assert sampler.state_dict(consumed=3)["position"] == 3


@orders
def test_indices_carry_their_epoch(order):
    from mmpack.store import EpochIndex

    sampler = make_sampler(50, order, seed=3)
    sampler.set_epoch(4)
    got = list(sampler)
    assert all(isinstance(i, EpochIndex) and i.epoch == 4 for i in got)
    assert got == sampler.indices(0, 50).tolist()
    back = pickle.loads(pickle.dumps(got))
    assert back == got and all(i.epoch == 4 for i in back)
    state = sampler.state_dict()
    fresh = make_sampler(50, order, seed=3)
    fresh.load_state_dict({**state, "position": 10})
    assert all(i.epoch == 4 for i in fresh)
    with pytest.raises(ValueError, match="epoch"):
        EpochIndex(3, -1)
    with pytest.raises(TypeError, match="index"):
        EpochIndex(True, 0)
