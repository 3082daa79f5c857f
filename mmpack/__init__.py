"""mmpack: a memory-mapped, random-access token index for language-model training.

::

    documents ──build──▶ TokenStore (tokens + offsets on disk, memory-mapped)
                             │
             ┌───────────────┼──────────────────┐
       WindowDataset    PackedDataset       StreamingPacker (sources that can't be indexed)
     (seqlen, stride)  (best-fit bins)
             └──────┬────────┘
                 Mixture (weighted, random access)
                    │
          ResumableSampler ──▶ DataLoader ──▶ mmpack.collate.collate ──▶ model

Everything else is reached by module path (``mmpack.ingest``, ``mmpack.collate``,
``mmpack.attention``, ``mmpack.plan``...).  ``ResumableSampler`` and ``StreamingPacker`` import
torch on first use, so ``import mmpack`` stays light.
"""

from __future__ import annotations

from typing import Any

from mmpack.errors import FormatError, MmpackError, StateMismatchError
from mmpack.mixture import Mixture
from mmpack.packed import PackedDataset
from mmpack.permutation import Permutation
from mmpack.store import TokenStore, build
from mmpack.store import open_store as open
from mmpack.window import WindowDataset

__all__ = [
    "FormatError",
    "Mixture",
    "MmpackError",
    "PackedDataset",
    "Permutation",
    "ResumableSampler",
    "StateMismatchError",
    "StreamingPacker",
    "TokenStore",
    "WindowDataset",
    "build",
    "open",
]

assert sorted(__all__) == __all__

_LAZY = {"ResumableSampler": "mmpack.sampler", "StreamingPacker": "mmpack.streaming"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpack' has no attribute {name!r}")
