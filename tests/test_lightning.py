"""Lightning with mmpack.torch.loader: a run killed mid-epoch (SIGKILL, after a mid-epoch
checkpoint) and resumed from that checkpoint trains on exactly the batches of an uninterrupted
run, at another worker count.

Run: ``pytest tests/test_lightning.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning  # noqa: F401
import numpy as np
import pytest
from _lightning import Recorder, Windows, trainer

import mmpack

ROOT = Path(__file__).resolve().parents[1]

_KILLED_RUN = """
import json, os, signal, sys
import warnings
warnings.filterwarnings("ignore")
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from _lightning import Recorder, Windows, trainer

store, root, seen_file = sys.argv[1:4]

class Kill(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        with open(seen_file, "w") as f:
            json.dump(module.seen, f)
        if len(module.seen) == 9:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, 4 batches after the checkpoint

checkpoint = ModelCheckpoint(dirpath=root + "/ck", every_n_train_steps=5, save_top_k=-1)
trainer(root, callbacks=[checkpoint, Kill()]).fit(Recorder(), Windows(store, num_workers=2))
"""


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "w.mmpack"
    mmpack.build(path, [np.arange(50 * 4 + 1, dtype=np.int32)])
    return str(path)


def test_killed_mid_epoch_and_resumed_from_the_checkpoint_trains_on_the_same_batches(
    store, tmp_path
):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED_RUN))
    seen_file = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, str(script), store, str(tmp_path / "killed"), str(seen_file)],
        env=env,
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    killed = json.loads(seen_file.read_text())
    assert len(killed) == 9
    ckpt = tmp_path / "killed" / "ck" / "epoch=0-step=5.ckpt"
    assert ckpt.exists(), sorted(os.listdir(ckpt.parent))

    full = Recorder()
    trainer(tmp_path / "full").fit(full, Windows(store, num_workers=0))
    assert len(full.seen) == 2 * 13  # two epochs of 50 windows in batches of 4

    resumed = Recorder()
    trainer(tmp_path / "resumed").fit(resumed, Windows(store, num_workers=1), ckpt_path=ckpt)
    assert killed[:5] + resumed.seen == full.seen
    assert killed[5:9] == resumed.seen[:4]  # the batches after the checkpoint, trained again
