"""mmpack: a memory-mapped, random-access token index for language-model training.

::

    documents ──build──▶ TokenStore (tokens + offsets on disk, memory-mapped)
                             │
             ┌───────────────┼──────────────────┐
       WindowDataset    PackedDataset       StreamingPacker (sources that can't be indexed)
     (seqlen, stride)  (best-fit bins)
             └──────┬────────┘
                 Mixture (weighted, random access; weights may follow a Schedule)
                    │
          ResumableSampler ──▶ DataLoader ──▶ mmpack.torch.collate.collate ──▶ model

Everything else is reached by module path (``mmpack.ingest``, ``mmpack.torch.collate``,
``mmpack.torch.attention``, ``mmpack.packing.plan``...).
"""

from __future__ import annotations

from typing import Any

from mmpack.errors import FormatError, MmpackError, StateMismatchError

__all__ = [
    "FormatError",
    "Mixture",
    "MmpackError",
    "PackedDataset",
    "Permutation",
    "ResumableSampler",
    "Schedule",
    "Stages",
    "StateMismatchError",
    "StreamingPacker",
    "TokenStore",
    "WindowDataset",
    "build",
    "join",
    "open",
]

assert sorted(__all__) == __all__

# The adapters beside the store core register their kinds of store (URLs, other tools' formats,
# joins) in mmpack.store.registry; their package files import nothing heavy.  The detectors
# they register answer for disjoint kinds of path (a folder holding mmpack-join.json, a
# Megatron PREFIX with PREFIX.idx beside it, a .npy file), so their order does not matter.
import mmpack.formats  # noqa: E402
import mmpack.joins  # noqa: E402
import mmpack.remote  # noqa: E402, F401

# Everything but the errors loads on first use, so ``import mmpack`` (and ``mmpack --help``)
# never pays for numba, zarr or torch.
_LAZY: dict[str, str | tuple[str, str]] = {
    "Mixture": "mmpack.sampling.mixture",
    "PackedDataset": "mmpack.views.packed",
    "Permutation": "mmpack.sampling.permutation",
    "ResumableSampler": "mmpack.torch.sampler",
    "Schedule": "mmpack.sampling.schedule",
    "Stages": "mmpack.torch.stages",
    "StreamingPacker": "mmpack.streaming.packer",
    "TokenStore": "mmpack.store.reader",
    "WindowDataset": "mmpack.views.window",
    "build": "mmpack.store.writer",
    "join": "mmpack.joins.join",
    "open": ("mmpack.store.reader", "open_store"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        import importlib.util

        entry = _LAZY[name]
        module, attr = entry if isinstance(entry, tuple) else (entry, name)
        value = getattr(importlib.import_module(module), attr)
        if name == "StreamingPacker" and importlib.util.find_spec("torch") is not None:
            # With torch installed the packer is a DataLoader dataset from the first use:
            # the torch layer registers it as an IterableDataset.
            importlib.import_module("mmpack.torch.streaming")
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
