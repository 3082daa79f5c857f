"""Rank functions for tests/test_distributed.py (module level: ``torch.multiprocessing.spawn``
pickles them by name).  Each rank joins a gloo group through a file on the test's tmp dir (no TCP
rendezvous; gloo's own sockets stay on loopback through ``GLOO_SOCKET_IFNAME=lo``), builds its
sampler from ``dist.get_rank()`` / ``dist.get_world_size()``, iterates a DataLoader with a worker,
and all-gathers what it saw; rank 0 writes the gathered lists as JSON for the test to check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from _datasets import IndexDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from mmpack import ResumableSampler
from mmpack._src.torch import elastic


def _flat(batches) -> list[int]:
    return [i for b in batches for i in b.reshape(-1).tolist()]


def run_rank(rank: int, world_size: int, job: dict) -> None:
    assert os.environ.get("GLOO_SOCKET_IFNAME") == "lo"
    dist.init_process_group(
        "gloo", init_method=f"file://{job['init_file']}", rank=rank, world_size=world_size
    )
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        n, seed, batch_size = job["n"], job["seed"], job["batch_size"]
        sampler = ResumableSampler(n, seed=seed, rank=rank, world_size=world)
        loader = StatefulDataLoader(
            IndexDataset(n),
            sampler=sampler,
            batch_size=batch_size,
            num_workers=1,
            persistent_workers=True,
        )
        out: dict[str, object] = {"world": world}
        if job.get("resume_from"):
            # resume another world size's checkpoint: its sampler state, into this rank's sampler
            saved = torch.load(job["resume_from"], weights_only=False)
            sampler.load_state_dict(elastic.sampler_state(saved))
            out["resumed"] = _gather(_flat(loader))
        else:
            out["full"] = _gather(_flat(loader))  # one whole epoch
            sampler.set_epoch(1)
            it = iter(loader)
            head = _flat(next(it) for _ in range(job["save_after"]))
            state = loader.state_dict()
            out["head"] = _gather(head)
            if rank == 0:
                torch.save(state, job["checkpoint"])
            del it
        dist.barrier()
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _gather(values: list[int]) -> list[list[int]]:
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    return gathered  # type: ignore[return-value]


def run_loader_rank(rank: int, world_size: int, job: dict) -> None:
    """``mmpack.torch.loader`` under an initialised group: its sampler's rank and world size, and
    the samples it gives (one epoch, 1 worker), gathered."""
    import mmpack.torch

    dist.init_process_group(
        "gloo", init_method=f"file://{job['init_file']}", rank=rank, world_size=world_size
    )
    try:
        loader = mmpack.torch.loader(
            IndexDataset(job["n"]),
            job["batch_size"],
            seed=job["seed"],
            num_workers=1,
            collate=torch.utils.data.default_collate,
        )
        ranks = _gather([loader.sampler.rank, loader.sampler.world_size])
        seen = _gather(_flat(loader))
        if rank == 0:
            Path(job["out"]).write_text(json.dumps({"ranks": ranks, "seen": seen}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
