"""Join helpers for the join tests: a small random corpus, parts built from slices of it, and a
manifest edited in place."""

from __future__ import annotations

import itertools
import json

import numpy as np

import mmpack
from mmpack._src.joins.parts import JOIN_FILE


def corpus(n=60, seed=0):
    """``n`` documents of 0 to 39 random tokens under 500."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 500, rng.integers(0, 40)) for _ in range(n)]


def parts_on_disk(root, docs, cuts, backend_of=lambda k: "memmap"):
    """Stores ``root/p0``, ``root/p1``, ... of ``docs[cuts[k]:cuts[k + 1]]``; their paths."""
    paths = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        p = root / f"p{k}"
        mmpack.build(p, docs[a:b], backend=backend_of(k))
        paths.append(p)
    return paths


def edit_manifest(folder, edit):
    """Rewrite a join's manifest with ``edit`` applied to its parsed JSON."""
    manifest = folder / JOIN_FILE
    raw = json.loads(manifest.read_text())
    edit(raw)
    manifest.write_text(json.dumps(raw))
