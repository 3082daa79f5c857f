"""``mmpack show --position``: what a run served at a position, from its flags or the state its loader saved."""

from __future__ import annotations

import json
import re

import pytest
from _cli import assert_one_line_error, mmpack_cmd

import mmpack
import mmpack.errors
from mmpack import ResumableSampler
from mmpack.cli import main


@pytest.mark.parametrize(
    "world, shuffle, packed, drop_last",
    [
        (1, "true", False, False),
        (3, "true", True, False),
        (4, "false", False, True),
        (2, "blocks", False, False),
        (3, "blocks", True, True),
    ],
)
def test_show_position_names_what_the_run_served(
    seed_store, capsys, world, shuffle, packed, drop_last
):
    view = ["--seqlen", 8, "--stride", 3, "--eot", 420] + (["--packed"] if packed else [])
    ds = (
        mmpack.PackedDataset(seed_store, 8, eot=420)
        if packed
        else mmpack.WindowDataset(seed_store, 8, 3, eot=420)
    )
    run = ["--seed", 11, "--shuffle", shuffle, "--world-size", world]
    options: dict = {"seed": 11, "shuffle": {"true": True, "false": False}.get(shuffle, shuffle)}
    if shuffle == "blocks":
        run += ["--block-bytes", 16, "--window-blocks", 2]
        options.update(block_bounds=ds.block_bounds(16), window_blocks=2)
    if drop_last:
        run.append("--drop-last")
    want = _run_order(len(ds), 2, world, drop_last, **options)  # what the ranks served, in turn
    n, served = len(ds), len(want) // 2  # global positions per epoch, positions served per epoch
    for p in sorted({0, 1, n - 1, n, 2 * n - 1, 2 * n // 3}):
        e, g = divmod(p, n)  # the sampler's global position: epoch e, epoch position g
        code, got, out, err = _served(seed_store, capsys, *view, *run, "--position", p)
        if g >= served:  # dropped by --drop-last: served by no rank
            assert code == 1 and "no rank served it" in err, err
            continue
        assert code == 0, err
        assert got == want[e * served + g], p
        # the rest is what show -i prints of that sample
        assert main(["show", str(seed_store), *map(str, view), "-i", str(got)]) == 0
        assert out.split("\n", 1)[1] == capsys.readouterr().out
        # --epoch: a position of that epoch; --rank: that rank's own samples
        assert _served(seed_store, capsys, *view, *run, "--epoch", e, "--position", g)[1] == got
        t, r = divmod(g, world)
        own = e * (served // world) + t
        argv = [*view, *run, "--rank", r, "--position", own]
        assert _served(seed_store, capsys, *argv)[1] == got


def test_show_position_refusals_are_one_line(seed_store, capsys):
    view = ["--seqlen", 8, "--eot", 420]
    cases = [
        (["-i", 0, "--seed", 3], "--seed describes the run of --position"),
        (["--position", 0, "--block-bytes", 64], "--block-bytes is for --shuffle blocks"),
        (["--position", 20, "--epoch", 0], "past epoch 0, which has 14 positions"),
        (["--position", 0, "--rank", 2, "--world-size", 2], "--rank 2 needs --world-size"),
        (["--position", 0, "--world-size", 20, "--drop-last"], "give no rank any"),
    ]
    for argv, message in cases:
        code, _, _, err = _served(seed_store, capsys, *view, *argv)
        assert code == 1 and err.count("\n") == 1 and message in err, err
    with pytest.raises(SystemExit):  # argparse: -i and --position are exclusive
        main(["show", str(seed_store), "--seqlen", "8", "-i", "0", "--position", "0"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert_one_line_error(  # as users run it
        mmpack_cmd("show", seed_store, *view, "--position", 14, "--epoch", 0), "past epoch 0"
    )


def test_show_position_takes_the_state_a_loader_saved(seed_store, capsys, tmp_path):
    """The loader's state as the loop saves it (torch.save, or its JSON), over a view, over
    Stages (a position of the stage it was saved in) and over a mixture (down to its index)."""
    import torch

    import mmpack.torch
    from mmpack import Mixture
    from mmpack.torch import stage_seed

    view = ["--seqlen", 8, "--stride", 3, "--eot", 420]
    ds = mmpack.WindowDataset(seed_store, 8, 3, eot=420)
    short = mmpack.WindowDataset(seed_store, 4, eot=420)

    def saved(loader, name, batches):
        for k, _ in enumerate(loader):
            if k + 1 == batches:
                break
        state = loader.state_dict()
        torch.save(state, tmp_path / f"{name}.pt")
        (tmp_path / f"{name}.json").write_text(json.dumps(state))
        return [str(tmp_path / f"{name}{suffix}") for suffix in (".pt", ".json")]

    over_view = saved(mmpack.torch.loader(ds, 2, seed=11, rank=1, world_size=2), "view", 3)
    want = _run_order(len(ds), 2, 2, seed=11)
    stages = mmpack.Stages([(6, short, 2), (40, ds, 2)], seed=4)
    over_stages = saved(mmpack.torch.loader(stages), "stages", 5)  # 2 steps into stage 1
    stage_order = _run_order(len(ds), 2, 1, seed=stage_seed(4, 1))
    mix = Mixture([ds, ds], [1, 1])
    over_mixture = saved(mmpack.torch.loader(mix, 2), "mixture", 1)
    for path in (*over_view, *over_stages):
        for p in (0, 5, len(ds) + 1):
            code, got, out, err = _served(
                seed_store, capsys, *view, "--state", path, "--position", p
            )
            assert code == 0, err
            if path in over_view:
                e, g = divmod(p, len(ds))
                assert got == want[e * (len(want) // 2) + g] and "rank " in out
            else:
                assert got == stage_order[p] and out.startswith(f"position {p}: stage 1")
    for path in over_mixture:
        code, _, _, err = _served(seed_store, capsys, *view, "--state", path, "--position", 3)
        assert code == 1 and f"n={len(mix)}" in err, err  # not the view's run
        argv = [*view, "--state", path, "--index-only", "--position", 3]
        code, _, out, err = _served(seed_store, capsys, *argv)
        index = int(list(ResumableSampler(len(mix), seed=0))[3])
        assert code == 0 and out.count("\n") == 1, err
        assert f"-> sample {index} of the run's dataset ({len(mix)} samples" in out
    (tmp_path / "other.json").write_text(json.dumps({"step": 3}))
    (tmp_path / "junk.bin").write_bytes(bytes(range(200, 256)))
    for path, message in ((tmp_path / "other.json", "lacks the fields"),
                          (tmp_path / "junk.bin", "neither JSON nor a torch.save file")):  # fmt: skip
        code, _, _, err = _served(seed_store, capsys, *view, "--state", path, "--position", 0)
        assert code == 1 and message in err and "give the state your loop saved" in err, err
        assert err.count("\n") == 1


def test_show_position_follows_a_states_skips_and_replays(seed_store, capsys, tmp_path):
    view = ["--seqlen", 8, "--stride", 3, "--eot", 420]
    n, world = len(mmpack.WindowDataset(seed_store, 8, 3, eot=420)), 2
    run = ResumableSampler(n, seed=11, world_size=world)
    drawn = iter(run)
    [next(drawn) for _ in range(3)]  # the ranks have consumed positions 0..5
    run.replay(1, 4)  # e.g. after a restore: served again next
    run.skip(7, 10)  # a loss spike's positions, never served
    run.skip(n + 2, n + 4)  # and two of epoch 1
    state = run.state_dict()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    shares = []  # what each rank's own iterator serves over two epochs, from epoch 0's start
    for rank in range(world):
        sampler = ResumableSampler(n, seed=11, world_size=world, rank=rank)
        sampler.load_state_dict({**state, "rank": rank, "position": 0, "offset": 0})
        own = [int(i) for i in sampler]
        sampler.set_epoch(1)
        shares.append((own, [int(i) for i in sampler]))
    for p in range(2 * n):
        e = p // n
        code, got, out, err = _served(seed_store, capsys, *view, "--state", path, "--position", p)
        positions = _stream_positions(n, e, state)
        if p not in positions:
            assert code == 1 and "is skipped" in err and "no rank served it" in err, err
            continue
        assert code == 0, err
        s = positions.index(p)  # served first in the epoch's own order, then replayed
        assert got == shares[s % world][e][s // world], p
        assert f"stream index {s} (global position {p})," in out
    for rank in range(world):
        own = shares[rank][0] + shares[rank][1]
        for t in range(len(own)):
            argv = [*view, "--state", path, "--rank", rank, "--position", t]
            code, got, out, err = _served(seed_store, capsys, *argv)
            assert code == 0 and got == own[t], (rank, t, err)
            e, u = (0, t) if t < len(shares[rank][0]) else (1, t - len(shares[rank][0]))
            positions = _stream_positions(n, e, state)
            s = u * world + rank
            replayed = s < len(positions) and positions.index(positions[s]) != s
            assert (", a replay)" in out) == replayed, out
    code, _, _, err = _served(
        seed_store, capsys, *view, "--state", path, "--seed", 1, "--position", 0
    )
    assert code == 1 and "--seed is recorded by --state" in err, err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**state, "n": n + 1}))
    code, _, _, err = _served(seed_store, capsys, *view, "--state", other, "--position", 0)
    assert code == 1 and f"n={n + 1}" in err and err.count("\n") == 1, err


def _served(store, capsys, *argv):
    """``show --position ...`` in process: (exit code, the sample it names, stdout, stderr)."""
    code = main(["show", str(store), *map(str, argv)])
    out, err = capsys.readouterr()
    found = re.search(r"-> sample (\d+)$", out.splitlines()[0]) if code == 0 else None
    return code, int(found.group(1)) if found else None, out, err


def _run_order(n, epochs, world, drop_last=False, **options):
    """The naive list model of a run: every (global position -> sample) over ``epochs``, from
    each rank's own iterator, interleaved as the ranks consume the epoch order together."""
    served = []
    for epoch in range(epochs):
        shares = []
        for rank in range(world):
            sampler = ResumableSampler(
                n, rank=rank, world_size=world, drop_last=drop_last, **options
            )
            sampler.set_epoch(epoch)
            shares.append([int(i) for i in sampler])
        served += [shares[g % world][g // world] for g in range(world * len(shares[0]))]
    return served


def _stream_positions(n, epoch, state):
    """The naive list model of epoch ``epoch``'s stream: its global positions in serving order,
    the state's replays inserted where it says, its skipped positions removed."""
    raw = [epoch * n + j for j in range(n)]
    for e, at, a, b in state["replays"]:
        if e == epoch:
            raw[at:at] = list(range(a, b))
    return [p for p in raw if not any(a <= p < b for a, b in state["skips"])]
