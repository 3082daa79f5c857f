"""The options of packed rows and of a packing plan, each checked once.

:class:`RowOptions` holds what decides how a row of packed documents is written, whichever
driver packs it (a plan's bins, :class:`~mmpack.PackedDataset`, or a stream's
batches, :class:`~mmpack.StreamingPacker`): the row length, the eot appended
to each document, the padding id, the training objective and its labels (``label_shift``, the
label of positions without loss), the MLM corruption's options and the ids it never draws, what
becomes of a document longer than a row, and the seed.  :func:`check_row_options` is its one
check (a ``TypeError`` or ``ValueError`` naming the argument); each driver's configuration
(:class:`~mmpack._src.views.packed_config.PackedConfig`,
:class:`~mmpack._src.streaming.config.PackerConfig`) is a :class:`RowOptions` with the driver's own
fields added, which the driver shows as attributes through :class:`Delegated`.  O(1) but for the excluded ids (O(number of special ids)).

:class:`PlanSpec` holds what decides a packing plan (:mod:`mmpack._src.packing.plan`): checked when
it is made, passed as one value through the plan's builders, its file's cache key and the
region builds.  O(1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmpack._src.core.constants import INT32_MAX
from mmpack._src.core.options import (
    DEFAULT_LOOKAHEAD,
    LabelShift,
    LongDocs,
    Mode,
    PackingAlgorithm,
    parse_option,
)
from mmpack._src.core.validation import (
    check_bool,
    check_int,
    check_int_range,
    check_positive_int,
    check_probability,
    check_region_tokens,
    check_seed,
    check_token_id,
    check_token_ids,
)
from mmpack._src.kernels.packed_rows import LABELS_HF, LABELS_NEXT, LABELS_NONE
from mmpack._src.packing.masking import excluded_ids
from mmpack._src.store.vocab import check_in_vocab, resolve_special

__all__ = ["Delegated", "PlanSpec", "RowOptions", "check_row_options", "label_mode"]


class Delegated:
    """A read-only attribute that reads the field of the same name of the owner's options
    object, the attribute ``holder`` (``seqlen = Delegated("config", "Tokens per row.")``): a
    driver exposes its options' fields without a property each.  ``doc`` is the attribute's
    docstring (``__doc__``; the API reference reads it, ``docs/_hooks/delegated.py``)."""

    def __init__(self, holder: str, doc: str) -> None:
        self.holder = holder
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.holder), self.name)


@dataclass(frozen=True)
class RowOptions:
    """How rows of packed documents are written, checked (:func:`check_row_options`): the
    parameters of the same names of :class:`~mmpack.PackedDataset` and
    :class:`~mmpack.StreamingPacker` (their meaning is documented there), in canonical form
    (option names as strings, ``special_ids`` a tuple), and ``excluded``.

    Attributes
    ----------
    mode : {"causal", "mlm"} or None
        None: no labels (a driver that allows it).
    mask_id, vocab_size : int or None
        Both set in MLM mode, ``0 <= mask_id < vocab_size``.
    excluded : numpy.ndarray, int64, shape (m,)
        Sorted: the ids MLM never selects nor draws as a random replacement (the special ids,
        the eot, ``mask_id`` and ``pad_id``); empty unless the mode is MLM.
    """

    seqlen: int
    eot: int | None
    pad_id: int
    mode: str | None
    label_shift: str
    ignore_index: int
    mask_prob: float
    mask_id: int | None
    vocab_size: int | None
    special_ids: tuple[int, ...]
    excluded: np.ndarray = field(compare=False, repr=False)
    long_docs: str
    seed: int


def check_row_options(
    *,
    seqlen: Any,
    eot: Any,
    pad_id: Any,
    mode: Any,
    label_shift: Any,
    ignore_index: Any,
    mask_prob: Any,
    mask_id: Any,
    vocab_size: Any,
    special_ids: Iterable[int],
    long_docs: Any,
    seed: Any,
    store: Any = None,
    check_vocab: bool = False,
    labels_optional: bool = False,
) -> RowOptions:
    """The one check of the options of packed rows.

    Parameters
    ----------
    seqlen, eot, pad_id, mode, label_shift, ignore_index, mask_prob, mask_id, vocab_size, special_ids, long_docs, seed
        As :class:`RowOptions` holds them.
    store : TokenStore, optional
        The store packed: ``"store"`` for ``eot``, ``pad_id``, ``mask_id`` or ``vocab_size``
        is the id its tokenizer record gives (:func:`mmpack._src.store.vocab.resolve_special`); with
        ``check_vocab``, ids outside its recorded vocabulary are refused.
    labels_optional : bool
        Whether ``mode=None`` (no labels) is allowed.

    Raises
    ------
    TypeError
        An argument of the wrong type (named).
    ValueError
        An argument out of its range (named); MLM without ``mask_id`` and ``vocab_size``, a
        ``mask_id`` outside ``[0, vocab_size)``, or no id left for random replacement.
    """
    seqlen = check_int(seqlen, "seqlen")
    if not 1 <= seqlen < INT32_MAX:
        raise ValueError(f"seqlen must be in [1, {INT32_MAX}), got {seqlen}")
    if store is not None:
        specials = {"eot": eot, "pad_id": pad_id, "mask_id": mask_id, "vocab_size": vocab_size}
        eot, pad_id, mask_id, vocab_size = (
            resolve_special(v, store, n) for n, v in specials.items()
        )
    eot = None if eot is None else check_token_id(eot, "eot")
    if eot is not None and eot < 0:
        raise ValueError(f"eot must be a token id >= 0 (tokens are non-negative), got {eot}")
    pad_id = check_token_id(pad_id, "pad_id")
    mode_ = None if mode is None and labels_optional else parse_option(Mode, mode, "mode").value
    shift = parse_option(LabelShift, label_shift, "label_shift").value
    prob = check_probability(mask_prob, "mask_prob")
    specials_ = check_token_ids(special_ids, "special_ids")
    mid = None if mask_id is None else check_token_id(mask_id, "mask_id")
    vocab = None if vocab_size is None else check_positive_int(vocab_size, "vocab_size")
    excluded = np.empty(0, dtype=np.int64)
    if mode_ == Mode.MLM:
        if mid is None or vocab is None:
            raise ValueError(
                f"mode='mlm' needs mask_id and vocab_size (got mask_id={mask_id!r}, "
                f"vocab_size={vocab_size!r})"
            )
        if not 0 <= mid < vocab:
            raise ValueError(f"mask_id={mid} must be in [0, vocab_size={vocab})")
        never = (*specials_, *(() if eot is None else (eot,)), mid)
        excluded = excluded_ids(vocab, never, pad_id)
        if excluded.size >= vocab:
            raise ValueError(
                f"vocab_size={vocab} leaves no id for random replacement once the special ids, "
                "eot, mask_id and pad_id are excluded"
            )
    if store is not None:
        check_in_vocab(store, {"eot": eot, "pad_id": pad_id, "mask_id": mid}, not check_vocab)
    return RowOptions(
        seqlen=seqlen,
        eot=eot,
        pad_id=pad_id,
        mode=mode_,
        label_shift=shift,
        ignore_index=check_token_id(ignore_index, "ignore_index"),
        mask_prob=prob,
        mask_id=mid,
        vocab_size=vocab,
        special_ids=specials_,
        excluded=excluded,
        long_docs=parse_option(LongDocs, long_docs, "long_docs").value,
        seed=check_seed(seed),
    )


def label_mode(mode: str | None, label_shift: str) -> int:
    """The labels the row writer writes with the rows (``label_mode`` of
    :func:`~mmpack._src.kernels.packed_rows.fill_rows` and ``one_bin``), the one rule of both packers:
    for ``"causal"``, ``LABELS_NEXT`` or ``LABELS_HF`` by ``label_shift``; else ``LABELS_NONE``
    (MLM's labels are the corruption's, and no mode has none)."""
    if mode != Mode.CAUSAL:
        return LABELS_NONE
    return LABELS_NEXT if label_shift == LabelShift.NEXT else LABELS_HF


@dataclass(frozen=True, init=False)
class PlanSpec:
    """What decides a packing plan, checked and in canonical form: frozen, hashable, picklable.

    ``PlanSpec(seqlen, *, add_eot, long_docs="split", algorithm="bfd", lookahead=1024,
    region_tokens=None)`` checks every argument (a ``TypeError`` or ``ValueError`` naming it);
    the plan's builders (:mod:`mmpack._src.packing.plan`), its cache key
    (:func:`~mmpack.packing.plan_cache_key`) and the region builds
    (:mod:`mmpack._src.packing.plan_regions`) take it as it is.

    Attributes
    ----------
    seqlen : int
        Slots per bin, in ``[1, 2**31)``.
    add_eot : bool
        Whether an end-of-text slot follows every document.
    long_docs : {"split", "truncate", "drop"}
    algorithm : {"bfd", "online", "nextfit"}
    lookahead : int
        Open bins of ``"online"`` (>= 1), checked whatever the algorithm.
    region_tokens : int or None
        Tokens per region, ``"auto"`` resolved to ``DEFAULT_REGION_BINS * seqlen``; None: one
        region, the whole store.
    """

    seqlen: int
    add_eot: bool
    long_docs: str
    algorithm: str
    lookahead: int
    region_tokens: int | None

    def __init__(
        self,
        seqlen: Any,
        *,
        add_eot: Any,
        long_docs: Any = "split",
        algorithm: Any = "bfd",
        lookahead: Any = DEFAULT_LOOKAHEAD,
        region_tokens: Any = None,
    ) -> None:
        seqlen = check_int_range(seqlen, "seqlen", 1, 2**31)
        checked = {
            "seqlen": seqlen,
            "add_eot": check_bool(add_eot, "add_eot"),
            "long_docs": parse_option(LongDocs, long_docs, "long_docs").value,
            "algorithm": parse_option(PackingAlgorithm, algorithm, "algorithm").value,
            "lookahead": check_int_range(lookahead, "lookahead", 1),
            "region_tokens": check_region_tokens(region_tokens, seqlen),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def params(self) -> dict[str, Any]:
        """The parameters a plan records, in this order: ``lookahead`` only for ``"online"``
        (None otherwise)."""
        online = self.algorithm == PackingAlgorithm.ONLINE
        return {
            "seqlen": self.seqlen,
            "add_eot": self.add_eot,
            "long_docs": self.long_docs,
            "algorithm": self.algorithm,
            "lookahead": self.lookahead if online else None,
            "region_tokens": self.region_tokens,
        }
