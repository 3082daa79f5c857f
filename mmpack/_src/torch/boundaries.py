"""Row boundaries (``cu_seqlens``): validated, concatenated and laid out for a batch.

A packed row of ``seqlen`` tokens is cut into segments by its boundaries ``0 = c[0] <= c[1] <=
... <= c[-1] = seqlen`` (repeated values are empty segments).  Every consumer of a batch's rows
checks that rule and concatenates the rows the same way, so it lives here once:

* :func:`sample_boundaries` (numpy, for :func:`mmpack.torch.collate`): the rows of a list
  of samples, concatenated and validated in a few vectorised passes, naming the first bad sample;
  :func:`flat_boundaries` shifts row ``b`` by ``b * seqlen`` and drops repeated values, giving the
  batch-wide ``cu_seqlens`` of the varlen kernels (worked example in :mod:`mmpack._src.torch.collate`).
* :func:`position_boundaries` (numpy): the rows of samples that carry ``position_ids`` but no
  ``cu_seqlens``, cut where the positions restart (as transformers' packed-sequence detection
  reads them).
* :func:`check_row` / :func:`check_rows` (torch, for :mod:`mmpack._src.torch.attention`): the same
  check on the device the masks are built on, one host sync per call; :func:`_as_boundaries`
  converts one row to an int64 tensor, :func:`is_one_row` tells a single row from a batch of rows.

Cost: ``O(B + segments)`` numpy or torch work, no Python loop over segments (a Python loop over
rows only to name a malformed one after the vectorised check failed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "check_row",
    "check_rows",
    "flat_boundaries",
    "is_one_row",
    "position_boundaries",
    "sample_boundaries",
]


def sample_boundaries(
    samples: Sequence[Mapping[str, Any]], seqlen: int, present: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The rows' boundaries of a batch of samples, concatenated and validated.

    Parameters
    ----------
    samples : sequence of B mappings
        Each with ``"cu_seqlens"`` (1-D integers) when ``present``.
    seqlen : int
        Row length: every row must run from 0 to ``seqlen``, never decreasing.
    present : bool
        Whether the samples carry ``cu_seqlens``; if not, each row is one segment.

    Returns
    -------
    rows : numpy.ndarray, int64, shape (sum(lens),)
        Every row's boundaries, one row after the other.
    lens : numpy.ndarray, int64, shape (B,)
        Boundaries per row.

    Raises
    ------
    ValueError
        A row that is not 1-D integers of at least two values, or is malformed (the message
        names the first bad sample).
    """
    n = len(samples)
    if not present:
        rows = np.tile(np.array([0, seqlen], dtype=np.int64), n)
        return rows, np.full(n, 2, dtype=np.int64)
    cus = [np.asarray(s["cu_seqlens"]) for s in samples]
    for b, c in enumerate(cus):
        if c.ndim != 1 or c.shape[0] < 2 or c.dtype.kind not in "iu":
            raise ValueError(
                f"samples[{b}]['cu_seqlens'] must be a 1-D integer array of at least 2 "
                f"boundaries, got dtype {c.dtype} shape {c.shape}"
            )
    lens = np.fromiter((c.shape[0] for c in cus), dtype=np.int64, count=n)
    rows = np.concatenate(cus).astype(np.int64, copy=False)
    ends = np.cumsum(lens)
    bad_first = np.flatnonzero(rows[ends - lens] != 0)
    bad_last = np.flatnonzero(rows[ends - 1] != seqlen)
    steps = np.diff(rows)
    steps[ends[:-1] - 1] = 0  # the step from one row's end to the next row's start
    bad_step = np.flatnonzero(steps < 0)
    if bad_first.size or bad_last.size or bad_step.size:
        if bad_step.size:
            b = int(np.searchsorted(ends, bad_step[0], side="right"))
        else:
            b = int(min(bad_first.tolist() + bad_last.tolist()))
        raise ValueError(
            f"samples[{b}]['cu_seqlens'] = {cus[b].tolist()} is malformed; expected "
            f"non-decreasing boundaries from 0 to the row length {seqlen}"
        )
    return rows, lens


