"""What a store knows about its tokenizer, and the checks views and mixtures make with it.

A store built from text records its tokenizer in an optional ``"tokenizer"`` section of the
metadata record (``mmpack.json``, the Zarr attributes, or a join's manifest), written by
:mod:`mmpack._src.ingest.provenance`; older readers ignore it and it is not part of the fingerprint::

    {"kind": "tokenizers", "identity": "sha256:…", "file": "tokenizer.json", "source": "/…",
     "vocab_size": 2000, "special_ids": {"eot": 0, "bos": 1, "pad": 2, "mask": 3, "unk": 4}}

``identity`` tells tokenizers apart (``"byte"`` for the byte-level rule, the SHA-256 of
``tokenizer.json`` otherwise).  Views take ``eot="store"`` and ``pad_id="store"`` by default:
the ids the record gives, or, for a store that records none (or a tokenizer without that token),
no eot and pad 0 (:data:`_FALLBACK`); a store built with a special-token template, or with a loss
mask (chat data), gets no eot (its documents carry the template's tokens).  ``mask_id="store"`` and ``vocab_size="store"`` read the
record too, and are refused where it has none.  An explicit id outside the recorded vocabulary,
and a mixture or join of stores with different tokenizers, are refused unless the caller opts in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mmpack.errors import Param, with_params

__all__ = [
    "STORE",
    "check_in_vocab",
    "check_same_tokenizer",
    "resolve_special",
    "tokenizer_record",
]

STORE = "store"
"""The value that makes a view take an id from the store's tokenizer record."""

_FALLBACK: dict[str, int | None] = {"eot": None, "pad_id": 0}
"""What ``"store"`` gives for these ids on a store that records none: no eot, pad 0."""

_ROLES = {"eot": "eot", "pad_id": "pad", "mask_id": "mask", "bos": "bos", "unk": "unk"}


def tokenizer_record(store: Any) -> dict[str, Any] | None:
    """The store's ``"tokenizer"`` section, or None when it records none."""
    meta = getattr(store, "meta", None)
    rec = meta.get("tokenizer") if isinstance(meta, dict) else None
    return rec if isinstance(rec, dict) else None


def _tokenizer_identity(store: Any) -> str | None:
    rec = tokenizer_record(store)
    return None if rec is None else str(rec.get("identity"))


def resolve_special(value: Any, store: Any, name: str) -> Any:
    """``value``, or the id the store records for ``name`` (``"eot"``, ``"pad_id"``,
    ``"mask_id"``, ``"vocab_size"``) when ``value == "store"``.

    For ``"eot"`` and ``"pad_id"`` (the views' defaults are ``"store"``), a store that records
    no tokenizer, or whose tokenizer has no such token, gives :data:`_FALLBACK` (``None``: no
    eot; ``0``).  A store built with a special-token template (``"template"`` in the record)
    gives no eot either: its documents carry the tokens the template chose (an eot of their own,
    a BOS, ``[CLS] ... [SEP]``), and a view adds none on top; so does a store with a loss mask
    (chat data: each conversation ends with its template's end-of-turn, and TRL's labels have
    no target after it), whether or not it records a tokenizer.

    Raises
    ------
    ValueError
        ``mask_id="store"`` or ``vocab_size="store"`` on a store that records no tokenizer, or
        whose tokenizer has no such id.
    """
    if not (isinstance(value, str) and value == STORE):
        return value
    rec = tokenizer_record(store)
    templated = rec is not None and rec.get("template") is not None
    if name == "eot" and (templated or getattr(store, "has_loss_mask", False)):
        return _FALLBACK[name]  # a template (or a chat template) put the documents' own tokens in
    if name == "vocab_size":
        got = None if rec is None else rec.get("vocab_size")
    else:
        got = None if rec is None else (rec.get("special_ids") or {}).get(_ROLES.get(name, name))
    if got is not None:
        return int(got)
    if name in _FALLBACK:
        return _FALLBACK[name]
    where = getattr(store, "location", "the store")
    if rec is None:
        raise ValueError(
            f"{name}='store' but {where} records no tokenizer (it was not built from text); "
            f"pass {name} explicitly"
        )
    raise ValueError(
        f"{name}='store' but the tokenizer of {where} has no {_ROLES.get(name, name)} "
        f"token; pass {name} explicitly"
    )


def check_in_vocab(store: Any, ids: dict[str, int | None], allow: bool) -> None:
    """Raise ``ValueError`` if an id of ``ids`` lies outside the store's recorded vocabulary
    (the message names ``name='store'`` and ``check_vocab=False`` as :class:`~mmpack.errors.Param`
    parts, which the ``mmpack`` command spells as its flags)."""
    rec = tokenizer_record(store)
    if allow or rec is None or not isinstance(rec.get("vocab_size"), int):
        return
    vocab = rec["vocab_size"]
    for name, value in ids.items():
        if value is not None and value >= vocab:
            raise with_params(
                ValueError,
                Param(name, value),
                " is outside the vocabulary of the store's tokenizer "
                f"({vocab} ids, {rec.get('kind')}; its eot is "
                f"{(rec.get('special_ids') or {}).get('eot')}); pass ",
                Param(name, STORE),
                " to use the tokenizer's own id, or ",
                Param("check_vocab", False),
                " if this id is intended",
            )


def check_same_tokenizer(stores: Iterable[Any], allow: bool, what: str) -> None:
    """Raise ``ValueError`` if the stores record different tokenizers (stores that record none
    are not compared); ``what`` names the items in the message (e.g. ``"sources"``)."""
    if allow:
        return
    first: tuple[int, str] | None = None
    for k, store in enumerate(stores):
        ident = _tokenizer_identity(store)
        if ident is None:
            continue
        if first is None:
            first = (k, ident)
        elif ident != first[1]:
            raise with_params(
                ValueError,
                f"{what} {first[0]} and {k} come from stores with different tokenizers "
                f"({first[1]} and {ident}): their token ids mean different things; pass ",
                Param("mixed_tokenizers", True),
                " if that is intended",
            )
