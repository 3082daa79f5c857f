"""The sampler state schema: one versioned dict for every order, with its edits and dataset.

``ResumableSampler.state_dict`` writes, :func:`checked_state` validates (field, type, meaning):

=================  ==============================  ===========================================
``version``        int                             :data:`STATE_VERSION`
``n``, ``seed``    int                             samples of the dataset, key of the order
``shuffle``        bool or ``"blocks"``            the order (global, block-window, in order)
``drop_last``      bool                            how the epoch's tail is dealt
``window_blocks``  int or None                     block order: blocks per window, else None
``bounds_digest``  int or None                     block order: 64-bit digest of the bounds
``fingerprint``    str or None                     the dataset configuration it was saved for
``world_size``     int                             ranks of the run that saved it (and ``rank``)
``epoch``          int                             the epoch in progress
``position``       int                             indices each rank drew from ``offset``
``offset``         int                             stream index the epoch's shares start at
``skips``          list of ``[start, stop]``       skipped global positions, sorted, disjoint
``replays``        list of ``[epoch, at, a, b]``   replayed ranges, in the order of the calls
=================  ==============================  ===========================================

Another configuration (``n`` to ``fingerprint``) is a ``StateMismatchError`` naming the field
and both values (except an *earlier* mixture fingerprint read in order up to the change); any
other defect a ``FormatError`` naming the field and its value.  Cost: O(fields + edits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmpack._src.sampling.sampler_edits import EditLog
from mmpack.errors import FormatError, StateMismatchError

__all__ = ["STATE_FIELDS", "STATE_VERSION", "check_config", "checked_state"]

STATE_VERSION = 2
"""Version of the dict written by :meth:`ResumableSampler.state_dict`."""

BLOCKS = "blocks"
_CONFIG_FIELDS = (
    "n",
    "seed",
    "shuffle",
    "drop_last",
    "window_blocks",
    "bounds_digest",
    "fingerprint",
)
"""Fields that describe the sampler's configuration, compared on load."""
_INT_FIELDS = ("n", "seed", "world_size", "rank", "epoch", "position", "offset")
STATE_FIELDS = (
    "version",
    *_CONFIG_FIELDS,
    "world_size",
    "rank",
    "epoch",
    "position",
    "offset",
    "skips",
    "replays",
)
"""Every field of a sampler state, in the order ``state_dict`` writes them."""


def _is_int(value: object) -> bool:
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer))


def _int(state: dict[str, Any], name: str) -> int:
    value = state[name]
    if not _is_int(value):
        raise FormatError(f"sampler state field {name} must be an int, got {value!r}")
    return int(value)


def _ints(value: object, name: str, length: int, whole: object) -> list[int]:
    """``value`` as a list of ``length`` non-negative ints (one edit of ``skips``/``replays``)."""
    if not isinstance(value, (list, tuple)) or len(value) != length:
        raise FormatError(
            f"sampler state field {name} must hold lists of {length} ints, got {whole!r}"
        )
    if not all(_is_int(v) and int(v) >= 0 for v in value):
        raise FormatError(f"sampler state field {name} must hold non-negative ints, got {whole!r}")
    return [int(v) for v in value]


def _edits(state: dict[str, Any]) -> tuple[list[list[int]], list[list[int]]]:
    skips_in, replays_in = state["skips"], state["replays"]
    for name, value in (("skips", skips_in), ("replays", replays_in)):
        if not isinstance(value, (list, tuple)):
            raise FormatError(f"sampler state field {name} must be a list, got {value!r}")
    skips = [_ints(s, "skips", 2, skips_in) for s in skips_in]
    last = -1
    for a, b in skips:
        if not last < a < b:
            raise FormatError(
                f"sampler state field skips must hold sorted, disjoint ranges [start, stop) with "
                f"start < stop, got {skips_in!r}"
            )
        last = b
    replays = [_ints(r, "replays", 4, replays_in) for r in replays_in]
    for r in replays:
        if not r[2] < r[3] or r[0] >= 2**64:
            raise FormatError(
                f"sampler state field replays must hold [epoch, at, start, stop] with start < stop, "
                f"got {replays_in!r}"
            )
    return skips, replays


def _order_fields(state: dict[str, Any], out: dict[str, Any]) -> None:
    value = state["shuffle"]
    blocks = isinstance(value, str) and value == BLOCKS
    if not blocks and not isinstance(value, (bool, np.bool_)):
        raise FormatError(f"sampler state field shuffle must be a bool or 'blocks', got {value!r}")
    out["shuffle"] = BLOCKS if blocks else bool(value)
    for name in ("window_blocks", "bounds_digest"):
        value = state[name]
        if blocks and not _is_int(value):
            raise FormatError(
                f"sampler state field {name} must be an int with shuffle='blocks', got {value!r}"
            )
        if not blocks and value is not None:
            raise FormatError(
                f"sampler state field {name} must be None with shuffle={out['shuffle']!r}, "
                f"got {value!r}"
            )
        out[name] = None if value is None else int(value)


