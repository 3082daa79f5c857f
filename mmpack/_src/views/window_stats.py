"""What a window view covers: :class:`WindowStats`, the return of ``WindowDataset.stats()``.

A frozen dataclass like :class:`mmpack._src.packing.plan_stats.PackingStats` (``PackedDataset.stats()``) and
:class:`mmpack.sampling.MixtureStats` (``Mixture.stats()``): attributes, and
``as_dict()`` for a plain dict.  Every field is arithmetic on the view's parameters and the
store's counts: O(1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["WindowStats"]


@dataclass(frozen=True)
class WindowStats:
    """What a window view covers (:meth:`WindowDataset.stats`); counts are tokens of the virtual
    stream ``S`` (the documents with their eots), ``width = seqlen + labels``.

    Attributes
    ----------
    seqlen, stride : int
        The view's parameters.
    n_samples : int
        ``len(ds)``: ``n_full`` full windows plus ``n_partial`` (0 or 1) padded final window
        (``drop_last=False``).
    n_full, n_partial : int
    n_docs : int
        Documents of the store.
    n_tokens : int
        Tokens of the store (without eots).
    eot_tokens : int
        Eots inserted into the stream: one per document with an ``eot``, else 0.
    stream_tokens : int
        ``len(S) = n_tokens + eot_tokens``.
    covered_tokens : int
        Stream tokens inside at least one sample's ``S[i * stride : i * stride + width]``.
    dropped_tokens : int
        Stream tokens in no sample: the tail ``drop_last`` leaves, and the gaps between windows
        when ``stride > width``.
    padding_tokens : int
        ``pad_id`` positions of ``input_ids`` over all samples (only the partial window has any).
    """

    seqlen: int
    stride: int
    n_samples: int
    n_full: int
    n_partial: int
    n_docs: int
    n_tokens: int
    eot_tokens: int
    stream_tokens: int
    covered_tokens: int
    dropped_tokens: int
    padding_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
