"""The kernel behind a window view's ``ds[i]``: its compiled entry, or the fallback on arrays.

``ds[i]`` calls ``kernel(meta, src_dtype, v, out[, cu])``: the compiled entry
(:func:`mmpack.kernels.entry.entry_point`) of :func:`~mmpack.kernels.window.one_window_at`
(int64 output: ``cu`` is a second, int32, array) or
:func:`~mmpack.kernels.window.one_window_at_flat` (int32 output: ``cu`` is the tail of ``out``),
which take the token and offsets mappings as addresses written into ``meta`` here: two array
arguments (one with int32 output) instead of four, ~40 ns a call each.  The view holds both
mappings for its lifetime, so the addresses stay valid; they are written only for plain
C-contiguous 1-D arrays of native byte order (int64 offsets).  Otherwise, and where numba does
not compile (``NUMBA_DISABLE_JIT``: an intrinsic has no Python version), the same call runs
:func:`~mmpack.kernels.window.one_window` on the arrays themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from mmpack.kernels.entry import entry_point
from mmpack.kernels.window import META_FIELDS, one_window, one_window_at, one_window_at_flat

__all__ = ["on_arrays", "single_kernel"]

_INT32 = np.dtype(np.int32)


def single_kernel(
    src: np.ndarray, offsets: np.ndarray, meta: np.ndarray, dtype: np.dtype
) -> Callable[..., int]:
    """The single-sample kernel for output ``dtype`` (int64, or int32: ``cu`` in ``out``),
    writing the addresses of ``src`` and ``offsets`` into ``meta[6:10]`` when it uses them.

    Parameters
    ----------
    src : ndarray, (n_tokens,)
        The flat token mapping, held by the caller for as long as the kernel is used.
    offsets : ndarray, int64, (n_docs + 1,)
        The document offsets mapping, held likewise.
    meta : ndarray, int64
        :func:`~mmpack.kernels.window.one_window`'s ``meta`` (fields 6 to 9 are written here).
    dtype : numpy dtype
        The view's output type: int64 or int32.
    """
    flat = dtype == _INT32
    plain = all(a.ndim == 1 and a.flags.c_contiguous and a.dtype.isnative for a in (src, offsets))
    if plain and offsets.dtype == np.int64:
        out = np.empty(1, dtype)
        if flat:
            entry = entry_point(one_window_at_flat, meta, src.dtype, 0, out)
        else:
            entry = entry_point(one_window_at, meta, src.dtype, 0, out, np.empty(1, _INT32))
        if entry not in (one_window_at, one_window_at_flat):
            meta[6:META_FIELDS] = [src.ctypes.data, src.shape[0], offsets.ctypes.data, len(offsets)]
            return entry
    return partial(on_arrays, src, offsets)


def on_arrays(
    src: np.ndarray,
    offsets: np.ndarray,
    meta: np.ndarray,
    dtype: Any,
    v: int,
    out: np.ndarray,
    cu: np.ndarray | None = None,
) -> int:
    """:func:`~mmpack.kernels.window.one_window_at` (``cu`` given) or
    :func:`~mmpack.kernels.window.one_window_at_flat` (``cu`` in ``out``) computed by
    :func:`~mmpack.kernels.window.one_window` on the arrays themselves (``dtype`` unused)."""
    if cu is None:
        cut = int(meta[3] + meta[2])
        cu = out[cut : cut + int(meta[2]) + 1]
    return int(one_window(src, offsets, meta, v, out, cu))
