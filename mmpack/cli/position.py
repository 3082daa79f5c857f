"""``mmpack show --position P``: which sample a training run served at a global position.

A run's :class:`~mmpack.torch.sampler.ResumableSampler` walks epoch 0's order, then epoch 1's,
and so on, each an order of the view's ``n`` samples.  The *global position* is the sampler's own
(what :meth:`ResumableSampler.skip <mmpack.torch.sampler.ResumableSampler.skip>` and ``replay``
take):

    ``P = e * n + g``: position ``g`` of epoch ``e``'s order,

served by rank ``g % W`` of a run of ``W`` ranks, as its ``(g // W)``-th sample of the epoch (the
positions padding adds to fill the last round, or ``--drop-last`` removes, are not global
positions; one that ``--drop-last`` drops was served by no rank).  With ``--epoch E`` the
position is ``g`` itself (``0 <= P < n``); with ``--rank R``, ``P`` counts rank ``R``'s own
samples instead (``e * len(sampler) + t``, at epoch position ``g = t * W + R``), what a rank's
step counter times its batch size gives.  A run's skips and replays are not known here: the
position is that of a run without them.

The sample is then the one the sampler itself computes (:meth:`ResumableSampler.indices
<mmpack.torch.sampler.ResumableSampler.indices>`, the same arithmetic as its iterator), shown as
``show -i`` shows it.  Cost: the view (as ``show -i``), the block bounds with ``--shuffle blocks``
(O(blocks)) and one index (O(1)); importing torch, which the sampler needs, dominates a cold
start (``python -m benchmarks.bench_provenance`` measures both).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__: list[str] = []

_RUN_FLAGS = {
    "seed": "--seed",
    "shuffle": "--shuffle",
    "block_bytes": "--block-bytes",
    "window_blocks": "--window-blocks",
    "world_size": "--world-size",
    "rank": "--rank",
    "epoch": "--epoch",
    "drop_last": "--drop-last",
}
_BLOCK_BYTES = 1 << 22


def check_run_flags(args: argparse.Namespace) -> None:
    """``ValueError`` for a sampler option given with ``-i``, or a block option without
    ``--shuffle blocks``: they describe the run of ``--position`` only."""
    given = [flag for dest, flag in _RUN_FLAGS.items() if getattr(args, dest) is not None]
    if args.position is None and given:
        raise ValueError(f"{given[0]} describes the run of --position; -i takes no run")
    blocks = [f for f in ("--block-bytes", "--window-blocks") if f in given]
    if blocks and args.shuffle != "blocks":
        raise ValueError(f"{blocks[0]} is for --shuffle blocks")


def served_at(args: argparse.Namespace, ds: Any) -> tuple[int, str]:
    """``(index, line)``: the index of ``ds`` the run of ``args`` served at ``args.position``
    and a line that says where it lies (epoch, epoch position, rank, the rank's position)."""
    n = len(ds)
    if n == 0:
        raise ValueError("the view has no samples; no run served any position")
    world = 1 if args.world_size is None else args.world_size
    if args.rank is not None and args.rank >= world:
        raise ValueError(f"--rank {args.rank} needs --world-size above it, got {world}")
    sampler = _sampler(args, ds, n, world, 0 if args.rank is None else args.rank)
    share = len(sampler)  # each rank's samples per epoch
    if share == 0:
        raise ValueError(
            f"with --drop-last and --world-size {world} the view's {n} samples give no rank any"
        )
    if args.rank is None:
        epoch, g = _epoch_step(args, n)
        rank, t = g % world, g // world
        if t >= share:
            raise ValueError(
                f"epoch position {g} is dropped by --drop-last at --world-size {world} "
                f"(each rank serves {share} of the {n} samples): no rank served it"
            )
        if rank:
            sampler = _sampler(args, ds, n, world, rank)
    else:
        epoch, t = _epoch_step(args, share)
        rank = args.rank
        g = t * world + rank
    index = int(sampler.indices(t, t + 1, epoch=epoch)[0])
    line = (
        f"position {args.position}: epoch {epoch}, epoch position {g}, rank {rank} of {world} "
        f"(its sample {t} of the epoch) -> sample {index}"
    )
    return index, line


def _sampler(args: argparse.Namespace, ds: Any, n: int, world: int, rank: int) -> Any:
    """The ``ResumableSampler`` of rank ``rank`` of the run ``args`` describes."""
    from mmpack.torch.sampler import ResumableSampler

    shuffle: Any = "blocks" if args.shuffle == "blocks" else args.shuffle != "false"
    options: dict[str, Any] = {}
    if shuffle == "blocks":
        options["block_bounds"] = ds.block_bounds(args.block_bytes or _BLOCK_BYTES)
        if args.window_blocks is not None:
            options["window_blocks"] = args.window_blocks
    return ResumableSampler(
        n,
        shuffle=shuffle,
        seed=args.seed or 0,
        rank=rank,
        world_size=world,
        drop_last=bool(args.drop_last),
        **options,
    )


def _epoch_step(args: argparse.Namespace, length: int) -> tuple[int, int]:
    """``(epoch, position in it)`` of ``args.position`` over epochs of ``length`` positions."""
    if args.epoch is None:
        return divmod(args.position, length)
    if args.position >= length:
        raise ValueError(
            f"--position {args.position} is past epoch {args.epoch}, which has {length} positions"
            + ("" if args.rank is None else f" for rank {args.rank}")
            + "; without --epoch positions run on across epochs"
        )
    return args.epoch, args.position