def position_boundaries(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows' boundaries read from their positions: a segment starts at 0 and wherever
    ``positions[b, t] != positions[b, t - 1] + 1``.

    Parameters
    ----------
    positions : numpy.ndarray, integer, shape (B, seqlen)

    Returns
    -------
    rows, lens : numpy.ndarray, int64
        As :func:`sample_boundaries` returns them (no empty segments).  Cost: O(B * seqlen).
    """
    n, seqlen = positions.shape
    pos = positions.astype(np.int64, copy=False)
    restarts = pos[:, 1:] != pos[:, :-1] + 1  # (B, seqlen - 1): a segment starts at t + 1
    row, col = np.nonzero(restarts)
    rows_of = np.concatenate([np.arange(n), row, np.arange(n)])
    cut_at = np.concatenate(
        [np.zeros(n, dtype=np.int64), col.astype(np.int64) + 1, np.full(n, seqlen, np.int64)]
    )
    order = np.lexsort((cut_at, rows_of))
    lens = np.bincount(row, minlength=n).astype(np.int64) + 2
    return cut_at[order], lens


def flat_boundaries(rows: np.ndarray, lens: np.ndarray, seqlen: int) -> np.ndarray:
    """The batch-wide ``cu_seqlens`` of the varlen kernels.

    Parameters
    ----------
    rows, lens : numpy.ndarray, int64
        As :func:`sample_boundaries` returns them (validated).
    seqlen : int
        Row length.

    Returns
    -------
    numpy.ndarray, int64, shape (segments + 1,)
        Row ``b``'s boundaries shifted by ``b * seqlen``, concatenated, repeated values dropped:
        strictly increasing from 0 to ``B * seqlen``.
    """
    shift = np.repeat(np.arange(lens.shape[0], dtype=np.int64) * seqlen, lens)
    flat = rows + shift
    keep = np.empty(flat.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    return flat[keep]


def is_one_row(x: Any) -> bool:
    """Whether ``x`` is one row of boundaries (a 1-D array or tensor, or a non-empty sequence of
    ints) rather than a batch of rows."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x.ndim == 1
    return (
        isinstance(x, Sequence) and len(x) > 0 and all(isinstance(v, (int, np.integer)) for v in x)
    )


def _check_seqlen(seqlen: Any) -> int:
    if isinstance(seqlen, bool) or not isinstance(seqlen, (int, np.integer)) or seqlen < 1:
        raise ValueError(f"seqlen={seqlen!r} is not accepted; give a positive int")
    return int(seqlen)


def _as_boundaries(
    cu: torch.Tensor | np.ndarray | Sequence[int],
    name: str,
    device: torch.device | str | None,
) -> torch.Tensor:
    """One row's boundaries as an int64 tensor on ``device`` (shape and dtype checked, values
    not: see :func:`check_row`); ``name`` is the argument named in the ``ValueError``."""
    if isinstance(cu, torch.Tensor):
        t = cu.detach()
    else:
        a = np.asarray(cu)
        if a.dtype.kind not in "iu":
            raise ValueError(
                f"{name} must be a 1-D integer array of boundaries, got dtype {a.dtype} "
                f"shape {a.shape}"
            )
        t = torch.from_numpy(a.astype(np.int64))
    if (
        t.ndim != 1
        or t.shape[0] < 2
        or t.is_floating_point()
        or t.is_complex()
        or (t.dtype == torch.bool)
    ):
        raise ValueError(
            f"{name} must be a 1-D integer tensor of at least 2 boundaries, got dtype {t.dtype} "
            f"shape {tuple(t.shape)}"
        )
    return t.to(device=device if device is not None else t.device, dtype=torch.int64)


def check_row(
    cu: torch.Tensor | np.ndarray | Sequence[int],
    seqlen: int,
    name: str,
    device: torch.device | str | None,
) -> torch.Tensor:
    """One row's boundaries as a validated int64 tensor.

    Parameters
    ----------
    cu : torch.Tensor, numpy.ndarray or sequence of int, shape (n + 1,)
    seqlen : int
        Row length (a positive int).
    name : str
        The argument named in the error.
    device : torch.device or str, optional
        Where the result lives (default: where ``cu`` is, or the CPU).

    Returns
    -------
    torch.Tensor, int64, shape (n + 1,)

    Raises
    ------
    ValueError
        ``seqlen`` not a positive int; boundaries not 1-D integers, not starting at 0, not
        ending at ``seqlen`` or decreasing somewhere.
    """
    seqlen = _check_seqlen(seqlen)
    t = _as_boundaries(cu, name, device)
    steps = t[1:] - t[:-1]
    # One host sync for all three checks.
    if not bool(((t[0] == 0) & (t[-1] == seqlen) & (steps >= 0).all()).item()):
        raise ValueError(
            f"{name} = {t.tolist()} is malformed; expected non-decreasing boundaries from 0 to "
            f"seqlen={seqlen}"
        )
    return t


def check_rows(
    rows: Sequence[torch.Tensor | np.ndarray | Sequence[int]] | torch.Tensor,
    seqlen: int,
    device: torch.device | str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All rows' boundaries concatenated (int64, on one device) and each row's first index.

    ``rows`` is a sequence of B rows (each as :func:`check_row` takes) or a 2-D ``(B, n + 1)``
    array; the result is ``(flat, starts)``, int64 tensors of shapes ``(sum of row sizes,)`` and
    ``(B,)``.  ``TypeError`` for a non-sequence, ``ValueError`` for no row or a malformed one.

    Validated with one host sync; a malformed row is then found and named.
    """
    seqlen = _check_seqlen(seqlen)
    if isinstance(rows, (torch.Tensor, np.ndarray)):
        if rows.ndim != 2:
            raise ValueError(
                "cu_seqlens_rows must be a sequence of 1-D boundaries or a 2-D (B, n + 1) "
                f"array, got shape {tuple(rows.shape)}"
            )
        rows = list(rows)
    elif not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise TypeError(
            f"cu_seqlens_rows must be a sequence of 1-D boundaries, got {type(rows).__name__}"
        )
    if len(rows) == 0:
        raise ValueError("cu_seqlens_rows is empty; give at least one row")
    if device is None and isinstance(rows[0], torch.Tensor):
        device = rows[0].device
    parts = [_as_boundaries(r, f"cu_seqlens_rows[{b}]", device) for b, r in enumerate(rows)]
    flat = torch.cat(parts)
    counts = torch.tensor([p.shape[0] for p in parts], device=flat.device)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    steps = flat[1:] - flat[:-1]
    steps[ends[:-1] - 1] = 0  # from one row's end to the next row's start
    ok = (flat[starts] == 0).all() & (flat[ends - 1] == seqlen).all() & (steps >= 0).all()
    if not bool(ok.item()):
        for b, p in enumerate(parts):
            check_row(p, seqlen, f"cu_seqlens_rows[{b}]", None)
    return flat, starts
