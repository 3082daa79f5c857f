"""Fingerprints of configurations: one digest rule for what decides a dataset's samples.

:func:`config_fingerprint` hashes the ``repr`` of a kind and its parts (ints, floats, strings,
tuples of them, other fingerprints) with SHA-256 and keeps 32 hex digits.  The views, mixtures
and stages name what decides their samples this way, and the samplers record it in their states
(:mod:`mmpack._src.sampling.sampler_state`).  Cost: one hash of a few hundred bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["config_fingerprint"]


def config_fingerprint(kind: str, *parts: Any) -> str:
    """32 hex digits naming ``kind`` configured by ``parts`` (plain values whose ``repr`` is
    stable across processes and runs: no objects, no sets)."""
    return hashlib.sha256(repr((kind, *parts)).encode()).hexdigest()[:32]
