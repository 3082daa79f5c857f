"""``SampleBatch``: what a view's ``__getitems__`` returns — a sequence of per-sample dicts
backed by whole-batch arrays.

Building one Python dict per sample costs about as much as copying a 2048-token window (building
them eagerly held window batches to ~650M tokens/s; without them, ~1,050M in the same
``benchmarks --quick window`` run on this machine), so a batch keeps its columns as
``(k, seqlen)`` arrays and makes a sample's dict only when someone indexes it.  ``torch.utils.data.default_collate`` (which indexes and iterates) works
unchanged; :func:`mmpack.torch.collate` takes the columns directly, without a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from mmpack._src.views.provenance import Pieces

__all__ = ["SampleBatch"]


class SampleBatch(Sequence):
    """A batch of ``k`` samples stored column-wise.

    Parameters
    ----------
    columns : dict of str to numpy.ndarray
        Per-sample fields, each of shape ``(k, ...)``: rows (e.g. ``input_ids`` ``(k, seqlen)``)
        or, for 1-D columns, one scalar per sample (given as a Python number, e.g. ``max_seqlen``).
    cu_seqlens : numpy.ndarray, int32, shape (k, m)
        Row ``r`` holds the sample's ``cu_seqlens`` in its first ``num_cuts[r]`` entries.
    num_cuts : numpy.ndarray, int64, shape (k,)
    provenance_of : callable, optional
        Computes the batch's provenance (a :class:`~mmpack._src.views.provenance.Pieces`) when
        called with no argument (a view passes a ``functools.partial`` of
        :mod:`mmpack._src.views.provenance`); ``None``: the dataset that made the batch does not
        record where its samples come from.
    from_first : tuple of str, default ()
        The per-token columns each of whose segments follows from its first token, as the
        dataset that made the batch writes them: ``position_ids`` rising by one from it (a
        view's ``0, 1, ...`` per segment), any other column holding it throughout (a packed
        view's ``attention_mask``).  The context-parallel collate writes them from that token
        alone instead of reading them (:mod:`mmpack._src.torch.cp_batch`); ``()`` promises nothing.
        Whoever changes such a column in place takes its name out.
    """

    __slots__ = ("columns", "cu_seqlens", "from_first", "num_cuts", "provenance_of")

    def __init__(
        self,
        columns: dict[str, np.ndarray],
        cu_seqlens: np.ndarray,
        num_cuts: np.ndarray,
        provenance_of: Callable[[], Pieces] | None = None,
        from_first: tuple[str, ...] = (),
    ) -> None:
        self.columns = columns
        self.cu_seqlens = cu_seqlens
        self.num_cuts = num_cuts
        self.provenance_of = provenance_of
        self.from_first = from_first

    def provenance(self) -> dict[str, np.ndarray]:
        """Where the batch's samples come from: the document pieces of every row, as flat int64
        arrays (``sample``, ``doc``, ``start``, ``stop``, ``eot``, ``at``, from a mixture
        ``source``; ``cu_docs`` (k + 1,)), the rows' ``locate`` lists end to end (see
        :mod:`mmpack._src.views.provenance`).  Computed at each call.

        Raises
        ------
        ValueError
            The dataset that made the batch does not record provenance.
        """
        return self.provenance_pieces().as_dict()

    def provenance_pieces(self) -> Pieces:
        """:meth:`provenance` as computed: the fields in one ``(fields, m)`` int64 array."""
        if self.provenance_of is None:
            raise ValueError(
                "this batch does not record where its samples come from; provenance is given "
                "for batches of WindowDataset, PackedDataset and Mixtures of them"
            )
        return self.provenance_of()

    def __len__(self) -> int:
        return self.num_cuts.shape[0]

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return [self[q] for q in range(*r.indices(len(self)))]
        sample = {
            name: col[r] if col.ndim > 1 else col[r].item() for name, col in self.columns.items()
        }
        sample["cu_seqlens"] = self.cu_seqlens[r, : self.num_cuts[r]]
        return sample

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for r in range(len(self)):
            yield self[r]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.shape}" for k, v in self.columns.items())
        return f"SampleBatch({len(self)} samples: {shapes})"
