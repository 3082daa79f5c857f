"""BERT-style masked-language-model corruption (80% mask / 10% random / 10% keep), one rule for
the packed view and the streaming packer.

One uniform draw ``u`` per token partitions the probability space, as in ModernBERT's
packer and Hugging Face's ``DataCollatorForLanguageModeling``: of the *maskable* tokens (not
padding, not a special id), ``u < 0.8 p`` becomes ``mask_id``, ``0.8 p <= u < 0.9 p`` becomes a
random token, ``0.9 p <= u < p`` keeps its value; all three are *selected* and their labels hold the
original token, every other label is ``ignore_index``.

Randomness is counter-based: row ``r`` has a 64-bit key (``sample_key(seed, epoch, index)``), and
the draw of position ``t`` is a hash of (key, t) (:mod:`mmpack._src.kernels.masking`).  So a row's
corruption is a pure function of (seed, epoch, index) whatever batch, worker or order it is read
in, resuming needs no generator state, and a whole batch is one kernel call that corrupts the rows
in place (no temporaries).  Random replacements are uniform over ``[0, vocab_size)`` minus the
excluded ids (special ids and the pad id) -- where ModernBERT's packer draws from ``[0, max token in the
batch]``, which can include the pad id and never reaches most of the vocabulary -- by drawing a
rank among the allowed ids and mapping it through the sorted excluded ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack._src.kernels.masking import mlm_hashed_rows, mlm_indexed_rows, sample_keys

__all__ = [
    "corrupt_keyed",
    "corrupt_rows",
    "excluded_ids",
    "row_keys",
]


def excluded_ids(vocab_size: int, special_ids: Iterable[int], pad_id: int | None) -> np.ndarray:
    """Sorted unique ids in ``[0, vocab_size)`` that are never selected nor drawn as a random
    replacement.

    Returns
    -------
    numpy.ndarray, int64, shape (m,)
    """
    ids = [int(t) for t in special_ids]
    if pad_id is not None:
        ids.append(int(pad_id))
    arr = np.unique(np.asarray(ids, dtype=np.int64))
    return arr[(arr >= 0) & (arr < vocab_size)]


def row_keys(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """The keys of rows ``indices`` (int64, shape (k,), >= 0) under (seed, epoch), both in
    ``[0, 2**64)``: uint64 (k,)."""
    keys = np.empty(indices.shape[0], dtype=np.uint64)
    rows = np.ascontiguousarray(indices, dtype=np.int64)
    sample_keys(np.uint64(seed), np.uint64(epoch), rows, keys)
    return keys


def corrupt_rows(
    ids: np.ndarray,
    maskable: np.ndarray,
    keys: np.ndarray,
    *,
    mask_prob: float,
    mask_id: int,
    vocab_size: int,
    excluded: np.ndarray,
    ignore_index: int = IGNORE_INDEX,
    labels: np.ndarray | None = None,
) -> np.ndarray:
    """Corrupt rows ``ids`` in place and return their labels (written into ``labels`` if given).

    Parameters
    ----------
    ids : numpy.ndarray, int64, shape (k, L), C-contiguous
        Modified in place: selected tokens become ``mask_id``, a random allowed id, or stay.
    maskable : numpy.ndarray, integer or bool, shape (k, L)
        Non-zero where a token may be selected (e.g. the attention mask: never padding).
    keys : numpy.ndarray, uint64, shape (k,)
        Row keys (:func:`row_keys`).
    mask_prob : float
        Selection probability in ``[0, 1]``.
    excluded : numpy.ndarray, int64, shape (m,)
        Sorted ids never selected nor drawn (:func:`excluded_ids`); at least one id of
        ``[0, vocab_size)`` must remain.

    Returns
    -------
    labels : numpy.ndarray, int64, shape (k, L)
        The original token where selected, ``ignore_index`` elsewhere.
    """
    n_allowed = vocab_size - excluded.size
    if n_allowed <= 0:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no id for random replacement once the "
            f"{excluded.size} special/pad ids are excluded"
        )
    if labels is None:
        labels = np.empty_like(ids)
    mlm_hashed_rows(
        ids,
        maskable,
        keys,
        excluded,
        n_allowed,
        float(mask_prob),
        int(mask_id),
        int(ignore_index),
        labels,
    )
    return labels


def corrupt_keyed(
    options: Any,
    idx: np.ndarray,
    epochs: Any,
    ids: np.ndarray,
    maskable: np.ndarray,
    labels: np.ndarray | None = None,
    mask_prob: float | None = None,
) -> np.ndarray:
    """:func:`corrupt_rows` of rows ``ids`` (k, L) keyed by (``options.seed``, epoch, ``idx``)
    (int64, (k,)): the packed view's samples and the streaming packer's rows alike.
    ``epochs`` is one epoch for every row or a list of one per row; ``options`` the rows'
    checked MLM options (:class:`~mmpack._src.packing.options.RowOptions`: ``mask_id``,
    ``vocab_size``, ``excluded``, ``ignore_index``, ``seed``, and ``mask_prob`` unless
    ``mask_prob`` is given).  Returns the labels (written into ``labels`` if given)."""
    excluded = options.excluded
    if labels is None:
        labels = np.empty_like(ids)
    prob = float(options.mask_prob if mask_prob is None else mask_prob)
    n_allowed = options.vocab_size - excluded.size
    args = (excluded, n_allowed, prob, int(options.mask_id), options.ignore_index, labels)
    if not isinstance(epochs, list):  # one kernel call: keys and corruption
        rows = np.ascontiguousarray(idx, dtype=np.int64)
        mlm_indexed_rows(ids, maskable, np.uint64(options.seed), np.uint64(epochs), rows, *args)
        return labels
    per_row = np.array(epochs, dtype=np.uint64)
    keys = np.empty(idx.shape[0], dtype=np.uint64)
    for e in np.unique(per_row).tolist():
        rows = np.flatnonzero(per_row == e)
        keys[rows] = row_keys(options.seed, e, idx[rows])
    mlm_hashed_rows(ids, maskable, keys, *args)
    return labels
