"""Rank function for tests/torch/test_streaming.py (module level: ``torch.multiprocessing.spawn``
pickles it by name).  Each rank joins a gloo group through a file on the test's tmp dir (gloo's
sockets on loopback through ``GLOO_SOCKET_IFNAME=lo``), iterates
``DataLoader(StreamingPacker(store), batch_size=None, num_workers=1)`` with no rank given (the
packer takes it from torch.distributed), and all-gathers the documents it saw; rank 0 writes them
as JSON for the test to check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

import mmpack
import mmpack._src.torch.streaming
from mmpack import StreamingPacker


def run_rank(rank: int, world_size: int, job: dict) -> None:
    assert os.environ.get("GLOO_SOCKET_IFNAME") == "lo"
    dist.init_process_group(
        "gloo", init_method=f"file://{job['init_file']}", rank=rank, world_size=world_size
    )
    try:
        packer = StreamingPacker(mmpack.open(job["store"]), **job["kwargs"])
        seen = []
        for batch in DataLoader(packer, batch_size=None, num_workers=1):
            for row, cu in enumerate(batch["cu_seqlens"]):
                cu = cu.tolist()
                for a, b in zip(cu[:-1], cu[1:]):
                    if batch["attention_mask"][row, a] != 0:
                        seen.append(batch["input_ids"][row, a:b].tolist())
        gathered: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, seen)
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(gathered))
        dist.barrier()
    finally:
        dist.destroy_process_group()
