"""``mmpack show --position P``: which sample a training run served at a global position.

A run's :class:`~mmpack.ResumableSampler` walks epoch 0's order, then epoch 1's,
each an order of the view's ``n`` samples.  The *global position* is the sampler's own (what
``skip`` and ``replay`` take): ``P = e * n + g``, position ``g`` of epoch ``e``'s order, served
by rank ``g % W`` of ``W`` ranks as its ``(g // W)``-th sample of the epoch (a position
``--drop-last`` drops was served by no rank).  With ``--epoch E`` the position is ``g`` itself;
with ``--rank R``, ``P`` counts rank ``R``'s own samples (``e * len(sampler) + t``, at ``g = t *
W + R``), what a rank's step counter times its batch size gives.

``--state FILE`` describes the run instead of the flags: the state a training loop saves (JSON
or ``torch.save``'s ``.pt``) of ``mmpack.torch.loader``, a ``ResumableSampler`` or ``Stages``
(then ``P`` is a position of the stage it was saved in, over that stage's view).  It gives the
order, seed, ``drop_last``, world size (``--world-size`` may name another) and its skips and
replays; a run over another dataset than the view is refused (``--index-only`` describes it down
to its dataset's index).  Epoch ``e`` then deals its *stream*
(:mod:`mmpack._src.sampling.sampler_edits`): ``g`` is served at stream index ``s`` (``g`` less the
skips before it, plus the replays inserted before it), by rank ``s % W``; a stream index may
hold a replay of an earlier position, which the line names.

The sample is the one the sampler's own arithmetic computes
(:class:`~mmpack._src.sampling.dealing.Dealing`; torch is not imported), shown as ``show -i`` shows
it.  Cost: the view, the block bounds with ``--shuffle blocks`` (O(blocks)), the stream
(O(edits log edits)) and one index (O(1)); ``python -m benchmarks.bench_provenance``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

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
    "state": "--state",
    "index_only": "--index-only",
}
_IN_STATE = ("--seed", "--shuffle", "--window-blocks", "--drop-last")  # what a state records
_BLOCK_BYTES = 1 << 22


def check_run_flags(args: argparse.Namespace) -> None:
    """``ValueError`` for a sampler option given with ``-i``, an option ``--state`` records
    given with it, or a block option without ``--shuffle blocks``: they describe the run of
    ``--position`` only."""
    given = [flag for dest, flag in _RUN_FLAGS.items() if getattr(args, dest) is not None]
    if args.position is None and given:
        raise ValueError(f"{given[0]} describes the run of --position; -i takes no run")
    if args.state is not None:
        recorded = [f for f in _IN_STATE if f in given]
        if recorded:
            raise ValueError(f"{recorded[0]} is recorded by --state {args.state}; drop it")
        return
    blocks = [f for f in ("--block-bytes", "--window-blocks") if f in given]
    if blocks and args.shuffle != "blocks":
        raise ValueError(f"{blocks[0]} is for --shuffle blocks")


def served_at(args: argparse.Namespace, ds: Any) -> tuple[int | None, str]:
    """``(index, line)``: the index of ``ds`` the run of ``args`` served at ``args.position``
    and a line that says where it lies (stage, epoch, epoch position, rank, the rank's
    position); ``index`` None for a state of a run over another dataset (the line then names the
    index of that dataset)."""
    n = len(ds)
    state, stage = (None, "") if args.state is None else _load_state(args.state)
    other = args.index_only and state is not None and state["n"] != n
    if other:
        assert state is not None
        if state["shuffle"] == "blocks":
            raise ValueError(
                f"--state {args.state} is of a run over {state['n']} samples in block order, "
                f"and the view has {n}: its block bounds are its dataset's; give that dataset's "
                "view (a mixture's order is found with Mixture.block_bounds in Python)"
            )
        n = state["n"]
    if n == 0:
        raise ValueError("the view has no samples; no run served any position")
    world = args.world_size or (1 if state is None else state["world_size"])
    if args.rank is not None and args.rank >= world:
        raise ValueError(f"--rank {args.rank} needs --world-size above it, got {world}")
    deal = _dealing(args, ds, n, world, 0 if args.rank is None else args.rank, state)
    if deal.share(0 if args.epoch is None else args.epoch) == 0 and deal.edits.empty:
        raise ValueError(
            f"with --drop-last and --world-size {world} the view's {n} samples give no rank any"
        )
    if args.rank is None:
        epoch, g = _epoch_step(args, n)
        s = deal.served_index(epoch * n + g)
        if s is None:
            raise ValueError(
                f"global position {epoch * n + g} is skipped by the run's state (skips "
                f"{deal.edits.skips}): no rank served it"
            )
        rank, t = s % world, s // world
        share = deal.share(epoch)
        if t >= share:
            raise ValueError(
                f"epoch position {g} is dropped by --drop-last at --world-size {world} "
                f"(each rank serves {share} of the epoch's {deal.edits.length(epoch)}): no rank "
                "served it"
            )
        deal.rank = rank
    else:
        epoch, t = _rank_step(args, deal)
        rank, s = args.rank, t * world + args.rank
    index = int(deal.lookup(t, t + 1, epoch)[0][0])
    where = f"epoch position {s}" if deal.edits.empty else _stream_place(deal, epoch, s)
    line = (
        f"position {args.position}: {stage}epoch {epoch}, {where}, rank {rank} of {world} "
        f"(its sample {t} of the epoch) -> sample {index}"
    )
    if args.index_only:
        return None, (
            f"{line} of the run's dataset ({n} samples; for a mixture, "
            "Mixture.source_of(index) names the source and its item)"
        )
    return index, line


_GIVE = (
    "give the state your loop saved: mmpack.torch.loader's state_dict() (over a view, a mixture "
    "or Stages), a ResumableSampler's or a Stages', as JSON or the file torch.save wrote"
)
_STAGES_FIELDS = {"version", "unit", "stages", "stage", "served", "step", "edits", "sampler"}


def _load_state(path: str) -> tuple[dict[str, Any], str]:
    """``(sampler state, stage)``: the checked sampler state the file ``path`` holds and, for a
    Stages run, ``"stage S, "`` (``FormatError`` naming the file and what to give)."""
    from mmpack._src.sampling.sampler_state import checked_state
    from mmpack.errors import FormatError

    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"PK" or data[:1] == b"\x80":  # a zip or a pickle: what torch.save writes
        try:
            from mmpack._src.torch.loading import read_state_file
        except ImportError:
            raise FormatError(
                f"--state {path} was written by torch.save, and reading it needs torch; save the "
                "state as JSON (json.dump(loader.state_dict(), f))"
            ) from None
        raw = read_state_file(path)
    else:
        try:
            raw = json.loads(data.decode("utf-8"))
        except ValueError as e:
            raise FormatError(f"--state {path} is neither JSON nor a torch.save file ({e}); "
                              f"{_GIVE}") from None  # fmt: skip
    state, stage = _sampler_of(raw, path)
    try:
        return checked_state(state), stage
    except FormatError as e:
        raise FormatError(f"--state {path}: {e}; {_GIVE}") from None


def _sampler_of(raw: Any, path: str) -> tuple[Any, str]:
    """The sampler state in a loader's, a Stages' or a sampler's state, and ``"stage S, "``."""
    from mmpack.errors import FormatError

    if isinstance(raw, dict) and raw.get("kind") == "mmpack.torch.loader":
        if "stages" in raw:
            raw = raw["stages"]
        elif "sampler" in raw:
            return raw["sampler"], ""
    if isinstance(raw, dict) and set(raw) == _STAGES_FIELDS:
        stage, signature = raw["stage"], raw["stages"]
        if isinstance(signature, list) and isinstance(stage, int) and stage >= len(signature):
            raise FormatError(f"--state {path} is of a Stages run that is over: no stage is next")
        return raw["sampler"], f"stage {stage}, "
    if not isinstance(raw, dict):
        raise FormatError(f"--state {path} holds a {type(raw).__name__}; {_GIVE}")
    return raw, ""


