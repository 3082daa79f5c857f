"""Specification of :mod:`mmpack._src.streaming.checkpoint`: the packer's state schema and the
checks of a loaded state (malformed: FormatError; of other parameters or source:
StateMismatchError), through :class:`mmpack.StreamingPacker`.

Run: ``.venv/bin/python -m pytest tests/streaming/test_checkpoint.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _packer import KW, STATE_KW, take

from mmpack import StreamingPacker
from mmpack.errors import FormatError, StateMismatchError


def test_state_mismatch(docs):
    p = StreamingPacker(docs, **KW)
    next(iter(p))
    state = p.state_dict()
    with pytest.raises(StateMismatchError, match="buffer_size"):
        StreamingPacker(docs, **{**KW, "buffer_size": 5}).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="source"):
        StreamingPacker(docs[:-1], **KW).load_state_dict(state)
    with pytest.raises(FormatError, match="version"):  # malformed: FormatError, as the sampler
        StreamingPacker(docs, **KW).load_state_dict({"version": 99})


def _tampered(state, **changes):
    out = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
    for k, v in changes.items():
        if v is _DELETE:
            del out[k]
        else:
            out[k] = v
    return out


_DELETE = object()


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"next_index": -40}, "next_index=-40"),
        ({"next_index": 2.5}, "next_index must be an int"),
        ({"next_index": 10**12}, "next_index=1000000000000"),
        ({"next_index": True}, "next_index must be an int"),
        ({"exhausted": True}, "exhausted"),
        ({"exhausted": 1}, "exhausted must be a bool"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": 2**64}, "epoch"),
        ({"next_epoch": -3}, "next_epoch"),
        ({"in_epoch": "yes"}, "in_epoch must be a bool"),
        ({"config": None}, "config must be a dict"),
        ({"counters": _DELETE}, "lacks the fields"),
        ({"counters": {"n_docs": 1}}, "counters"),
        ({"token_count": -1}, "token_count"),
        ({"next_offset": 5}, "next_offset"),
        ({"next_offset": -40}, "next_offset"),
        ({"pending_src": [0, 1]}, "pending_src must be a 1-D integer numpy array"),
        ({"pending_off": np.zeros(3)}, "pending_off must be a 1-D integer numpy array"),
        ({"pending_len": np.ones((2, 2), dtype=np.int64)}, "pending_len must be a 1-D"),
        ({"pending_src": np.zeros(1, dtype=np.int64)}, "differ in length"),
    ],
)
def test_load_state_dict_validates_every_field(changes, match):
    rng = np.random.default_rng(9)
    docs = [rng.integers(4, 90, size=int(n)) for n in rng.integers(1, 90, size=60)]
    packer = StreamingPacker(docs, **STATE_KW)
    it = iter(packer)
    next(it)
    next(it)
    state = packer.state_dict()
    assert state["pending_src"].size > 1 and 0 < state["next_index"] < len(docs)
    fresh = StreamingPacker(docs, **STATE_KW)
    with pytest.raises(FormatError, match=match):
        fresh.load_state_dict(_tampered(state, **changes))
    assert fresh._resume is None  # nothing was changed by the refused state
    with pytest.raises(FormatError, match="dict"):
        fresh.load_state_dict([1, 2])
    fresh.load_state_dict(state)  # the untampered state loads


def test_pending_pieces_of_unread_sequences_are_refused():
    rng = np.random.default_rng(9)
    docs = [rng.integers(4, 90, size=int(n)) for n in rng.integers(1, 90, size=60)]
    packer = StreamingPacker(docs, **STATE_KW)
    next(iter(packer))
    state = packer.state_dict()
    src = state["pending_src"].copy()
    src[-1] = state["next_index"]  # a sequence not yet admitted
    with pytest.raises(FormatError, match="pending pieces"):
        StreamingPacker(docs, **STATE_KW).load_state_dict(_tampered(state, pending_src=src))
    plen = state["pending_len"].copy()
    plen[0] = 41  # longer than a row
    with pytest.raises(FormatError, match="pending pieces"):
        StreamingPacker(docs, **STATE_KW).load_state_dict(_tampered(state, pending_len=plen))


def test_one_state_schema():
    """The state is one schema (version 4, every field of mmpack._src.streaming.checkpoint); a state
    of any other version is refused as malformed, even when its fields would fit."""
    from mmpack._src.streaming.checkpoint import STATE_FIELDS, STATE_VERSION

    rng = np.random.default_rng(3)
    docs = [rng.integers(4, 90, size=int(n)) for n in rng.integers(1, 30, size=60)]
    packer = StreamingPacker(docs, **STATE_KW)
    take(iter(packer), 4)
    state = packer.state_dict()
    assert state["version"] == STATE_VERSION == 4
    assert set(state) == {"version", *STATE_FIELDS}
    assert state["config"]["seqlen"] == 40 and state["shard"] == [0, 1]
    for version in (2, 3, 5, None):
        with pytest.raises(FormatError, match="version"):
            StreamingPacker(docs, **STATE_KW).load_state_dict(_tampered(state, version=version))
