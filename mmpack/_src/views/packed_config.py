"""The checked options of a :class:`~mmpack.PackedDataset`, in one place.

:func:`packed_config` validates every constructor argument once: the rows' options by the one
check both packers share (:func:`mmpack._src.packing.options.check_row_options`), then the
plan's options (a :class:`~mmpack.packing.PlanSpec`) and the output type.  It
returns a :class:`PackedConfig` (a :class:`~mmpack._src.packing.options.RowOptions` with the plan's
and the output's fields) whose fields become the dataset's public attributes.  Nothing here
runs per sample.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.core.constants import IGNORE_INDEX
from mmpack._src.core.options import PackingAlgorithm
from mmpack._src.packing.options import PlanSpec, RowOptions, check_row_options
from mmpack._src.store.reader import TokenStore
from mmpack._src.views.window import output_dtype

__all__ = ["PackedConfig", "SAMPLE_FIELDS", "packed_config"]


@dataclass(frozen=True)
class PackedConfig(RowOptions):
    """A packed view's parameters, checked and in canonical form (see ``PackedDataset``): its
    rows' options and the plan's and output's."""

    cache: bool
    dtype: np.dtype
    plan_spec: PlanSpec
    """The plan's parameters (the view's ``lookahead``, ``algorithm`` and ``region_tokens``)."""


SAMPLE_FIELDS = (
    "seqlen",
    "eot",
    "pad_id",
    "mode",
    "label_shift",
    "mask_prob",
    "special_ids",
    "mask_id",
    "vocab_size",
    "seed",
    "lookahead",
    "long_docs",
    "algorithm",
    "region_tokens",
)
"""The fields that decide a packed view's samples (what its ``fingerprint`` digests)."""


def packed_config(
    store: TokenStore,
    seqlen: Any,
    *,
    eot: Any,
    pad_id: Any,
    mode: Any,
    mask_prob: Any,
    mask_id: Any,
    vocab_size: Any,
    special_ids: Iterable[int],
    seed: Any,
    long_docs: Any,
    algorithm: PackingAlgorithm,
    label_shift: Any,
    lookahead: Any,
    region_tokens: Any,
    cache: Any,
    check_vocab: Any,
    dtype: Any,
) -> PackedConfig:
    """Check the arguments of ``PackedDataset(store, seqlen, ...)`` (``algorithm`` already parsed
    by the constructor).  ``TypeError`` or ``ValueError`` naming the argument, as the
    constructor documents."""
    rows = check_row_options(
        seqlen=seqlen,
        eot=eot,
        pad_id=pad_id,
        mode=mode,
        label_shift=label_shift,
        ignore_index=IGNORE_INDEX,
        mask_prob=mask_prob,
        mask_id=mask_id,
        vocab_size=vocab_size,
        special_ids=special_ids,
        long_docs=long_docs,
        seed=seed,
        store=store,
        check_vocab=check_vocab,
    )
    plan = PlanSpec(
        rows.seqlen,
        add_eot=rows.eot is not None,
        long_docs=rows.long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
        region_tokens=region_tokens,
    )
    ids = {"eot": rows.eot, "pad_id": rows.pad_id, "mask_id": rows.mask_id}
    vocab = rows.vocab_size
    out_dtype = output_dtype(
        dtype, store, ids | {"vocab_size": None if vocab is None else vocab - 1}
    )
    return PackedConfig(
        **vars(rows),
        cache=bool(cache),
        dtype=out_dtype,
        plan_spec=plan,
    )
