"""The streaming packer's resumable state: what it records, and how a loaded state is checked.

A state is a small dict of plain values and three int64 arrays (source index, offset and length
of every held piece), versioned (version 3 adds ``next_offset``, the tokens of a partly admitted
document; version 2 states still load).  Loading checks every field before changing anything: a
malformed state (wrong type, out of range, inconsistent, missing field) is a
:class:`~mmpack.errors.FormatError`, a state of other parameters or another source a
:class:`~mmpack.errors.StateMismatchError`.  Saving and loading are O(held pieces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mmpack.errors import FormatError, StateMismatchError
from mmpack.streaming.pieces import PieceBuffer
from mmpack.streaming.sources import flat_sequences, tokens_of

__all__: list[str] = []

_STATE_VERSION = 3
_READ_VERSIONS = (2, 3)  # version 2 had no next_offset (always 0)
_STATE_FIELDS = (
    "config",
    "source_len",
    "source_fingerprint",
    "epoch",
    "next_epoch",
    "in_epoch",
    "next_index",
    "exhausted",
    "pending_src",
    "pending_off",
    "pending_len",
    "token_count",
    "counters",
)
_COUNTERS = (
    "seqs_consumed",
    "seqs_emitted",
    "tokens_emitted",
    "slots_emitted",
    "batches_emitted",
    "seqs_empty",
    "seqs_split",
    "seqs_truncated",
    "seqs_dropped",
    "tokens_discarded",
)


def _state_int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"the state's {key} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value < hi:
        raise FormatError(f"the state's {key}={value} is out of range [{lo}, {hi})")
    return int(value)


def _check_header(state: Any) -> int:
    """The version of ``state``, a mapping of a readable version holding every field."""
    if not isinstance(state, Mapping):
        raise FormatError(
            f"state must be a StreamingPacker state_dict() (a dict), got {type(state).__name__}"
        )
    version = state.get("version")
    if version not in _READ_VERSIONS:
        raise FormatError(
            f"state must be a StreamingPacker state_dict() of version {_STATE_VERSION}, got "
            f"version {version!r}"
        )
    need = [k for k in _STATE_FIELDS if k not in state]
    if need:
        raise FormatError(f"the state lacks the fields {need}")
    return version


def _check_position(out: dict[str, Any], n: int) -> None:
    """Check (and make plain) the position fields of ``out`` in place: the epochs, the next
    sequence and token, the token count, and the flags, consistent with a source of ``n``."""
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


class _Checkpointing:
    """The checkpointing half of :class:`mmpack.streaming.packer.StreamingPacker` (a mixin: the
    packer owns the attributes and methods declared here)."""

    source: Any
    out_batch_size: int
    out_pseq_len: int
    buffer_size: int
    mode: str | None
    pad_id: int
    mask_id: int | None
    vocab_size: int | None
    special_ids: tuple[int, ...]
    mask_prob: float
    ignore_index: int
    long_docs: str
    drop_last: bool
    seed: int
    batch_size_schedule: Any
    mask_prob_schedule: Any
    token_count: int
    _indexed: bool
    _store_like: bool
    _pieces: PieceBuffer
    _epoch: int
    _next_epoch: int
    _in_epoch: bool
    _resume: dict[str, Any] | None
    _exhausted: bool
    _head_off: int
    _read_index: int
    _q_lens: np.ndarray
    _q_src: np.ndarray

    def _start_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        bs, mp = self.batch_size_schedule, self.mask_prob_schedule
        return {
            "out_batch_size": self.out_batch_size,
            "out_pseq_len": self.out_pseq_len,
            "buffer_size": self.buffer_size,
            "mode": self.mode,
            "pad_id": self.pad_id,
            "mask_id": self.mask_id,
            "vocab_size": self.vocab_size,
            "special_ids": list(self.special_ids),
            "mask_prob": self.mask_prob,
            "ignore_index": self.ignore_index,
            "long_docs": self.long_docs,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "batch_size_schedule": None if bs is None else [bs.min_batch_size, bs.warmup_tokens],
            "mask_prob_schedule": None
            if mp is None
            else [mp.final, mp.start_tokens, mp.cooldown_tokens, mp.schedule, mp.step_size],
        }

    def _require_indexed(self, what: str) -> None:
        if not self._indexed:
            raise TypeError(
                f"{what} needs a random-access source of sequences (a TokenStore, a view, a "
                "map-style dataset or a list: anything with __len__ and __getitem__ yielding "
                f"sequences); this packer iterates an opaque {type(self.source).__name__}, whose "
                "position cannot be restored exactly"
            )

    def state_dict(self) -> dict[str, Any]:
        """The position of the packer: restoring it makes the next batch the one that comes next.

        Take it between batches from the thread that iterates the packer (not through a
        prefetcher, which runs ahead), or after the source raised: admission is transactional,
        so no sequence read ahead is lost.  Raises :class:`TypeError` for an opaque source.

        Returns
        -------
        dict
            Plain Python values and int64 numpy arrays (``pending_*``: source index, offset and
            length of every held piece), suitable for ``torch.save``.  ``next_index`` and
            ``next_offset`` are the first source sequence, and the token in it, not yet admitted
            as a piece.
        """
        self._require_indexed("state_dict()")
        pieces = self._pieces
        queued = self._q_lens.shape[0] > 0
        return {
            "version": _STATE_VERSION,
            "config": self._config(),
            "source_len": len(self.source),
            "source_fingerprint": getattr(self.source, "fingerprint", None),
            "epoch": self._epoch,
            "next_epoch": self._next_epoch,
            "in_epoch": self._in_epoch,
            "next_index": int(self._q_src[0]) if queued else self._read_index,
            "next_offset": self._head_off,
            "exhausted": self._exhausted and not queued,
            "pending_src": pieces.src.copy(),
            "pending_off": pieces.src_off.copy(),
            "pending_len": pieces.lens.copy(),
            "token_count": self.token_count,
            "counters": {k: getattr(self, k) for k in _COUNTERS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the next ``iter()`` continues from there.

        Every field is checked before anything changes.

        Raises
        ------
        TypeError
            For an opaque source.
        mmpack.errors.FormatError
            The state is not a dict of this format or version, lacks a field, or holds a value of
            the wrong type, out of range, or inconsistent with the other fields (e.g.
            ``exhausted`` before the end of the source).
        mmpack.errors.StateMismatchError
            The state comes from a packer with other parameters or another source.
        """
        self._require_indexed("load_state_dict()")
        state = self._checked_state(state)
        self.token_count = state["token_count"]
        self._next_epoch = state["next_epoch"]
        self._resume = state if state["in_epoch"] else None
        if not state["in_epoch"]:
            self._epoch = state["epoch"]
            self._in_epoch = False

    def _checked_state(self, state: Any) -> dict[str, Any]:
        """A validated copy of ``state`` with plain ints and int64 arrays."""
        version = _check_header(state)
        self._check_same_packer(state)
        n = len(self.source)
        out = dict(state)
        if version == 2:  # before next_offset: whole documents were admitted
            out.setdefault("next_offset", 0)
        elif "next_offset" not in state:
            raise FormatError("the state lacks the fields ['next_offset']")
        _check_position(out, n)
        if out["next_offset"] and (
            self.long_docs != "split"
            or out["next_index"] >= n
            or out["next_offset"] % self.out_pseq_len
        ):
            raise FormatError(
                f"the state's next_offset={out['next_offset']} is not the start of a piece of "
                f"sequence {out['next_index']}"
            )
        counters = state["counters"]
        if not isinstance(counters, Mapping) or set(counters) != set(_COUNTERS):
            raise FormatError(f"the state's counters must be a dict of {list(_COUNTERS)}")
        out["counters"] = {k: _state_int(counters[k], k, 0, 2**63) for k in _COUNTERS}
        pending = _checked_pending(
            state, out["next_index"], out["next_offset"], n, self.out_pseq_len
        )
        out["pending_src"], out["pending_off"], out["pending_len"] = pending
        return out

    def _check_same_packer(self, state: Mapping[str, Any]) -> None:
        """``StateMismatchError`` unless ``state`` was saved by a packer with these parameters
        over this source (same length and fingerprint)."""
        config = self._config()
        saved = state["config"]
        if not isinstance(saved, Mapping):
            raise FormatError(f"the state's config must be a dict, got {type(saved).__name__}")
        diff = sorted(k for k in config if saved.get(k) != config[k])
        if diff:
            raise StateMismatchError(
                "the state was saved by a packer with other parameters: "
                + ", ".join(f"{k}={saved.get(k)!r} (now {config[k]!r})" for k in diff)
            )
        n = len(self.source)
        fingerprint = getattr(self.source, "fingerprint", None)
        if state["source_len"] != n or state["source_fingerprint"] != fingerprint:
            raise StateMismatchError(
                f"the state was saved over another source ({state['source_len']!r} sequences, "
                f"fingerprint {state['source_fingerprint']!r}; now {n}, {fingerprint})"
            )

    def _restore_epoch(self, state: dict[str, Any]) -> None:
        self._start_epoch(state["epoch"])
        for k, v in state["counters"].items():
            setattr(self, k, v)
        self._read_pieces(state["pending_src"], state["pending_off"], state["pending_len"])
        self._read_index = state["next_index"]
        self._head_off = state["next_offset"]
        if self._head_off and self._head_off >= self._doc_len(self._read_index):
            raise StateMismatchError(
                f"the state's next_offset={self._head_off} lies past the end of source sequence "
                f"{self._read_index}"
            )
        self._exhausted = state["exhausted"]

    def _read_pieces(self, src: np.ndarray, off: np.ndarray, plen: np.ndarray) -> None:
        if self._store_like:
            doc_lens = np.diff(self.source.offsets)[src]
            if np.any(off + plen > doc_lens):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            self._pieces.append(plen, src, off, np.zeros_like(plen))
            return
        tokens: list[np.ndarray] = []
        docs: dict[int, Any] = {}
        for j, o, n in zip(src.tolist(), off.tolist(), plen.tolist()):
            doc = docs.get(j)
            if doc is None:
                doc = docs[j] = flat_sequences([self.source[j]], j)[0]
            if o + n > len(doc):
                raise StateMismatchError("the state's pending pieces lie outside the source")
            tokens.append(doc[o : o + n])
        flat, _ = flat_sequences(tokens)
        base = self._pieces.add_chunk(flat)
        self._pieces.append(plen, src, off, base + np.cumsum(plen) - plen)

    def _doc_len(self, j: int) -> int:
        source: Any = self.source
        if self._store_like:
            return int(source.offsets[j + 1] - source.offsets[j])
        return len(tokens_of(source[j]))
