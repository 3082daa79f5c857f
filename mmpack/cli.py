"""The ``mmpack`` command (:func:`main`) and the two demo helpers notebooks and scripts use:
:func:`compare_packing` (the efficiency table of ``mmpack pack``) and :func:`stdlib_sources` (a
real corpus every Python installation carries).  The helpers load on first use, so
``mmpack --help`` never imports numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmpack._src.cli.commands import main

if TYPE_CHECKING:
    from mmpack._src.cli.demo import compare_packing, stdlib_sources

__all__ = ["compare_packing", "main", "stdlib_sources"]


def __getattr__(name: str) -> Any:
    if name in ("compare_packing", "stdlib_sources"):
        from mmpack._src.cli import demo

        value = getattr(demo, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmpack.cli' has no attribute {name!r}")
