"""The checked options of a :class:`~mmpack.PackedDataset`, in one place.

:func:`packed_config` validates every constructor argument once: the rows' options by the one
check both packers share (:func:`mmpack._src.packing.options.check_row_options`), then the
plan's options (a :class:`~mmpack.packing.PlanSpec`) and the output type.  It
returns a :class:`PackedConfig` (a :class:`~mmpack._src.packing.options.RowOptions` with the plan's
and the output's fields) whose fields become the dataset's public attributes.  Nothing here
runs per sample.
"""

from __future__ import annotations

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
    *,
    algorithm: PackingAlgorithm,
    lookahead: Any,
    region_tokens: Any,
    cache: Any,
    dtype: Any,
    **rows: Any,
) -> PackedConfig:
    """Check the arguments of ``PackedDataset(store, ...)``: ``rows`` are the rows' options and
    ``check_vocab`` (:func:`~mmpack._src.packing.options.check_row_options`), ``algorithm`` already
    parsed by the constructor.  ``TypeError`` or ``ValueError`` naming the argument, as the
    constructor documents."""
    checked = check_row_options(**rows, ignore_index=IGNORE_INDEX, store=store)
    plan = PlanSpec(
        checked.seqlen,
        add_eot=checked.eot is not None,
        long_docs=checked.long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
        region_tokens=region_tokens,
    )
    ids = {"eot": checked.eot, "pad_id": checked.pad_id, "mask_id": checked.mask_id}
    vocab = checked.vocab_size
    out_dtype = output_dtype(
        dtype, store, ids | {"vocab_size": None if vocab is None else vocab - 1}
    )
    return PackedConfig(
        **vars(checked),
        cache=bool(cache),
        dtype=out_dtype,
        plan_spec=plan,
    )
