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
          ResumableSampler ──▶ DataLoader ──▶ mmpack.torch.collate ──▶ model

Everything else is in the public modules beside the root: :mod:`mmpack.torch`,
:mod:`mmpack.ingest`, :mod:`mmpack.packing`, :mod:`mmpack.sampling`, :mod:`mmpack.store`,
:mod:`mmpack.formats`, :mod:`mmpack.cli` and :mod:`mmpack.errors`; ``mmpack._src`` is the
implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmpack.errors import FormatError, MmpackError, StateMismatchError

if TYPE_CHECKING:
    from mmpack._src.joins.join import join
    from mmpack._src.sampling.mixture import Mixture
    from mmpack._src.sampling.permutation import Permutation
    from mmpack._src.sampling.schedule import Schedule
    from mmpack._src.store.reader import TokenStore
    from mmpack._src.store.reader import open_store as open
    from mmpack._src.store.writer import build
    from mmpack._src.streaming.packer import StreamingPacker
    from mmpack._src.torch.sampler import ResumableSampler
    from mmpack._src.torch.stages import Stages
    from mmpack._src.views.packed import PackedDataset
    from mmpack._src.views.window import WindowDataset

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
# joins) in mmpack._src.store.registry; their package files import nothing heavy.  The detectors
# they register answer for disjoint kinds of path (a folder holding mmpack-join.json, a
# Megatron PREFIX with PREFIX.idx beside it, a .npy file), so their order does not matter.
import mmpack._src.formats  # noqa: E402
import mmpack._src.joins  # noqa: E402
import mmpack._src.remote  # noqa: E402, F401

# Everything but the errors loads on first use, so ``import mmpack`` (and ``mmpack --help``)
# never pays for numba, zarr or torch.
_LAZY: dict[str, str | tuple[str, str]] = {
    "Mixture": "mmpack._src.sampling.mixture",
    "PackedDataset": "mmpack._src.views.packed",
    "Permutation": "mmpack._src.sampling.permutation",
    "ResumableSampler": "mmpack._src.torch.sampler",
    "Schedule": "mmpack._src.sampling.schedule",
    "Stages": "mmpack._src.torch.stages",
    "StreamingPacker": "mmpack._src.streaming.packer",
    "TokenStore": "mmpack._src.store.reader",
    "WindowDataset": "mmpack._src.views.window",
    "build": "mmpack._src.store.writer",
    "join": "mmpack._src.joins.join",
    "open": ("mmpack._src.store.reader", "open_store"),
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
            importlib.import_module("mmpack._src.torch.streaming")
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
