"""The checked options of a :class:`~mmpack.views.packed.PackedDataset`, in one place.

:func:`packed_config` validates every constructor argument once, in the order the errors were
always reported (seqlen, the special ids, mode and label shift, the MLM options, the vocabulary,
seed, lookahead, the plan's options, the output type), and returns a :class:`PackedConfig` whose
fields become the dataset's public attributes.  Nothing here runs per sample.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from mmpack.core.constants import INT32_MAX
from mmpack.core.options import LabelShift, LongDocs, Mode, PackingAlgorithm, parse_option
from mmpack.core.validation import check_int, check_int_range, check_seed, check_token_id
from mmpack.store.reader import TokenStore
from mmpack.store.vocab import check_in_vocab, resolve_special
from mmpack.views.masking import check_masking
from mmpack.views.plan_file import plan_cache_key
from mmpack.views.window import output_dtype

__all__ = ["PackedConfig", "SAMPLE_FIELDS", "packed_config"]


@dataclass(frozen=True)
class PackedConfig:
    """A packed view's parameters, checked and in canonical form (see ``PackedDataset``)."""

    seqlen: int
    eot: int | None
    pad_id: int
    mode: str
    label_shift: str
    mask_prob: float
    special_ids: tuple[int, ...]
    mask_id: int | None
    vocab_size: int | None
    seed: int
    lookahead: int
    long_docs: str
    algorithm: str
    region_tokens: int | None
    cache: bool
    dtype: np.dtype


SAMPLE_FIELDS = tuple(f.name for f in fields(PackedConfig) if f.name not in ("cache", "dtype"))
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
    by the constructor).  ``TypeError`` or
    ``ValueError`` naming the argument, as the constructor documents."""
    seqlen = check_int(seqlen, "seqlen")
    if not 1 <= seqlen < INT32_MAX:
        raise ValueError(f"seqlen must be in [1, {INT32_MAX}), got {seqlen}")
    specials = {"eot": eot, "pad_id": pad_id, "mask_id": mask_id, "vocab_size": vocab_size}
    eot, pad_id, mask_id, vocab_size = (resolve_special(v, store, n) for n, v in specials.items())
    eot = None if eot is None else check_token_id(eot, "eot")
    pad_id = check_token_id(pad_id, "pad_id")
    mode_ = parse_option(Mode, mode, "mode").value
    shift = parse_option(LabelShift, label_shift, "label_shift").value
    masking = check_masking(
        mode_ == Mode.MLM,
        mask_prob=mask_prob,
        mask_id=mask_id,
        vocab_size=vocab_size,
        special_ids=special_ids,
        pad_id=pad_id,
        also_excluded=(eot,),
    )
    check_in_vocab(
        store, {"eot": eot, "pad_id": pad_id, "mask_id": masking.mask_id}, not check_vocab
    )
    seed = check_seed(seed)
    lookahead = check_int_range(lookahead, "lookahead", None)
    # Validates long_docs, algorithm, lookahead and region_tokens with the messages of
    # mmpack.views.plan, and resolves region_tokens="auto".
    key = plan_cache_key(
        "",
        seqlen,
        add_eot=eot is not None,
        long_docs=long_docs,
        algorithm=algorithm,
        lookahead=lookahead,
        region_tokens=region_tokens,
    )
    vocab = masking.vocab_size
    ids = {"eot": eot, "pad_id": pad_id, "mask_id": masking.mask_id}
    out_dtype = output_dtype(
        dtype, store, ids | {"vocab_size": None if vocab is None else vocab - 1}
    )
    return PackedConfig(
        seqlen=seqlen,
        eot=eot,
        pad_id=pad_id,
        mode=mode_,
        label_shift=shift,
        mask_prob=masking.mask_prob,
        special_ids=masking.special_ids,
        mask_id=masking.mask_id,
        vocab_size=vocab,
        seed=seed,
        lookahead=lookahead,
        long_docs=parse_option(LongDocs, long_docs, "long_docs").value,
        algorithm=algorithm.value,
        region_tokens=key["region_tokens"],
        cache=bool(cache),
        dtype=out_dtype,
    )
