"""Specification of :mod:`mmpack._src.sampling.sampler_state`: a loaded sampler state is checked
field by field (malformed, missing or mistyped: FormatError naming the field; of another sampler
or order: StateMismatchError naming both values; numpy scalars load), through
:class:`mmpack.ResumableSampler`.

Run: ``.venv/bin/python -m pytest tests/sampling/test_sampler_state.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _orders import ORDERS, make_sampler, orders

from mmpack import ResumableSampler
from mmpack._src.sampling.sampler_state import STATE_FIELDS, STATE_VERSION
from mmpack.errors import FormatError, StateMismatchError


def test_a_state_refuses_a_sampler_of_another_order():
    bounds = [0, 3, 7, 10]
    blocks = ResumableSampler(10, shuffle="blocks", block_bounds=bounds, window_blocks=2)
    with pytest.raises(
        StateMismatchError, match="shuffle='blocks' but this sampler has shuffle=True"
    ):
        ResumableSampler(10).load_state_dict(blocks.state_dict())
    with pytest.raises(
        StateMismatchError, match="shuffle=True but this sampler has shuffle='blocks'"
    ):
        blocks.load_state_dict(ResumableSampler(10).state_dict())
    other_w = ResumableSampler(10, shuffle="blocks", block_bounds=bounds, window_blocks=3)
    with pytest.raises(
        StateMismatchError, match="window_blocks=2 but this sampler has window_blocks=3"
    ):
        other_w.load_state_dict(blocks.state_dict())
    other_b = ResumableSampler(10, shuffle="blocks", block_bounds=[0, 3, 6, 10], window_blocks=2)
    with pytest.raises(StateMismatchError, match="other block_bounds") as info:
        other_b.load_state_dict(blocks.state_dict())
    assert isinstance(info.value, ValueError) and "3 blocks" in str(info.value)
    same = ResumableSampler(10, shuffle="blocks", block_bounds=np.array(bounds), window_blocks=2)
    same.load_state_dict(blocks.state_dict())  # equal bounds, equal digest


@pytest.mark.parametrize(
    "field, value",
    [("n", 11), ("seed", 1), ("shuffle", False), ("drop_last", True)],
)
def test_state_mismatch_names_field_and_values(field, value):
    state = ResumableSampler(10).state_dict()
    other = ResumableSampler(**{"n": 10, field: value}) if field != "n" else ResumableSampler(value)
    with pytest.raises(StateMismatchError, match=rf"{field}=.*{field}=") as info:
        other.load_state_dict(state)
    assert isinstance(info.value, ValueError)
    assert repr(state[field]) in str(info.value) and repr(value) in str(info.value)


@orders
def test_malformed_states(order):
    s = make_sampler(10, order)
    good = s.state_dict()
    with pytest.raises(FormatError, match="version"):
        s.load_state_dict({**good, "version": STATE_VERSION + 1})
    with pytest.raises(FormatError, match="position"):
        s.load_state_dict({k: v for k, v in good.items() if k != "position"})
    with pytest.raises(FormatError, match="position=11"):
        s.load_state_dict({**good, "position": 11})
    with pytest.raises(FormatError, match="position=-1"):
        s.load_state_dict({**good, "position": -1})
    with pytest.raises(FormatError, match="dict"):
        s.load_state_dict([1, 2])


@pytest.mark.parametrize("order, field", [(o, f) for o in ORDERS for f in STATE_FIELDS])
def test_a_state_missing_any_field_is_a_format_error_naming_it(order, field):
    good = make_sampler(10, order, world_size=2).state_dict()
    with pytest.raises(FormatError, match=field):
        make_sampler(10, order, world_size=2).load_state_dict(
            {k: v for k, v in good.items() if k != field}
        )


@pytest.mark.parametrize(
    "field, value",
    [
        ("version", True),
        ("version", "1"),
        ("n", 10.0),
        ("n", "10"),
        ("n", True),
        ("seed", 0.0),
        ("seed", None),
        ("shuffle", 1),
        ("shuffle", "True"),
        ("drop_last", 0),
        ("world_size", 2.0),
        ("world_size", "2"),
        ("world_size", None),
        ("rank", 1.0),
        ("rank", "0"),
        ("rank", -1),
        ("rank", 2),
        ("epoch", 0.0),
        ("epoch", "0"),
        ("position", 1.0),
        ("offset", "0"),
        ("offset", None),
        ("shuffle", "block"),
        ("window_blocks", 2.0),
        ("window_blocks", "3"),
        ("bounds_digest", [0, 10]),
        ("fingerprint", 3),
        ("skips", [[1, 2, 3]]),
        ("skips", [[5, 3]]),
        ("skips", [[4, 6], [1, 2]]),
        ("skips", [[1.0, 2]]),
        ("skips", "none"),
        ("replays", [[0, 0, 2]]),
        ("replays", [[0, 0, 2, 2]]),
        ("replays", [[0, -1, 0, 2]]),
        ("replays", [[0, 99, 0, 2]]),
    ],
)
@orders
def test_a_mistyped_state_field_is_a_format_error_naming_it(field, value, order):
    good = make_sampler(10, order, world_size=2).state_dict()
    with pytest.raises(FormatError, match=rf"\b{field}\b") as info:
        make_sampler(10, order, world_size=2).load_state_dict({**good, field: value})
    assert repr(value) in str(info.value)


@orders
def test_numpy_scalars_in_a_state_load(order):
    s = make_sampler(10, order, world_size=2)
    it = iter(s)
    next(it)
    state = s.state_dict()
    cast = {
        k: v
        if isinstance(v, (str, list)) or v is None
        else np.bool_(v)
        if isinstance(v, bool)
        else np.uint64(v)
        for k, v in state.items()
    }
    fresh = make_sampler(10, order, world_size=2)
    fresh.load_state_dict(cast)
    assert fresh.state_dict() == state
