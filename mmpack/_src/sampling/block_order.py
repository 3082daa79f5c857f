"""The block-window order: an exact keyed shuffle that reads whole blocks of consecutive samples.

``bounds = [0, b_1, ..., n]`` cuts ``range(n)`` into ``B`` blocks of consecutive sample ids (block
``j`` holds ``bounds[j] .. bounds[j + 1] - 1``: samples that read one contiguous byte span, see
the views' ``block_bounds``).  Epoch ``e`` of seed ``s``:

1. permutes the blocks with ``sigma = Permutation(B, seed=(s, 1), epoch=e)``;
2. deals them into ``ceil(B / W)`` windows of ``W`` blocks: window ``w`` holds blocks
   ``sigma[w W], ..., sigma[min(w W + W, B) - 1]`` (its *slots*), whose samples, block after
   block in slot order, are the window's local ids ``0 .. m_w - 1``;
3. permutes the samples of each window: position ``q`` of window ``w`` holds its local id
   ``Permutation(m_w, seed=(s, 2, e), epoch=w)[q]``.

Windows follow each other (window ``w`` fills positions ``[O_w, O_{w+1})``).  The epoch order is
a bijection of ``range(n)`` and a pure function of ``(bounds, W, seed, epoch, position)``; with
``W >= B`` it is one keyed permutation of all samples.  Quality: for blocks of ``S`` samples two
distinct positions of one window hold samples of one block with probability ``(S - 1) / (W S -
1)`` (below ``1 / W``), against ``(S - 1) / (n - 1)`` for a global shuffle; for unequal sizes
``S_j`` the rate of window ``w`` is ``sum_j S_j (S_j - 1) / (m_w (m_w - 1))``.

Cost: ``bounds`` (8 bytes per block) plus, per epoch, the window offsets (8 bytes per window,
built in O(B) on the epoch's first lookup); locating a position is two binary searches, O(log
B); a window's slots are built when first needed and a few kept.  Nothing of size ``n`` is ever
materialised.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from mmpack._src.core.constants import WINDOW_BLOCKS
from mmpack._src.core.permutation_keys import MAX_N
from mmpack._src.core.validation import check_block_bounds, check_in_range, check_seed
from mmpack._src.sampling.permutation import Permutation

__all__ = ["BlockOrder", "bounds_digest", "uniform_bounds"]

_BLOCK_STREAM = 1  # seed=(seed, 1): the block permutation
_WINDOW_STREAM = 2  # seed=(seed, 2, epoch), epoch=window: the permutation inside a window
_EPOCHS_KEPT = 2
_WINDOWS_KEPT = 8


def bounds_digest(bounds: np.ndarray) -> int:
    """A 64-bit digest of int64 block bounds (what a sampler state records of them)."""
    data = np.ascontiguousarray(bounds, dtype="<i8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def uniform_bounds(n: int, size: int) -> np.ndarray:
    """Bounds of blocks of ``size`` consecutive samples of ``range(n)`` (the last may be shorter).

    Returns
    -------
    numpy.ndarray, int64, shape (ceil(n / size) + 1,)
    """
    return np.append(np.arange(0, n, size, dtype=np.int64), np.int64(n))


class BlockOrder:
    """Epoch orders of ``range(n)`` that permute blocks, then samples inside windows of blocks.

    Parameters
    ----------
    n : int
        Number of samples, ``0 <= n <= 2**62``.
    bounds : array-like of int, shape (B + 1,)
        ``[0, b_1, ..., n]``, strictly increasing (``[0]`` for ``n = 0``).
    window_blocks : int, default 256
        ``W``, blocks per window (``>= 1``); see the module docstring for what it buys.
    seed : int, default 0
        ``0 <= seed < 2**64``.

    Notes
    -----
    ``order.map(positions, epoch)`` gives the samples at epoch positions; ``window_of`` and
    ``window_slots`` say which window a position falls in and which blocks a window reads, in
    the order it first needs them (what a fetcher of whole blocks asks for).
    """

    def __init__(
        self, n: int, bounds: Any, *, window_blocks: int = WINDOW_BLOCKS, seed: int = 0
    ) -> None:
        self._n = check_in_range(n, "n", 0, MAX_N, closed=True)
        self._bounds = check_block_bounds(bounds, self._n)
        self._window_blocks = check_in_range(window_blocks, "window_blocks", 1, MAX_N, closed=True)
        self._seed = check_seed(seed)
        self._digest = bounds_digest(self._bounds)
        self._sizes = np.diff(self._bounds)
        self._offsets: dict[int, np.ndarray] = {}
        self._windows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, Permutation]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_offsets"], state["_windows"] = {}, {}
        return state

    def __repr__(self) -> str:
        return (
            f"BlockOrder(n={self._n}, blocks={self.n_blocks}, window_blocks={self._window_blocks}, "
            f"seed={self._seed})"
        )

    @property
    def n(self) -> int:
        return self._n

    @property
    def bounds(self) -> np.ndarray:
        """The block bounds; int64, shape (B + 1,), read-only."""
        return self._bounds

    @property
    def n_blocks(self) -> int:
        return int(self._sizes.shape[0])

    @property
    def window_blocks(self) -> int:
        return self._window_blocks

    @property
    def n_windows(self) -> int:
        return -(-self.n_blocks // self._window_blocks)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def digest(self) -> int:
        """:func:`bounds_digest` of the bounds."""
        return self._digest

    # -- windows -------------------------------------------------------------------------------

    def window_offsets(self, epoch: int) -> np.ndarray:
        """First epoch position of each window, then ``n``.

        Returns
        -------
        numpy.ndarray, int64, shape (n_windows + 1,), read-only
        """
        epoch = check_seed(epoch, "epoch")
        offsets = self._offsets.get(epoch)
        if offsets is None:
            nb = self.n_blocks
            offsets = np.zeros(self.n_windows + 1, dtype=np.int64)
            if nb:
                perm = Permutation(nb, seed=(self._seed, _BLOCK_STREAM), epoch=epoch)
                sizes = self._sizes[perm.map_unchecked(np.arange(nb, dtype=np.int64))]
                starts = np.arange(0, nb, self._window_blocks, dtype=np.int64)
                np.cumsum(np.add.reduceat(sizes, starts), out=offsets[1:])
            offsets.flags.writeable = False
            if len(self._offsets) >= _EPOCHS_KEPT:
                self._offsets.clear()
            self._offsets[epoch] = offsets
        return offsets

    def window_slots(self, epoch: int, window: int) -> np.ndarray:
        """Block ids of window ``window`` of epoch ``epoch``, in slot order.

        Returns
        -------
        numpy.ndarray, int64, shape (min(W, B - window * W),)
        """
        epoch = check_seed(epoch, "epoch")
        window = check_in_range(window, "window", 0, max(self.n_windows, 1))
        if self.n_windows == 0:
            raise IndexError("window 0 out of range: the order has no blocks")
        return self._window(epoch, window)[0].copy()

    def _window(self, epoch: int, w: int) -> tuple[np.ndarray, np.ndarray, Permutation]:
        """``(slots, cumulative slot sizes, permutation of the window's samples)``."""
        key = (epoch, w)
        got = self._windows.get(key)
        if got is None:
            lo = w * self._window_blocks
            hi = min(lo + self._window_blocks, self.n_blocks)
            perm = Permutation(self.n_blocks, seed=(self._seed, _BLOCK_STREAM), epoch=epoch)
            slots = perm.map_unchecked(np.arange(lo, hi, dtype=np.int64))
            cum = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(self._sizes[slots], out=cum[1:])
            inner = Permutation(int(cum[-1]), seed=(self._seed, _WINDOW_STREAM, epoch), epoch=w)
            got = (slots, cum, inner)
            if len(self._windows) >= _WINDOWS_KEPT:
                self._windows.clear()
            self._windows[key] = got
        return got

    def _check_positions(self, positions: Any) -> np.ndarray:
        arr = np.asarray(positions)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"positions must be an integer array, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self._n):
            raise IndexError(
                f"positions must lie in [0, {self._n}), got values in "
                f"[{int(arr.min())}, {int(arr.max())}]"
            )
        return arr

    def window_of(self, positions: Any, epoch: int) -> np.ndarray:
        """Window of each epoch position; int64 array of the shape of ``positions``."""
        arr = self._check_positions(positions)
        offsets = self.window_offsets(epoch)
        return np.searchsorted(offsets, arr, side="right").astype(np.int64) - 1

    # -- samples -------------------------------------------------------------------------------

    def map(self, positions: Any, epoch: int) -> np.ndarray:
        """Samples at epoch positions ``positions`` (integers in ``[0, n)``, any shape).

        Returns
        -------
        numpy.ndarray, int64, same shape as ``positions``
        """
        arr = self._check_positions(positions)
        return self.map_unchecked(arr, check_seed(epoch, "epoch"))

    def map_unchecked(self, arr: np.ndarray, epoch: int) -> np.ndarray:
        """:meth:`map` for callers that guarantee a C-contiguous int64 array in ``[0, n)`` and an
        epoch in ``[0, 2**64)`` (the sampler)."""
        flat = arr.reshape(-1)
        out = np.empty_like(flat)
        if flat.size == 0:
            return out.reshape(arr.shape)
        offsets = self.window_offsets(epoch)
        windows = np.searchsorted(offsets, flat, side="right") - 1
        first, last = int(windows.min()), int(windows.max())
        if first == last:
            groups = [(first, np.arange(flat.size))]
        else:
            by = np.argsort(windows, kind="stable")
            found, starts = np.unique(windows[by], return_index=True)
            groups = list(zip(found.tolist(), np.split(by, starts[1:])))
        for w, where in groups:
            slots, cum, inner = self._window(epoch, w)
            local = inner.map_unchecked(np.ascontiguousarray(flat[where] - offsets[w]))
            slot = np.searchsorted(cum, local, side="right") - 1
            out[where] = self._bounds[slots[slot]] + (local - cum[slot])
        return out.reshape(arr.shape)
