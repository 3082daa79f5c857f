"""mmpack.torch.loader: one call to a resumable StatefulDataLoader; its state resumes exactly after
a kill, at another worker count and at another world size.

Window ``i`` of the store below holds the tokens ``4i .. 4i + 3``, so ``input_ids[:, 0] // 4`` names
the samples of a batch.

Run: ``pytest tests/torch/test_loading.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from _paths import ROOT
from torchdata.stateful_dataloader import StatefulDataLoader

import mmpack
import mmpack.torch
from mmpack import ResumableSampler
from mmpack.errors import FormatError, StateMismatchError
from mmpack.torch import Collator, ResumableLoader, collate

N, SEQLEN = 50, 4


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "w.mmpack"
    mmpack.build(path, [np.arange(N * SEQLEN + 1, dtype=np.int32)])
    return path


@pytest.fixture(scope="module")
def view(store_path):
    return mmpack.WindowDataset(mmpack.open(store_path), seqlen=SEQLEN, stride=SEQLEN)


def _ids(batch) -> list[int]:
    return (batch["input_ids"][:, 0] // SEQLEN).tolist()


def test_one_call_gives_a_stateful_loader_with_the_sampler_and_collate(view):
    loader = mmpack.torch.loader(view, 8, seed=5)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, ResumableLoader)
    assert isinstance(loader.sampler, ResumableSampler) and loader.sampler.seed == 5
    assert loader.collate_fn is collate and loader.num_workers == 0
    assert loader.pin_memory == torch.cuda.is_available()
    order = list(ResumableSampler(N, seed=5))
    batches = list(loader)
    assert [i for b in batches for i in _ids(b)] == order
    want = collate([view[i] for i in order[:8]])
    assert batches[0]["input_ids"].dtype == torch.int64
    assert torch.equal(batches[0]["input_ids"], want["input_ids"])
    assert batches[0]["cu_seqlens"].tolist() == want["cu_seqlens"].tolist()


def test_no_warning_from_torchdata_on_any_pass(view):
    """torchdata's constructor calls ``torch.set_vital``, which torch deprecates with a warning a
    user cannot act on; mmpack's loader silences that one and nothing else."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for workers in (0, 1):
            loader = mmpack.torch.loader(view, 8, num_workers=workers)
            for _ in range(2):
                assert len(list(loader)) == -(-N // 8)
    assert [str(w.message) for w in caught] == []
    with pytest.warns(UserWarning, match="set_vital"):  # torch still warns outside the loader
        torch.set_vital("Dataloader", "enabled", "True")


def test_workers_are_persistent_and_give_the_same_batches(view):
    loader = mmpack.torch.loader(view, 8, num_workers=2, collate=Collator(dtype=torch.int32))
    assert loader.persistent_workers and loader.num_workers == 2
    first = [_ids(b) for b in loader]
    assert [i for b in first for i in b] == list(ResumableSampler(N, seed=0))
    second = [i for b in loader for i in _ids(b)]
    assert second == list(ResumableSampler(N, seed=0).indices(0, N, epoch=1))  # the next epoch


def test_every_complete_pass_is_the_next_epoch_and_set_epoch_chooses(view):
    loader = mmpack.torch.loader(view, 16, shuffle=True)
    passes = [[i for b in loader for i in _ids(b)] for _ in range(2)]
    sampler = ResumableSampler(N, seed=0)
    assert passes[0] == list(sampler)
    sampler.set_epoch(1)
    assert passes[1] == list(sampler)
    assert loader.state_dict()["sampler"]["epoch"] == 2
    assert loader.state_dict()["sampler"]["position"] == 0
    loader.set_epoch(0)
    assert [i for b in loader for i in _ids(b)] == passes[0]


def _run(loader, batches=None):
    out = []
    for batch in loader:
        out.append(_ids(batch))
        if batches is not None and len(out) == batches:
            break
    return out


@pytest.mark.parametrize("saved_workers, resumed_workers", [(2, 0), (2, 1), (0, 2), (2, 2)])
def test_a_state_loads_at_another_worker_count_exactly(view, saved_workers, resumed_workers):
    full = _run(mmpack.torch.loader(view, 4, seed=1, num_workers=saved_workers))
    first = mmpack.torch.loader(view, 4, seed=1, num_workers=saved_workers)
    seen = _run(first, 3)  # the workers have prefetched more than 3 batches
    state = first.state_dict()
    assert state["sampler"]["position"] == 12 and state["num_workers"] == saved_workers
    resumed = mmpack.torch.loader(view, 4, seed=1, num_workers=resumed_workers)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["sampler"] == state["sampler"]
    assert seen + _run(resumed) == full


def test_a_plain_stateful_dataloader_state_is_refused_with_a_clear_error(view):
    plain = StatefulDataLoader(view, batch_size=4, num_workers=2, collate_fn=collate)
    it = iter(plain)
    next(it)
    state = plain.state_dict()
    del it
    loader = mmpack.torch.loader(view, 4, num_workers=0)
    with pytest.raises(FormatError, match="not a state of mmpack.torch.loader"):
        loader.load_state_dict(state)
    with pytest.raises(FormatError, match="not a state"):
        loader.load_state_dict([1, 2])
    good = loader.state_dict()
    with pytest.raises(FormatError, match="version 7"):
        loader.load_state_dict({**good, "version": 7})
    with pytest.raises(StateMismatchError, match="seed"):
        mmpack.torch.loader(view, 4, seed=9).load_state_dict(good)


def test_elastic_resume_through_the_sampler(view):
    """Two ranks take 3 batches each; rank 0's state resumes on three ranks: every sample not yet
    seen comes exactly once (plus the padding that evens the ranks' shares)."""
    ranks = [mmpack.torch.loader(view, 4, rank=r, world_size=2) for r in range(2)]
    seen = [i for loader in ranks for b in _run(loader, 3) for i in b]
    state = ranks[0].state_dict()
    rest = []
    for r in range(3):
        resumed = mmpack.torch.loader(view, 4, rank=r, world_size=3, num_workers=r % 2)
        resumed.load_state_dict(state)
        rest += [i for b in _run(resumed) for i in b]
    assert len(set(seen)) == len(seen) == 24
    unseen = set(range(N)) - set(seen)
    assert sorted(i for i in rest if i in unseen) == sorted(unseen)  # each exactly once
    assert len(rest) - len(unseen) <= 2  # padding: at most W2 - 1 repeats of seen samples


def test_bad_arguments(view):
    with pytest.raises(ValueError, match="batch_size"):
        mmpack.torch.loader(view, 0)
    with pytest.raises(ValueError, match="num_workers"):
        mmpack.torch.loader(view, 2, num_workers=-1)
    with pytest.raises(TypeError, match="map-style"):
        mmpack.torch.loader(iter(range(3)), 2)
    with pytest.raises(TypeError, match="collate"):
        mmpack.torch.loader(view, 2, collate="collate")
    with pytest.raises(ValueError, match="rank"):
        mmpack.torch.loader(view, 2, rank=2, world_size=2)


# ----------------------------------------------------------------------------- Stages
def _stages(view, rank=0, world_size=1):
    """5 steps of 4 windows of 4 tokens, then 4 steps of 2 windows of 8."""
    long = mmpack.WindowDataset(view.store, seqlen=8, stride=8)
    return mmpack.Stages([(20, view, 4), (8, long, 2)], seed=3, rank=rank, world_size=world_size)


@pytest.mark.parametrize("saved_workers, resumed_workers", [(2, 0), (0, 2)])
def test_a_stages_state_loads_at_another_worker_count_exactly(view, saved_workers, resumed_workers):
    full = _run(mmpack.torch.loader(_stages(view)))
    assert [len(b) for b in full] == [4] * 5 + [2] * 4
    first = mmpack.torch.loader(_stages(view), num_workers=saved_workers)
    seen = _run(first, 6)  # into the second stage; the workers have prefetched more
    state = first.state_dict()
    assert state["stages"]["step"] == 6 and state["stages"]["stage"] == 1
    assert state["num_workers"] == saved_workers
    resumed = mmpack.torch.loader(_stages(view), num_workers=resumed_workers)
    resumed.load_state_dict(state)
    assert seen + _run(resumed) == full


def test_a_stages_state_loads_at_another_world_size(view):
    first = mmpack.torch.loader(_stages(view))
    _run(first, 3)
    state = first.state_dict()
    for rank in range(2):
        resumed = mmpack.torch.loader(_stages(view, rank, 2), num_workers=rank)
        resumed.load_state_dict(state)
        bare = _stages(view, rank, 2)
        bare.load_state_dict(state["stages"])
        want = [
            [int(bare.dataset[key]["input_ids"][0]) // SEQLEN for key in batch] for batch in bare
        ]
        assert want and _run(resumed) == want


def test_a_stages_pass_cut_short_goes_on_after_the_batches_given(view):
    full = _run(mmpack.torch.loader(_stages(view)))
    loader = mmpack.torch.loader(_stages(view), num_workers=2)
    head = _run(loader, 2)  # the workers prefetched batches the loop never got
    assert head + _run(loader) == full
    assert _run(loader) == [] and loader.state_dict()["stages"]["step"] == 9


def test_a_loader_over_stages_refuses_what_the_run_holds(view):
    stages = _stages(view)
    for given, name in (({"batch_size": 4}, "batch_size"), ({"seed": 1}, "seed"),
                        ({"shuffle": False}, "shuffle"), ({"drop_last": True}, "drop_last")):  # fmt: skip
        with pytest.raises(ValueError, match=f"takes {name} from the Stages run"):
            mmpack.torch.loader(stages, **given)
    with pytest.raises(ValueError, match="deals rank 0 of 1 but this process is rank 1 of 2"):
        mmpack.torch.loader(stages, rank=1, world_size=2)
    with pytest.raises(TypeError, match="needs batch_size"):
        mmpack.torch.loader(view)
    over_stages, over_view = mmpack.torch.loader(stages), mmpack.torch.loader(view, 4)
    with pytest.raises(TypeError, match="no epoch to set"):
        over_stages.set_epoch(1)
    with pytest.raises(FormatError, match="lacks the field 'stages'"):
        over_stages.load_state_dict(over_view.state_dict())
    with pytest.raises(FormatError, match="lacks the field 'sampler'"):
        over_view.load_state_dict(over_stages.state_dict())


_CHILD = """
import json, os, signal, sys
import torch, mmpack, mmpack.torch
view = mmpack.WindowDataset(mmpack.open(sys.argv[1]), seqlen=4, stride=4)
loader = mmpack.torch.loader(view, 4, seed=2, num_workers=2)
out = open(sys.argv[2], "w")
for k, batch in enumerate(loader):
    torch.save(loader.state_dict(), sys.argv[3] + ".tmp")
    os.replace(sys.argv[3] + ".tmp", sys.argv[3])
    out.write(json.dumps((batch["input_ids"][:, 0] // 4).tolist()) + "\\n")
    out.flush()
    if k == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # killed mid-epoch, workers and all
"""


def test_killed_mid_epoch_resumes_exactly(store_path, view, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_CHILD))
    seen_file, state_file = tmp_path / "seen.jsonl", tmp_path / "state.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script), str(store_path), str(seen_file), str(state_file)],
        env=env,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL
    seen = [json.loads(line) for line in seen_file.read_text().splitlines()]
    assert len(seen) == 5
    resumed = mmpack.torch.loader(view, 4, seed=2, num_workers=1)
    resumed.load_state_dict(torch.load(state_file))
    assert seen + _run(resumed) == _run(mmpack.torch.loader(view, 4, seed=2))