def _dealing(args: argparse.Namespace, ds: Any, n: int, world: int, rank: int, state: Any) -> Any:
    """The :class:`~mmpack._src.sampling.dealing.Dealing` of rank ``rank`` of the run ``args`` (or
    the ``state``) describes."""
    from mmpack._src.sampling.block_order import BlockOrder
    from mmpack._src.sampling.dealing import Dealing
    from mmpack._src.sampling.sampler_edits import EditLog
    from mmpack._src.sampling.sampler_state import check_config
    from mmpack.errors import StateMismatchError

    if state is None:
        shuffle: Any = "blocks" if args.shuffle == "blocks" else args.shuffle != "false"
        seed, drop_last, window_blocks = args.seed or 0, bool(args.drop_last), args.window_blocks
    else:
        shuffle, seed, drop_last = state["shuffle"], state["seed"], state["drop_last"]
        window_blocks = state["window_blocks"]
    order = None
    if shuffle == "blocks":
        bounds = ds.block_bounds(args.block_bytes or _BLOCK_BYTES)
        options = {} if window_blocks is None else {"window_blocks": window_blocks}
        order = BlockOrder(n, bounds, seed=seed, **options)
    edits = EditLog(n)
    if state is not None:
        ours = {**state, "n": n, "n_blocks": None if order is None else order.n_blocks}
        ours["bounds_digest"] = None if order is None else order.digest
        try:
            check_config(state, ours)  # the view's n and block bounds are the run's
        except StateMismatchError as e:
            raise StateMismatchError(
                f"{e} (the view's); a run over a mixture or another view: --index-only names the "
                "index of its dataset"
            ) from None
        edits = EditLog.from_state(n, state["skips"], state["replays"])
    return Dealing(
        n,
        shuffle=bool(shuffle),
        seed=seed,
        rank=rank,
        world_size=world,
        drop_last=drop_last,
        order=order,
        edits=edits,
    )


def _stream_place(deal: Any, epoch: int, s: int) -> str:
    """Where stream index ``s`` of ``epoch`` lies: the global position it serves (padding
    wraps around to the stream's start), and whether that is a replay."""
    stream = deal.edits.stream(epoch)
    piece, position = stream.locate(np.array([s % stream.length], dtype=np.int64))
    k = int(piece[0])
    g = stream.epochs[k] * deal.n + int(position[0])
    return f"stream index {s} (global position {g}{'' if stream.original[k] else ', a replay'})"


def _rank_step(args: argparse.Namespace, deal: Any) -> tuple[int, int]:
    """``(epoch, t)`` of rank ``args.rank``'s ``args.position``-th sample."""
    if args.epoch is None:
        return deal.rank_epoch(args.position)
    share = deal.share(args.epoch)
    if args.position >= share:
        raise ValueError(
            f"--position {args.position} is past epoch {args.epoch}, which has {share} positions "
            f"for rank {args.rank}; without --epoch positions run on across epochs"
        )
    return args.epoch, args.position


def _epoch_step(args: argparse.Namespace, length: int) -> tuple[int, int]:
    """``(epoch, position in it)`` of ``args.position`` over epochs of ``length`` positions."""
    if args.epoch is None:
        return divmod(args.position, length)
    if args.position >= length:
        raise ValueError(
            f"--position {args.position} is past epoch {args.epoch}, which has {length} positions"
            "; without --epoch positions run on across epochs"
        )
    return args.epoch, args.position
