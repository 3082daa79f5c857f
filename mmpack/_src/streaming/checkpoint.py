"""The streaming packer's state: one versioned schema, and how a loaded state is checked.

:class:`PackerState` is what :meth:`StreamingPacker.state_dict` returns (as a plain dict:
:meth:`PackerState.as_dict`) and :meth:`StreamingPacker.load_state_dict` takes.  Its fields:

==================  =============================================================================
``version``         4 (the only version read)
``config``          the parameters that decide the batches (a dict; another value refuses)
``shard``           ``[k, S]``: the consumer's shard of the source (:mod:`mmpack._src.streaming.shards`)
``source_len``      sequences of the whole source, and its ``fingerprint`` (or None)
``epoch``           the epoch being (or last) iterated, -1 before the first; ``next_epoch``
``in_epoch``        whether the state lies inside an epoch (it resumes there) or between epochs
``next_index``      the first sequence of the shard not yet admitted, ``next_offset`` the token in
                    it (a partly admitted document), ``exhausted`` whether the shard is read out
``pending_*``       source index, offset and length of every held piece (1-D int64 arrays)
``token_count``     real tokens emitted across epochs (the schedules' clock)
``counters``        the epoch's counts (:data:`mmpack._src.streaming.stats.COUNTER_FIELDS`)
==================  =============================================================================

Loading checks every field before anything changes: a malformed state (not a dict, another
version, a missing field, a value of the wrong type, out of range or inconsistent with the
others) is a :class:`~mmpack.errors.FormatError`; a state of other parameters, another shard or
another source is a :class:`~mmpack.errors.StateMismatchError`.  Saving and loading are
O(held pieces).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmpack._src.streaming.admission import Position
from mmpack._src.streaming.stats import COUNTER_FIELDS, AdmissionCounts, EmissionCounts
from mmpack.errors import FormatError, StateMismatchError

__all__ = ["Expected", "PackerState", "STATE_FIELDS", "STATE_VERSION"]

STATE_VERSION = 4
STATE_FIELDS = (
    "config",
    "shard",
    "source_len",
    "source_fingerprint",
    "epoch",
    "next_epoch",
    "in_epoch",
    "next_index",
    "next_offset",
    "exhausted",
    "pending_src",
    "pending_off",
    "pending_len",
    "token_count",
    "counters",
)
_ADMISSION = tuple(f.name for f in dataclasses.fields(AdmissionCounts))
_EMISSION = tuple(f.name for f in dataclasses.fields(EmissionCounts))


@dataclass(frozen=True)
class Expected:
    """What a state must match to load into a packer: its ``config`` (whose ``seqlen`` and
    ``long_docs`` bound the pieces), its ``shard``, its whole source's length and fingerprint,
    and the length of its shard."""

    config: dict[str, Any]
    shard: tuple[int, int]
    source_len: int
    source_fingerprint: Any
    shard_len: int


@dataclass(frozen=True, eq=False)
class PackerState:
    """A packer's position, checked (see the module docstring for the fields), and the packer,
    shard and source it belongs to (``expected``)."""

    expected: Expected
    epoch: int
    next_epoch: int
    in_epoch: bool
    position: Position
    token_count: int
    admission: AdmissionCounts
    emission: EmissionCounts

    def as_dict(self) -> dict[str, Any]:
        """The state as plain Python values and int64 numpy arrays (for ``torch.save``), in the
        order of :data:`STATE_FIELDS`."""
        values = {**vars(self.expected), **vars(self), **vars(self.position)}
        values["shard"] = list(self.expected.shard)
        values["counters"] = {
            **dataclasses.asdict(self.admission),
            **dataclasses.asdict(self.emission),
        }
        state = {"version": STATE_VERSION, **{k: values[k] for k in STATE_FIELDS}}
        for key in ("pending_src", "pending_off", "pending_len"):
            state[key] = state[key].copy()
        return state

    @classmethod
    def from_dict(cls, state: Any, expected: Expected) -> PackerState:
        """``state`` checked field by field against the schema and ``expected``.

        Raises
        ------
        mmpack.errors.FormatError
            Not a dict of this version, a missing field, or a value of the wrong type, out of
            range or inconsistent with the other fields.
        mmpack.errors.StateMismatchError
            Saved by a packer with other parameters, of another shard or over another source.
        """
        _check_header(state)
        _check_same_packer(state, expected)
        n, seqlen = expected.shard_len, expected.config["seqlen"]
        out = {k: state[k] for k in STATE_FIELDS}
        _check_position(out, n)
        if out["next_offset"] and (
            expected.config["long_docs"] != "split"
            or out["next_index"] >= n
            or out["next_offset"] % seqlen
        ):
            raise FormatError(
                f"the state's next_offset={out['next_offset']} is not the start of a piece of "
                f"sequence {out['next_index']}"
            )
        counters = state["counters"]
        if not isinstance(counters, Mapping) or set(counters) != set(COUNTER_FIELDS):
            raise FormatError(f"the state's counters must be a dict of {list(COUNTER_FIELDS)}")
        counts = {k: _state_int(counters[k], k, 0, 2**63) for k in COUNTER_FIELDS}
        src, off, plen = _checked_pending(state, out["next_index"], out["next_offset"], n, seqlen)
        return cls(
            expected=expected,
            epoch=out["epoch"],
            next_epoch=out["next_epoch"],
            in_epoch=out["in_epoch"],
            position=Position(
                out["next_index"], out["next_offset"], out["exhausted"], src, off, plen
            ),
            token_count=out["token_count"],
            admission=AdmissionCounts(**{k: counts[k] for k in _ADMISSION}),
            emission=EmissionCounts(**{k: counts[k] for k in _EMISSION}),
        )


def _state_int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"the state's {key} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value < hi:
        raise FormatError(f"the state's {key}={value} is out of range [{lo}, {hi})")
    return int(value)


def _check_header(state: Any) -> None:
    """``FormatError`` unless ``state`` is a mapping of this version holding every field."""
    if not isinstance(state, Mapping):
        raise FormatError(
            f"state must be a StreamingPacker state_dict() (a dict), got {type(state).__name__}"
        )
    version = state.get("version")
    if version != STATE_VERSION:
        raise FormatError(
            f"state must be a StreamingPacker state_dict() of version {STATE_VERSION}, got "
            f"version {version!r}"
        )
    need = [k for k in STATE_FIELDS if k not in state]
    if need:
        raise FormatError(f"the state lacks the fields {need}")


def _check_same_packer(state: Mapping[str, Any], expected: Expected) -> None:
    """``StateMismatchError`` unless ``state`` was saved by a packer with these parameters,
    as this shard, over this source (same length and fingerprint)."""
    config, saved = expected.config, state["config"]
    if not isinstance(saved, Mapping):
        raise FormatError(f"the state's config must be a dict, got {type(saved).__name__}")
    diff = sorted(k for k in set(config) | set(saved) if saved.get(k) != config.get(k))
    if diff:
        raise StateMismatchError(
            "the state was saved by a packer with other parameters: "
            + ", ".join(f"{k}={saved.get(k)!r} (now {config.get(k)!r})" for k in diff)
        )
    shard = state["shard"]
    if not isinstance(shard, (list, tuple)) or len(shard) != 2:
        raise FormatError(f"the state's shard must be a list [k, n_shards], got {shard!r}")
    k, n_shards = (_state_int(v, "shard", 0, 2**63) for v in shard)
    if (k, n_shards) != expected.shard:
        raise StateMismatchError(
            f"the state was saved by shard {k} of {n_shards}; this packer is shard "
            f"{expected.shard[0]} of {expected.shard[1]} (another rank, worker or number of them)"
        )
    n, fingerprint = expected.source_len, expected.source_fingerprint
    if state["source_len"] != n or state["source_fingerprint"] != fingerprint:
        raise StateMismatchError(
            f"the state was saved over another source ({state['source_len']!r} sequences, "
            f"fingerprint {state['source_fingerprint']!r}; now {n}, {fingerprint})"
        )


def _check_position(out: dict[str, Any], n: int) -> None:
    """Check (and make plain) the position fields of ``out`` in place: the epochs, the next
    sequence and token, the token count, and the flags, consistent with a shard of ``n``."""
    for key, lo, hi in (
        ("epoch", -1, 2**64),
        ("next_epoch", 0, 2**64),
        ("next_index", 0, n + 1),
        ("next_offset", 0, 2**63),
        ("token_count", 0, 2**63),
    ):
        out[key] = _state_int(out[key], key, lo, hi)
    for key in ("in_epoch", "exhausted"):
        if not isinstance(out[key], (bool, np.bool_)):
            raise FormatError(f"the state's {key} must be a bool, got {out[key]!r}")
        out[key] = bool(out[key])
    if out["in_epoch"] and out["epoch"] < 0:
        raise FormatError(f"the state is inside epoch {out['epoch']}; epochs count from 0")
    if out["exhausted"] and (out["next_index"] != n or out["next_offset"]):
        raise FormatError(
            f"the state says the source is exhausted at sequence {out['next_index']} (token "
            f"{out['next_offset']}), but the source holds {n} sequences"
        )


def _checked_pending(
    state: Mapping[str, Any], next_index: int, next_offset: int, n: int, row_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The held pieces ``(source, offset, length)`` as int64 arrays, checked: sources already
    admitted (before ``next_index``, or it when partly admitted), offsets >= 0, lengths in
    ``[1, row_len]``."""
    arrays = []
    for key in ("pending_src", "pending_off", "pending_len"):
        a = state[key]
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind not in "iu":
            raise FormatError(
                f"the state's {key} must be a 1-D integer numpy array, got "
                f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}"
            )
        arrays.append(a.astype(np.int64))
    src, off, plen = arrays
    if not src.shape == off.shape == plen.shape:
        raise FormatError(
            f"the state's pending arrays differ in length: {src.shape[0]}, {off.shape[0]}, "
            f"{plen.shape[0]}"
        )
    if src.size and (
        src.min() < 0
        or src.max() >= next_index + int(next_offset > 0)
        or src.max() >= n
        or off.min() < 0
        or plen.min() < 1
        or plen.max() > row_len
    ):
        raise FormatError(
            "the state's pending pieces are out of range: sources must be admitted ones "
            f"(< next_index={next_index}), offsets >= 0, lengths in [1, {row_len}]"
        )
    return src, off, plen
