"""``add_eot``: the plan functions' flag, formerly ``eot=`` (a token id everywhere else in mmpack).

The old keyword keeps working with a ``DeprecationWarning`` at the caller and gives the same
plan, key and cache file; giving both names, or neither, is a ``TypeError``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from mmpack.views.plan import build_plan, cached_plan, load_plan, plan_cache_key, save_plan

LENS = np.array([3, 5, 0, 9, 2, 7, 40, 1])


class FakeStore:
    """The attributes :func:`cached_plan` reads."""

    def __init__(self, path: Path) -> None:
        self.fingerprint = "feedfacefeedface"
        self.cache_dir = path / "cache"
        self.doc_lens = LENS


def same(a, b) -> bool:
    names = ("bin_ptr", "piece_doc", "piece_start", "piece_len")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and (
        a.add_eot,
        a.stats,
    ) == (b.add_eot, b.stats)


@pytest.mark.parametrize("flag", [True, False])
def test_build_plan_eot_is_a_deprecated_alias(flag):
    new = build_plan(LENS, 8, add_eot=flag)
    with pytest.warns(DeprecationWarning, match=r"build_plan\(eot=...\) is deprecated") as rec:
        old = build_plan(LENS, 8, eot=flag)
    assert rec[0].filename == __file__  # the warning points at the caller
    assert same(new, old)
    assert new.add_eot is flag


def test_plan_cache_key_eot_is_a_deprecated_alias():
    new = plan_cache_key("f" * 16, 8, add_eot=True, algorithm="online", lookahead=3)
    with pytest.warns(DeprecationWarning, match=r"plan_cache_key\(eot=...\)") as rec:
        old = plan_cache_key("f" * 16, 8, eot=True, algorithm="online", lookahead=3)
    assert rec[0].filename == __file__
    # The flag keeps its recorded name, so plans cached before the rename keep their key.
    assert new == old and new["eot"] is True and "add_eot" not in new


def test_cached_plan_eot_is_a_deprecated_alias_and_warns_once(tmp_path):
    store = FakeStore(tmp_path)
    new = cached_plan(store, 8, add_eot=True)  # builds and writes the cache file
    with pytest.warns(DeprecationWarning) as rec:
        old = cached_plan(store, 8, eot=True)  # reads the same file
    assert [str(w.message) for w in rec] == [
        "cached_plan(eot=...) is deprecated; use add_eot=... (eot is a token id elsewhere)"
    ]
    assert rec[0].filename == __file__
    assert same(new, old)
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_new_name_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = build_plan(LENS, 8, add_eot=True)
        key = plan_cache_key("x", 8, add_eot=True)
        cached_plan(FakeStore(tmp_path), 8, add_eot=False)
        save_plan(plan, tmp_path / "p.mmplan", key)
        assert load_plan(tmp_path / "p.mmplan", key).add_eot is True


@pytest.mark.parametrize(
    "call",
    [
        lambda **kw: build_plan(LENS, 8, **kw),
        lambda **kw: plan_cache_key("x", 8, **kw),
        lambda **kw: cached_plan(FakeStore(Path("/nonexistent")), 8, cache=False, **kw),
    ],
)
def test_both_names_or_neither_is_a_type_error(call):
    with pytest.raises(TypeError, match="both add_eot= and its deprecated name eot="):
        call(add_eot=True, eot=True)
    with pytest.raises(TypeError, match="missing required keyword argument: 'add_eot'"):
        call()


def test_plan_eot_attribute_is_a_deprecated_alias():
    plan = build_plan(LENS, 8, add_eot=True)
    with pytest.warns(DeprecationWarning, match=r"PackingPlan.eot is deprecated") as rec:
        assert plan.eot is True
    assert rec[0].filename == __file__


def test_algorithm_stream_is_a_deprecated_alias_of_online():
    """``algorithm="stream"`` (easily confused with StreamingPacker) still builds the
    ``"online"`` plan, and says so once at the caller."""
    want = build_plan(LENS, 16, add_eot=True, algorithm="online", lookahead=4)
    with pytest.warns(DeprecationWarning, match="algorithm='stream' is deprecated"):
        got = build_plan(LENS, 16, add_eot=True, algorithm="stream", lookahead=4)
    assert same(got, want)