def checked_state(state: Any) -> dict[str, Any]:
    """The fields of a saved sampler state as plain Python values, checked one by one.

    Raises
    ------
    mmpack.errors.FormatError
        ``state`` is not a dict, lacks a field or has an unknown one, is of another version, holds
        a field of the wrong type or out of range (naming it and its value), or records a rank
        outside its world size.
    """
    if not isinstance(state, dict):
        raise FormatError(f"sampler state must be a dict, got {type(state).__name__}")
    missing = [k for k in STATE_FIELDS if k not in state]
    if missing:
        raise FormatError(f"sampler state lacks the fields {missing}")
    unknown = sorted(str(k) for k in state if k not in STATE_FIELDS)
    if unknown:
        raise FormatError(f"sampler state has unknown fields {unknown}")
    version = _int(state, "version")
    if version != STATE_VERSION:
        raise FormatError(
            f"sampler state has version {version!r}; this mmpack reads version {STATE_VERSION}"
        )
    out: dict[str, Any] = {"version": version}
    for name in _INT_FIELDS:
        out[name] = _int(state, name)
    value = state["drop_last"]
    if not isinstance(value, (bool, np.bool_)):
        raise FormatError(f"sampler state field drop_last must be a bool, got {value!r}")
    out["drop_last"] = bool(value)
    _order_fields(state, out)
    value = state["fingerprint"]
    if value is not None and not isinstance(value, str):
        raise FormatError(f"sampler state field fingerprint must be a str or None, got {value!r}")
    out["fingerprint"] = value
    if out["world_size"] < 1:
        raise FormatError(f"sampler state has world_size={out['world_size']}, expected >= 1")
    if not 0 <= out["rank"] < out["world_size"]:
        raise FormatError(
            f"sampler state has rank={out['rank']}, expected 0 <= rank < world_size="
            f"{out['world_size']}"
        )
    if not 0 <= out["epoch"] < 2**64:
        raise FormatError(f"sampler state has epoch={out['epoch']}, expected 0 <= epoch < 2**64")
    out["skips"], out["replays"] = _edits(state)
    return out


def check_config(
    state: dict[str, Any], ours: dict[str, Any], earlier: Sequence[tuple[str, int]] = ()
) -> None:
    """Refuse a checked state saved for another configuration than ``ours``.

    ``earlier``: ``(fingerprint, p)`` pairs of datasets whose samples before position ``p`` are
    those of this one; a state of such a fingerprint loads if it stands at or before ``p``.

    Raises
    ------
    mmpack.errors.StateMismatchError
        A field of :data:`_CONFIG_FIELDS` differs; the message names it and both values.
    """
    for field in _CONFIG_FIELDS:
        saved, mine = state[field], ours[field]
        if field == "fingerprint" and saved != mine and _earlier_state(state, mine, earlier):
            continue
        if saved != mine or type(saved) is not type(mine):
            if field == "bounds_digest" and saved is not None and mine is not None:
                raise StateMismatchError(
                    f"sampler state was saved with other block_bounds (digest {saved:#x}) than "
                    f"this sampler's ({ours['n_blocks']} blocks, digest {mine:#x})"
                )
            raise StateMismatchError(
                f"sampler state was saved with {field}={saved!r} but this sampler has "
                f"{field}={mine!r}"
            )


def _earlier_state(state: dict[str, Any], mine: Any, earlier: Sequence[tuple[str, int]]) -> bool:
    """Whether ``state`` is one of an earlier fingerprint standing at or before its change
    (``StateMismatchError`` if it is one standing past it)."""
    change = dict(earlier).get(state["fingerprint"])
    if change is None:
        return False
    if state["shuffle"] is not False:
        raise StateMismatchError(
            f"sampler state was saved with fingerprint={state['fingerprint']!r}, the dataset "
            f"this one (fingerprint={mine!r}) was changed from at position {change}, but with "
            f"shuffle={state['shuffle']!r}: only a state read in order resumes across the change"
        )
    n, epoch = state["n"], state["epoch"]
    edits = EditLog.from_state(n, state["skips"], state["replays"])
    g = state["offset"] + state["position"] * state["world_size"]
    at = edits.frontier(epoch, g)
    if at > change:
        raise StateMismatchError(
            f"sampler state was saved with fingerprint={state['fingerprint']!r}, the dataset "
            f"this one (fingerprint={mine!r}) was changed from at position {change}, but it "
            f"stands at position {at}, past the change: resume from a state taken at or before "
            f"position {change}, or change from position {at} or later"
        )
    return True
