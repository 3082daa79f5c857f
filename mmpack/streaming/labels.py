"""The labels of a streaming packer's batch, by the training objective.

``mode=None``: no labels.  ``"causal"``: ``labels[t] = input_ids[t + 1]`` inside a piece,
``ignore_index`` at each piece's last token and on padding (labels never cross a piece).
``"mlm"``: the 80/10/10 corruption of :func:`mmpack.views.masking.corrupt_rows`, keyed by the
position in the stream: row ``r`` of the ``b``-th batch of epoch ``e`` uses the key of
``(seed, e, b * 2**32 + r)`` (:func:`mmpack.views.masking.row_keys`), so masks are a pure function
of the position and a resumed run reproduces them without generator state; the masking ratio
follows the cool-down (:class:`~mmpack.streaming.schedules.MaskingRatioCooldown`) when one is
configured.  Cost: one pass over the batch (causal), the corruption kernel's (MLM).
"""

from __future__ import annotations

import numpy as np

from mmpack.core.options import Mode
from mmpack.streaming.schedules import MaskingRatioCooldown
from mmpack.views.masking import MaskingOptions, corrupt_rows, row_keys

__all__ = ["Labeller"]


class Labeller:
    """Writes the labels of packed batches.

    Parameters
    ----------
    mode : {None, "causal", "mlm"}
    ignore_index : int
        Label of the positions without loss.
    seed : int
        Key of the MLM corruption.
    masking : MaskingOptions
        The checked MLM parameters (:func:`mmpack.views.masking.check_masking`).
    cooldown : MaskingRatioCooldown, optional
        The masking ratio as a function of the tokens emitted (MLM only).
    """

    def __init__(
        self,
        mode: str | None,
        ignore_index: int,
        seed: int,
        masking: MaskingOptions,
        cooldown: MaskingRatioCooldown | None,
    ) -> None:
        self.mode = mode
        self.ignore_index = ignore_index
        self.seed = seed
        self.masking = masking
        self.cooldown = cooldown

    @property
    def reports_mask_prob(self) -> bool:
        """Whether a batch carries its masking ratio (``mask_prob``): with a cool-down."""
        return self.cooldown is not None

    def __call__(
        self,
        ids: np.ndarray,
        attention: np.ndarray,
        placed: np.ndarray,
        n_rows: int,
        epoch: int,
        batch_index: int,
        token_count: int,
    ) -> tuple[np.ndarray | None, float | None]:
        """The labels of a batch (int64, like ``ids``; MLM corrupts ``ids`` in place) and the
        masking ratio used (MLM only).

        ``placed``: the placed pieces (int64 rows: row, offset in the row, length, ...);
        ``batch_index``: the batch's number in the epoch; ``token_count``: real tokens emitted
        before it (the cool-down's clock)."""
        if self.mode == Mode.MLM:
            masking = self.masking
            mask_prob = masking.mask_prob
            if self.cooldown is not None:
                mask_prob = self.cooldown(token_count)
            assert masking.mask_id is not None and masking.vocab_size is not None
            rows_in_stream = (batch_index << 32) + np.arange(n_rows, dtype=np.int64)
            labels = corrupt_rows(
                ids,
                attention,
                row_keys(self.seed, epoch, rows_in_stream),
                mask_prob=mask_prob,
                mask_id=masking.mask_id,
                vocab_size=masking.vocab_size,
                excluded=masking.excluded,
                ignore_index=self.ignore_index,
            )
            return labels, mask_prob
        if self.mode == Mode.CAUSAL:
            p_rows, p_offs, p_lens = placed[0], placed[1], placed[2]
            labels = np.full_like(ids, self.ignore_index)
            labels[:, :-1] = ids[:, 1:]
            labels[p_rows, p_offs + p_lens - 1] = self.ignore_index
            labels[attention == 0] = self.ignore_index
            return labels, None
        return None, None
