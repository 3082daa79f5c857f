"""Old module paths keep working for one release, with a ``DeprecationWarning``.

mmpack's modules moved into one folder per layer (``mmpack.writer`` is now
``mmpack.store.writer``, ``mmpack.collate`` is ``mmpack.torch.collate``...).  A meta-path finder
answers an import of an old path with a small alias module whose names are those of the new
module (the same objects, so ``isinstance`` checks and pickles made with the old paths still work)
and warns once per old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "mmpack.attention": "mmpack.torch.attention",
    "mmpack.backends": "mmpack.store.backends",
    "mmpack.backends._base": "mmpack.store.backends._base",
    "mmpack.backends._memmap": "mmpack.store.backends._memmap",
    "mmpack.backends._zarr": "mmpack.store.backends._zarr",
    "mmpack.batch": "mmpack.views.batch",
    "mmpack.buffers": "mmpack.views.buffers",
    "mmpack.collate": "mmpack.torch.collate",
    "mmpack.demo": "mmpack.cli.demo",
    "mmpack.format": "mmpack.store.format",
    "mmpack.masking": "mmpack.views.masking",
    "mmpack.microbatch": "mmpack.streaming.microbatch",
    "mmpack.mixture": "mmpack.sampling.mixture",
    "mmpack.packed": "mmpack.views.packed",
    "mmpack.permutation": "mmpack.sampling.permutation",
    "mmpack.plan": "mmpack.views.plan",
    "mmpack.prefetch": "mmpack.streaming.prefetch",
    "mmpack.sampler": "mmpack.torch.sampler",
    "mmpack.schedules": "mmpack.streaming.schedules",
    "mmpack.stream_sources": "mmpack.streaming.sources",
    "mmpack.tokenizer": "mmpack.ingest.tokenizer",
    "mmpack.validation": "mmpack.core.validation",
    "mmpack.window": "mmpack.views.window",
    "mmpack.writer": "mmpack.store.writer",
}
"""Old module path -> where it lives now."""


class _Alias(types.ModuleType):
    """A module whose attributes are those of ``target`` (looked up on access)."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self.__dict__["_target"] = target
        self.__all__ = list(getattr(target, "__all__", []))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.__dict__["_target"], attr)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_target"])


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=False)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path works for one more release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _Alias(spec.name, importlib.import_module(new))

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(
            0, _MovedFinder()
        )  # before PathFinder: submodules of a moved package resolve here too
