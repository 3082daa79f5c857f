"""The options of packed rows: one object, one check, for both packers.

``PackedDataset`` and ``StreamingPacker`` check the options they share through
``check_row_options``: their configurations are ``RowOptions``, the same bad value gets the
same error from both, and the MLM ids are excluded by the same rule."""

from __future__ import annotations

import numpy as np
import pytest

import mmpack
from mmpack import StreamingPacker
from mmpack._src.packing.options import RowOptions, check_row_options

GOOD = {
    "seqlen": 16,
    "eot": 2,
    "pad_id": 0,
    "mode": "mlm",
    "label_shift": "next",
    "mask_prob": 0.3,
    "mask_id": 3,
    "vocab_size": 64,
    "special_ids": (1,),
    "long_docs": "split",
    "seed": 7,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    docs = [np.arange(4, 4 + n, dtype=np.uint16) for n in (3, 9, 5, 20)]
    return mmpack.build(tmp_path_factory.mktemp("s") / "s", docs, fsync=False)


def _view(store, **kw):
    args = GOOD | kw
    seqlen = args.pop("seqlen")
    return mmpack.PackedDataset(store, seqlen, cache=False, check_vocab=False, **args)


def _packer(store, **kw):
    return StreamingPacker(store, batch_size=2, buffer_size=4, **(GOOD | kw))


def test_both_drivers_hold_one_row_options(store):
    view, packer = _view(store), _packer(store)
    assert isinstance(packer.config, RowOptions)
    want = check_row_options(**GOOD, ignore_index=-100)
    for name in ("seqlen", "eot", "pad_id", "mode", "label_shift", "ignore_index", "mask_prob"):
        assert getattr(view, name) == getattr(packer.config, name) == getattr(want, name)
    # the ids MLM never draws: special ids, eot, mask_id and pad_id, by one rule
    np.testing.assert_array_equal(view.excluded, [0, 1, 2, 3])
    np.testing.assert_array_equal(packer.config.excluded, view.excluded)
    np.testing.assert_array_equal(want.excluded, view.excluded)


@pytest.mark.parametrize(
    "bad, exc, message",
    [
        ({"seqlen": 0}, ValueError, "seqlen must be in [1, 2147483647), got 0"),
        ({"seqlen": 2**31}, ValueError, "seqlen must be in [1, 2147483647), got 2147483648"),
        ({"seqlen": 2.5}, TypeError, "seqlen"),
        ({"eot": -1}, ValueError, "eot must be a token id >= 0"),
        ({"pad_id": "x"}, TypeError, "pad_id"),
        ({"mode": "bert"}, ValueError, "mode"),
        ({"label_shift": "prev"}, ValueError, "label_shift"),
        ({"mask_prob": 1.5}, ValueError, "mask_prob must be in [0, 1]"),
        ({"mask_id": None}, ValueError, "mode='mlm' needs mask_id and vocab_size"),
        ({"mask_id": 64}, ValueError, "mask_id=64 must be in [0, vocab_size=64)"),
        ({"vocab_size": 4}, ValueError, "vocab_size=4 leaves no id for random replacement"),
        ({"long_docs": "fold"}, ValueError, "long_docs"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_a_bad_option_gets_the_same_error_from_both_drivers(store, bad, exc, message):
    for make in (_view, _packer):
        with pytest.raises(exc) as info:
            make(store, **bad)
        assert message in str(info.value), (make.__name__, str(info.value))


def test_no_labels_only_where_the_driver_allows_them(store):
    assert _packer(store, mode=None).config.mode is None
    with pytest.raises(ValueError, match="mode must be one of"):
        _view(store, mode=None)


def test_the_streaming_packer_writes_either_label_shift(store):
    """``label_shift="hf"``: targets are the ids, the ignore label at each piece's first token
    and on padding (the packed view's rule)."""
    for shift in ("next", "hf"):
        batch = next(iter(_packer(store, mode="causal", label_shift=shift, drop_last=False)))
        ids, labels, cu = batch["input_ids"], batch["targets"], batch["cu_seqlens"]
        for r in range(ids.shape[0]):
            bounds = np.asarray(cu[r]).tolist()
            used = int(batch["attention_mask"][r].sum())
            for a, b in zip(bounds[:-1], bounds[1:]):
                if a >= used:
                    assert (labels[r, a:b] == -100).all()
                elif shift == "hf":
                    assert labels[r, a] == -100
                    np.testing.assert_array_equal(labels[r, a + 1 : b], ids[r, a + 1 : b])
                else:
                    np.testing.assert_array_equal(labels[r, a : b - 1], ids[r, a + 1 : b])
                    assert labels[r, b - 1] == -100


def test_the_labeller_reads_its_options_and_copies_none():
    """The streaming packer's labeller holds its RowOptions and nothing copied out of them:
    the mode and ``ignore_index`` it labels with are its options' own."""
    import dataclasses

    from mmpack._src.kernels.packed_rows import LABELS_NEXT, LABELS_NONE
    from mmpack._src.streaming.labels import Labeller

    options = check_row_options(**GOOD, ignore_index=-100)
    labeller = Labeller(options, None)
    assert set(vars(labeller)) == {"options", "cooldown"}
    assert labeller.label_mode == LABELS_NONE  # MLM: the row writer writes no labels
    labeller.options = dataclasses.replace(options, ignore_index=-7)
    ids = np.arange(10, 26, dtype=np.int64).reshape(1, 16)
    attention = np.ones((1, 16), dtype=np.int64)
    lengths, row_ptr = np.array([16], dtype=np.int64), np.array([0, 1], dtype=np.int64)
    labels, _ = labeller(ids, attention, np.zeros_like(ids), lengths, row_ptr, 0, 0, 0)
    assert labels is not None and set(np.unique(labels)) - set(range(10, 26)) == {-7}
    labeller.options = dataclasses.replace(options, mode="causal")
    assert labeller.label_mode == LABELS_NEXT
    written = np.zeros_like(ids)
    assert labeller(ids, attention, written, lengths, row_ptr, 0, 0, 0)[0] is written


def test_a_packed_view_reads_its_plan_parameters_from_its_one_spec(store):
    """A PackedDataset's plan parameters are its PlanSpec's, not copies beside it; the spec
    survives pickling, and a bad one is refused by the spec's own check."""
    import pickle

    from mmpack.packing import PlanSpec

    ds = _view(store, algorithm="online", lookahead=5, region_tokens="auto")
    want = PlanSpec(16, add_eot=True, algorithm="online", lookahead=5, region_tokens="auto")
    assert ds.plan_spec == want
    assert (ds.algorithm, ds.lookahead, ds.region_tokens) == ("online", 5, 8192 * 16)
    assert not {"algorithm", "lookahead", "region_tokens"} & set(vars(ds))
    assert pickle.loads(pickle.dumps(ds)).plan_spec == want
    with pytest.raises(ValueError, match="lookahead must be >= 1"):
        _view(store, lookahead=0)


def test_delegated_attributes_are_documented():
    """Every attribute a driver reads from its options object (``Delegated``) has a docstring:
    its own ``__doc__`` at run time, and in the API reference, where the griffe extension
    ``docs/_hooks/delegated.py`` reads it from the source (before, they showed none)."""
    import ast
    import importlib.util
    from pathlib import Path

    from _paths import ROOT

    from mmpack._src.packing.options import Delegated

    spec = importlib.util.spec_from_file_location("delegated", ROOT / "docs/_hooks/delegated.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    for cls in (mmpack.PackedDataset, StreamingPacker):
        attrs = {k: v for k, v in vars(cls).items() if isinstance(v, Delegated)}
        assert attrs, cls
        for name, attr in attrs.items():
            assert attr.__doc__ and attr.__doc__ != Delegated.__doc__, (cls.__name__, name)
        source = Path(__import__(cls.__module__, fromlist=["_"]).__file__).read_text()
        static = {
            node.targets[0].id: hook.delegated_doc(node)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assign) and "Delegated(" in ast.unparse(node.value)
        }
        assert static == {name: attr.__doc__ for name, attr in attrs.items()}, cls.__name__
