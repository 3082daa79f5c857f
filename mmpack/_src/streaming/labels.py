"""The labels of a streaming packer's batch, by the training objective (``mode`` and
``label_shift`` of :class:`~mmpack.StreamingPacker` state the rules: the packed view's).

``mode=None``: no labels.  ``"causal"``: written with the rows by the one row writer
(:func:`mmpack._src.kernels.packed_rows.fill_rows`, in the mode :attr:`Labeller.label_mode` gives
it).  ``"mlm"``: the 80/10/10 corruption of :func:`mmpack._src.packing.masking.corrupt_keyed` over
the written rows, keyed by the position in the stream (row ``r`` of the ``b``-th batch of epoch
``e``: the key of ``(seed, e, b * 2**32 + r)``), so a resumed run reproduces the masks without
generator state; the masking ratio follows the cool-down
(:class:`~mmpack._src.streaming.schedules.MaskingRatioCooldown`) when one is configured.  With loss
masks (a masked store, or documents ``{"input_ids", "loss_mask"}``) the rule is the packed view's,
by its kernels (``fill_rows``, and :func:`~mmpack._src.kernels.packed_rows.mask_pieces` for MLM):
a causal label is ``ignore_index`` where the token it predicts is not a target, and MLM selects
only target tokens (an eot the packer appends is a target).  Cost: none past the row writer's
pass (causal), the corruption kernel's (MLM, and one pass over the placed tokens with masks).
"""

from __future__ import annotations

import numpy as np

from mmpack._src.core.options import Mode
from mmpack._src.kernels.packed_rows import mask_pieces
from mmpack._src.packing.masking import corrupt_keyed
from mmpack._src.packing.options import RowOptions, label_mode
from mmpack._src.streaming.schedules import MaskingRatioCooldown

__all__ = ["Labeller"]


class Labeller:
    """Writes the labels of packed batches.

    Parameters
    ----------
    options : RowOptions
        The rows' checked options (:func:`mmpack._src.packing.options.check_row_options`): the mode
        (None: no labels), the label shift, ``ignore_index``, the MLM options and the seed.
    cooldown : MaskingRatioCooldown, optional
        The masking ratio as a function of the tokens emitted (MLM only).
    """

    def __init__(self, options: RowOptions, cooldown: MaskingRatioCooldown | None) -> None:
        self.options = options
        self.cooldown = cooldown

    @property
    def label_mode(self) -> int:
        """The labels the row writer writes with the rows
        (:func:`mmpack._src.packing.options.label_mode` of the options)."""
        return label_mode(self.options.mode, self.options.label_shift)

    def __call__(
        self,
        ids: np.ndarray,
        attention: np.ndarray,
        labels: np.ndarray,
        lengths: np.ndarray,
        row_ptr: np.ndarray,
        epoch: int,
        batch_index: int,
        token_count: int,
        mask: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray | None, float | None]:
        """The labels of a batch whose rows the row writer wrote (int64, like ``ids``; MLM
        corrupts ``ids`` in place) and the masking ratio used (MLM only).

        ``labels``: what the row writer wrote by :attr:`label_mode` (the causal labels);
        ``lengths``, ``row_ptr``: the placed pieces' lengths in row-major order (int64) and each
        row's piece range (a row's pieces fill it from column 0 on); ``batch_index``: the batch's
        number in the epoch; ``token_count``: real tokens emitted before it (the cool-down's
        clock); ``mask``: the placed pieces' loss masks, ``(values, start of each piece in
        them)`` (uint8 0/1 and int64), or None."""
        if self.options.mode == Mode.CAUSAL:
            return labels, None
        if self.options.mode != Mode.MLM:
            return None, None
        mask_prob = self.options.mask_prob
        if self.cooldown is not None:
            mask_prob = self.cooldown(token_count)
        rows_in_stream = (batch_index << 32) + np.arange(ids.shape[0], dtype=np.int64)
        selectable = attention
        if mask is not None:  # only target tokens are selected
            values, starts = mask
            selectable = attention.copy()
            no_eot = np.zeros(lengths.shape[0], dtype=np.int64)  # a piece's eot is its own token
            mask_pieces(values, starts, lengths, no_eot, row_ptr, 0, 0, selectable)
        labels = corrupt_keyed(
            self.options, rows_in_stream, epoch, ids, selectable, mask_prob=mask_prob
        )
        return labels, mask_prob
