"""A mixture's fingerprint (mmpack._src.sampling.schedule_weights): it changes with each
input (sources, schedule, seed, length, a changed schedule) and survives pickling, in this
process and in another."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np

from mmpack import Mixture, Schedule


def test_fingerprint_changes_with_each_input_and_survives_pickling(tmp_path):
    from reference import _Source as R  # importable without the test's own imports

    sched = Schedule([(0, [0.7, 0.3]), (50, [0.5, 0.5])])
    base = Mixture([R(40), R(30)], sched, seed=1)
    variants = [
        Mixture([R(41), R(30)], sched, seed=1),
        Mixture([R(40), R(30)], Schedule([(0, [0.7, 0.3]), (51, [0.5, 0.5])]), seed=1),
        Mixture([R(40), R(30)], sched, seed=2),
        Mixture([R(40), R(30)], sched, seed=1, num_samples=10),
        Mixture([R(40), R(30)], [0.7, 0.3], seed=1),
        base.with_schedule([0.2, 0.8], from_position=20),
    ]
    prints = {base.fingerprint, *(m.fingerprint for m in variants)}
    assert len(prints) == len(variants) + 1
    assert pickle.loads(pickle.dumps(base)).fingerprint == base.fingerprint
    changed = variants[-1]
    again = pickle.loads(pickle.dumps(changed))
    assert again.fingerprint == changed.fingerprint
    assert again.source_of_many(np.arange(len(again)))[1].tolist() == (
        changed.source_of_many(np.arange(len(changed)))[1].tolist()
    )
    code = (
        "import sys, pickle; sys.path.insert(0, 'tests'); "
        "print(pickle.load(open(sys.argv[1], 'rb')).fingerprint)"
    )
    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(changed))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == changed.fingerprint
