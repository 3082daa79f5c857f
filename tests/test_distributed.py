"""Several real ranks: torch.distributed (gloo, file rendezvous, loopback sockets only).

Each test starts its ranks with ``torch.multiprocessing.spawn`` (which joins them, and raises if
one fails) and checks what rank 0 gathered.  No ``torchrun``: its rendezvous listens on every
interface.  Run: ``pytest tests/test_distributed.py`` (a few seconds per test).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from mmpack import Permutation

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import _dist

pytestmark = pytest.mark.distributed

N, SEED, BATCH = 83, 9, 4


def _spawn(tmp_path: Path, world: int, name: str, fn=_dist.run_rank, **job) -> dict:
    job = {
        "n": N,
        "seed": SEED,
        "batch_size": BATCH,
        "init_file": str(tmp_path / f"{name}.init"),
        "out": str(tmp_path / f"{name}.json"),
        **job,
    }
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's sockets on loopback only (inherited by ranks)
    try:
        ctx = mp.spawn(fn, args=(world, job), nprocs=world, join=False)
        while not ctx.join():  # raises if a rank fails (and terminates the others)
            pass
    finally:
        if before is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before
    assert all(p.exitcode == 0 and not p.is_alive() for p in ctx.processes)  # none left behind
    return json.loads(Path(job["out"]).read_text())


def _epoch(epoch: int) -> list[int]:
    return list(Permutation(N, seed=SEED, epoch=epoch))


def _check_full_epoch(shares: list[list[int]], world: int) -> None:
    assert [len(s) for s in shares] == [-(-N // world)] * world
    seen = Counter(i for s in shares for i in s)
    assert set(seen) == set(range(N))  # complete
    pad = world * -(-N // world) - N
    assert sum(seen.values()) == N + pad and set(seen.elements()) == set(range(N))
    # disjoint apart from the padding, which repeats the epoch's first positions
    assert sorted(i for i, c in seen.items() for _ in range(c - 1)) == sorted(_epoch(0)[:pad])


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """4 ranks: one whole epoch, then 3 batches of epoch 1 each and a checkpoint."""
    tmp = tmp_path_factory.mktemp("w4")
    out = _spawn(tmp, 4, "w4", save_after=3, checkpoint=str(tmp / "w4.pt"))
    return out, tmp / "w4.pt"


def test_four_ranks_are_disjoint_and_complete(four_ranks):
    out, _ = four_ranks
    assert out["world"] == 4
    _check_full_epoch(out["full"], 4)
    assert [len(h) for h in out["head"]] == [3 * BATCH] * 4


def test_two_ranks_are_disjoint_and_complete(tmp_path):
    out = _spawn(tmp_path, 2, "w2", save_after=1, checkpoint=str(tmp_path / "w2.pt"))
    assert out["world"] == 2
    _check_full_epoch(out["full"], 2)


@pytest.mark.parametrize("world", [2, 3])
def test_save_on_four_resume_on_fewer_is_exact(four_ranks, tmp_path, world):
    out4, checkpoint = four_ranks
    resumed = _spawn(tmp_path, world, f"resume{world}", resume_from=str(checkpoint))
    assert resumed["world"] == world
    head = [i for h in out4["head"] for i in h]
    tail = [i for t in resumed["resumed"] for i in t]
    assert len({len(t) for t in resumed["resumed"]}) == 1  # equal shares per rank
    order = _epoch(1)
    consumed = 4 * 3 * BATCH
    pad = len(tail) - (N - consumed)
    assert 0 <= pad < world
    assert Counter(head + tail) == Counter(order + order[:pad])  # union exact; padding named
    assert sorted(head) == sorted(order[:consumed])


def test_the_loader_takes_its_rank_and_world_size_from_torch_distributed(tmp_path):
    out = _spawn(tmp_path, 2, "loader", fn=_dist.run_loader_rank)
    assert out["ranks"] == [[0, 2], [1, 2]]
    shares = out["seen"]
    assert sorted(set(shares[0]) | set(shares[1])) == list(range(N))
    assert len(shares[0]) == len(shares[1]) == -(-N // 2)  # so only the padding repeats
