"""megatron-core's ``GPTDataset`` order reproduced over a store, against the real megatron-core:
files built by its ``IndexedDatasetBuilder``, datasets built by its ``GPTDataset`` and its
``BlendedMegatronDatasetBuilder`` (C++ ``helpers`` included), all on CPU.  The indices are
compared array for array (values and dtypes), the samples field for field.

Run: ``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/formats/test_megatron_order.py``
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from _megatron import (
    GPTDataset,
    IndexedDataset,
    Split,
    build_megatron,
    gpt_config,
    random_docs,
    torch,
)
from _paths import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpack
from mmpack import ResumableSampler
from mmpack._src.formats import megatron_order
from mmpack._src.formats.megatron_order import split_sequences
from mmpack.errors import FormatError
from mmpack.formats import MegatronGPTDataset, build_order
from mmpack.torch import collate

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

VOCAB = 1000
EOD = VOCAB - 1
pytestmark = [
    pytest.mark.megatron,
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every derived file goes to a cache inside the test's folder, never ~/.cache."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache"))


def _corpus(tmp_path, seed, n=60, split=False, eod=False, max_len=60, min_len=0):
    rng = np.random.default_rng(seed)
    docs = [d for d in random_docs(rng, n, VOCAB - 2, max_len) if d.size >= min_len]
    if eod:
        docs = [np.append(d, EOD) for d in docs]
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return build_megatron(data / f"corpus{seed}", docs, split=split)


def _config(seqlen, tmp_path, seed, **options):
    cfg = gpt_config(seqlen, VOCAB, tmp_path / "megatron-cache")
    return dataclasses.replace(cfg, random_seed=seed, **options)


def _gpt(prefix, seqlen, tmp_path, seed, num_samples, split=Split.train, sequences=None, **options):
    ds = IndexedDataset(str(prefix))
    if sequences is None:
        sequences = np.arange(len(ds.sequence_lengths))
    cfg = _config(seqlen, tmp_path, seed, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPTDataset(ds, str(prefix), sequences, num_samples, split, cfg)


def _assert_same_indices(ours, theirs):
    for name in ("document_index", "sample_index", "shuffle_index"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def _assert_same_samples(view, gpt, limit=800):
    """Every sample, or ``limit`` of them (the first, the last and random ones) when there are
    more (the indices, compared whole, fix the rest)."""
    assert len(view) == len(gpt)
    n = len(gpt)
    indices = list(range(n))
    if n > limit:
        rng = np.random.default_rng(n)
        indices = sorted({0, n - 1, *rng.choice(n, limit - 2, replace=False).tolist()})
    batch = view.__getitems__(list(indices))
    for row, i in enumerate(indices):
        theirs, ours = gpt[i], batch[row]
        for t, o in (("tokens", "input_ids"), ("labels", "labels")):
            np.testing.assert_array_equal(theirs[t].numpy(), ours[o], err_msg=f"{t} {i}")
        for name in ("loss_mask", "position_ids"):
            np.testing.assert_array_equal(theirs[name].numpy(), ours[name], err_msg=f"{name} {i}")
        assert ours["loss_mask"].dtype == np.float32 and ours["input_ids"].dtype == np.int64


# ----------------------------------------------------------------------------- the sample index


@settings(max_examples=100)
@given(data=st.data())
def test_samples_equal_the_stream_spelled_out(tmp_path_factory, data):
    """The pieces and copy kernels against the definition: sample ``i`` is
    ``stream[j * seqlen : j * seqlen + seqlen + extra]`` padded, ``j = shuffle_index[i]``, the
    stream being the store's sequences concatenated in document index order."""
    tmp = tmp_path_factory.mktemp("stream")
    lens = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=8), label="lens")
    if sum(lens) == 0:
        return
    docs = [np.arange(100 * k, 100 * k + n) for k, n in enumerate(lens)]
    store = mmpack.build(tmp / "s", docs, fsync=False)
    seqlen = data.draw(st.integers(1, 10), label="seqlen")
    extra = data.draw(st.booleans(), label="extra")
    num_samples = data.draw(st.none() | st.integers(0, 40), label="num_samples")
    split = data.draw(st.sampled_from(["train", "valid"]), label="split")
    try:
        view = MegatronGPTDataset(
            store,
            seqlen,
            seed=data.draw(st.integers(0, 2**32 - 1), label="seed"),
            num_samples=num_samples,
            index_split=split,
            add_extra_token=extra,
            drop_last_partial_validation_sequence=data.draw(st.booleans(), label="drop"),
            pad_id=-1,
            cache=False,
        )
    except ValueError as exc:  # megatron-core refuses it too (test_megatron_refusals_are_mirrored)
        assert "megatron-core refuses" in str(exc)
        return
    order = view.order
    stream = np.concatenate([docs[s] for s in order.document_index])
    width = seqlen + int(extra)
    for i in range(len(view)):
        j = int(order.shuffle_index[i])
        want = np.full(width, -1, dtype=np.int64)
        got = stream[j * seqlen : j * seqlen + width]
        want[: got.size] = got
        labels = want[1:] if extra else np.append(want[1:], -1)
        sample = view[i]
        np.testing.assert_array_equal(sample["input_ids"], np.where(want < 0, 0, want)[:seqlen])
        np.testing.assert_array_equal(sample["labels"], np.where(labels < 0, 0, labels))
        np.testing.assert_array_equal(sample["loss_mask"], (labels >= 0).astype(np.float32))


# ----------------------------------------------------------------------------- against GPTDataset
def _per_epoch(prefix, seqlen):
    ds = IndexedDataset(str(prefix))  # kept alive: its arrays are views of a mapping it closes
    return (int(ds.sequence_lengths.sum()) - 1) // seqlen


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("seqlen", [1, 7, 32])
@pytest.mark.parametrize("seed", [0, 1234, 2**32 - 1])
@pytest.mark.parametrize("epochs", ["one", "several, last apart", "several, last shuffled in"])
def test_order_equals_gptdataset(tmp_path, split, seqlen, seed, epochs):
    prefix = _corpus(tmp_path, seed % 97 + seqlen, split=split)
    per_epoch = _per_epoch(prefix, seqlen)
    num_samples = {
        "one": per_epoch // 2,
        "several, last apart": 3 * per_epoch + per_epoch // 10,  # final epoch < 80%: apart
        "several, last shuffled in": 3 * per_epoch + per_epoch * 9 // 10,
    }[epochs]
    gpt = _gpt(prefix, seqlen, tmp_path, seed, num_samples)
    view = MegatronGPTDataset(mmpack.open(prefix), seqlen, seed=seed, num_samples=num_samples)
    assert view.order.num_epochs == (1 if epochs == "one" else 4)
    assert view.order.separate_final_epoch == (epochs == "several, last apart")
    _assert_same_indices(view.order, gpt)
    _assert_same_samples(view, gpt)


@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.parametrize("num_samples", [None, 0, 1, 333])
def test_subset_of_sequences_and_no_extra_token(tmp_path, extra, num_samples):
    prefix = _corpus(tmp_path, 3, split=True)
    chosen = np.arange(10, 70)
    gpt = _gpt(
        prefix, 9, tmp_path, 77, num_samples, sequences=chosen, add_extra_token_to_sequence=extra
    )
    view = MegatronGPTDataset(
        mmpack.open(prefix),
        9,
        seed=77,
        num_samples=num_samples,
        sequences=chosen,
        add_extra_token=extra,
    )
    _assert_same_indices(view.order, gpt)
    _assert_same_samples(view, gpt)


@pytest.mark.parametrize("reset", [(False, False, False), (True, True, True), (True, False, True)])
@pytest.mark.parametrize("pad", [None, 5])
def test_masks_positions_and_padding_equal_gptdataset(tmp_path, reset, pad):
    """Documents ending in eod, the reset options, a pad id that real tokens hold, and a kept
    partial validation sample: loss mask, positions and the attention ``GPTDataset`` builds."""
    rp, ra, em = reset
    prefix = _corpus(tmp_path, 4, eod=True)
    flags = dict(reset_position_ids=rp, reset_attention_mask=ra, eod_mask_loss=em)
    keep = dict(drop_last_partial_validation_sequence=False)
    gpt = _gpt(prefix, 13, tmp_path, 5, 100, split=Split.valid, **flags, **keep)
    if pad is not None:
        gpt.config.tokenizer.pad = pad
        gpt._pad_token_id = pad
    view = MegatronGPTDataset(
        mmpack.open(prefix),
        13,
        seed=5,
        num_samples=100,
        index_split="valid",
        pad_id=gpt._pad_token_id,
        eot=EOD,
        **flags,
        **keep,
    )
    _assert_same_indices(view.order, gpt)
    _assert_same_samples(view, gpt)
    total = view.order.num_epochs * view.order.tokens_per_epoch - 1
    assert total % 13 and len(view) == total // 13 + 1  # a partial, padded sample is served
    for i in range(len(gpt)):
        allowed = ~gpt[i]["attention_mask"][0].numpy()
        cu = view[i]["cu_seqlens"]
        segment = np.searchsorted(cu, np.arange(13), side="right")
        mine = (segment[:, None] == segment[None, :]) & np.tri(13, dtype=bool)
        np.testing.assert_array_equal(allowed, mine)


def test_native_store_with_one_sequence_per_document(tmp_path):
    """Any store: its documents are the sequences, as in the Megatron file of the same
    documents (one sequence each)."""
    rng = np.random.default_rng(8)
    docs = random_docs(rng, 50, VOCAB - 2)
    prefix = build_megatron(tmp_path / "corpus", docs)
    native = mmpack.build(tmp_path / "native", docs)
    gpt = _gpt(prefix, 11, tmp_path, 3, 400)
    view = MegatronGPTDataset(native, 11, seed=3, num_samples=400)
    _assert_same_indices(view.order, gpt)
    _assert_same_samples(view, gpt)


# ----------------------------------------------------------------------------- the builder's splits
def _builder(prefix, seqlen, tmp_path, seed, split, sizes, weights=None, **options):
    cfg = dataclasses.replace(
        _config(seqlen, tmp_path, seed, **options),
        blend=([str(prefix)], weights),
        split=split,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()


@pytest.mark.parametrize("split", ["969,30,1", "8,1,1", "2,1"])
@pytest.mark.parametrize("sentences", [False, True])
def test_splits_of_blended_megatron_dataset_builder(tmp_path, split, sentences):
    # no empty split: megatron-core loops forever drawing samples from a split without tokens
    prefix = _corpus(tmp_path, 9, n=1200, split=sentences, max_len=30, min_len=1)
    sizes = [900, 60, 7]
    built = _builder(prefix, 16, tmp_path, 42, split, sizes)
    store = mmpack.open(prefix)
    for part, gpt, size in zip(("train", "valid", "test"), built, sizes):
        if gpt is None:  # a split of weight 0: megatron-core builds none, mmpack refuses it
            with pytest.raises(ValueError, match="no weight"):
                MegatronGPTDataset(store, 16, seed=42, split=split, index_split=part)
            continue
        view = MegatronGPTDataset(
            store, 16, seed=42, num_samples=size, split=split, index_split=part
        )
        np.testing.assert_array_equal(view.sequences, gpt.indices)
        _assert_same_indices(view.order, gpt)
        _assert_same_samples(view, gpt)


def test_single_weighted_data_path_is_a_blend_over_one_dataset(tmp_path):
    """``--data-path 1.0 PREFIX``: a BlendedDataset over one GPTDataset that asked for
    ``ceil(size * 1.005)`` samples; its samples are that dataset's, in order."""
    prefix = _corpus(tmp_path, 10, n=200)
    # without a cache path (a BlendedDataset's cache needs torch.distributed initialised)
    built = _builder(
        prefix, 8, tmp_path, 1, "98,2,0", [500, 20, 0], weights=[1.0], path_to_cache=None
    )
    blended = built[0]
    view = MegatronGPTDataset(
        mmpack.open(prefix), 8, seed=1, num_samples=int(np.ceil(500 * 1.005)), split="98,2,0"
    )
    assert len(blended) == 500
    batch = view.__getitems__(list(range(500)))
    for i in range(500):
        np.testing.assert_array_equal(blended[i]["tokens"].numpy(), batch[i]["input_ids"])


def test_split_sequences_is_megatrons_rounding():
    # round(0.969 * 1000) etc. with Python's round; a weight-0 part is not built
    np.testing.assert_array_equal(split_sequences("969,30,1", "train", 1000), np.arange(969))
    np.testing.assert_array_equal(split_sequences("969,30,1", "valid", 1000), np.arange(969, 999))
    np.testing.assert_array_equal(split_sequences("969 30 1", "test", 1000), [999])
    np.testing.assert_array_equal(split_sequences("1", "train", 7), np.arange(7))
    with pytest.raises(ValueError, match="no weight"):
        split_sequences("1,0,0", "valid", 10)


# ----------------------------------------------------------------------------- continuing a run
def _megatron_batches(gpt, global_batch, steps):
    """What Megatron's pretraining sampler serves at one data-parallel rank: consecutive global
    batches of the dataset, in order."""
    loader = torch.utils.data.DataLoader(gpt, batch_size=global_batch, shuffle=False)
    out = []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        out.append(batch)
    return out


def test_continue_a_megatron_run_from_step_k(tmp_path):
    prefix = _corpus(tmp_path, 11, n=200, split=True)
    seqlen, gbs, steps, k = 16, 8, 12, 5
    gpt = _gpt(prefix, seqlen, tmp_path, 1234, gbs * steps)
    megatron = _megatron_batches(gpt, gbs, steps)  # batches 0..k-1 trained by Megatron...
    view = MegatronGPTDataset(mmpack.open(prefix), seqlen, seed=1234, num_samples=gbs * steps)
    sampler = ResumableSampler(len(view), shuffle=False)
    sampler.load_state_dict({**sampler.state_dict(), "position": k * gbs})  # consumed samples
    loader = torch.utils.data.DataLoader(view, batch_size=gbs, sampler=sampler, collate_fn=collate)
    ours = [b for _, b in zip(range(steps - k), loader)]  # ...batches k.. served by mmpack
    assert len(ours) == steps - k
    for theirs, mine in zip(megatron[k:], ours):
        torch.testing.assert_close(mine["input_ids"], theirs["tokens"])
        torch.testing.assert_close(mine["targets"], theirs["labels"])
        torch.testing.assert_close(mine["loss_mask"], theirs["loss_mask"])
        torch.testing.assert_close(mine["position_ids"], theirs["position_ids"])


@pytest.mark.parametrize("world_size", [2, 4])
def test_continue_on_several_ranks_serves_each_global_batch(tmp_path, world_size):
    prefix = _corpus(tmp_path, 12, n=150)
    seqlen, gbs, steps, k = 8, 8, 10, 3
    gpt = _gpt(prefix, seqlen, tmp_path, 9, gbs * steps)
    megatron = _megatron_batches(gpt, gbs, steps)
    view = MegatronGPTDataset(mmpack.open(prefix), seqlen, seed=9, num_samples=gbs * steps)
    state = {**ResumableSampler(len(view), shuffle=False).state_dict(), "position": k * gbs}
    per_rank = []
    for rank in range(world_size):
        sampler = ResumableSampler(len(view), shuffle=False, rank=rank, world_size=world_size)
        sampler.load_state_dict(state)
        loader = torch.utils.data.DataLoader(
            view, batch_size=gbs // world_size, sampler=sampler, collate_fn=collate
        )
        per_rank.append([b["input_ids"] for _, b in zip(range(steps - k), loader)])
    for step in range(steps - k):
        mine = torch.cat([per_rank[r][step] for r in range(world_size)])
        theirs = megatron[k + step]["tokens"]
        assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, theirs.tolist()))


# ----------------------------------------------------------------------------- cache, pickling
def test_order_is_cached_checked_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    prefix = _corpus(tmp_path, 13)
    store = mmpack.open(prefix)
    first = MegatronGPTDataset(store, 8, seed=2, num_samples=500)
    files = list(Path(store.cache_dir).glob("megatron-order-*.mmarr"))
    assert len(files) == 1
    with monkeypatch.context() as m:
        m.setattr(megatron_order, "build_order", lambda *a, **k: pytest.fail("rebuilt"))
        again = MegatronGPTDataset(mmpack.open(prefix), 8, seed=2, num_samples=500)
        thawed = pickle.loads(pickle.dumps(first))  # a DataLoader worker maps the cached file
    _assert_same_indices(again.order, first.order)
    _assert_same_indices(thawed.order, first.order)
    assert not thawed.order.shuffle_index.flags.writeable  # mapped, not pickled
    np.testing.assert_array_equal(thawed[3]["input_ids"], first[3]["input_ids"])
    other = MegatronGPTDataset(store, 8, seed=3, num_samples=500)  # another key, another file
    assert len(list(Path(store.cache_dir).glob("megatron-order-*.mmarr"))) == 2
    assert not np.array_equal(other.order.shuffle_index, first.order.shuffle_index)
    raw = bytearray(files[0].read_bytes())
    header = json.loads(raw[16 : 16 + int.from_bytes(raw[8:16], "little")])
    raw[header["arrays"]["shuffle_index"]["offset"] + 3] ^= 0xFF  # one sample moved
    files[0].write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="rebuilding the Megatron order.*checksum"):
        rebuilt = MegatronGPTDataset(mmpack.open(prefix), 8, seed=2, num_samples=500)
    _assert_same_indices(rebuilt.order, first.order)
    MegatronGPTDataset(mmpack.open(prefix), 8, seed=2, num_samples=500)  # the file was replaced
    uncached = MegatronGPTDataset(store, 8, seed=4, num_samples=500, cache=False)
    assert len(list(Path(store.cache_dir).glob("megatron-order-*.mmarr"))) == 2
    assert len(uncached) == len(first)


def test_a_changed_index_is_refused(tmp_path):
    prefix = _corpus(tmp_path, 14)
    store = mmpack.open(prefix)
    rng = np.random.default_rng(0)
    build_megatron(prefix, random_docs(rng, 60, VOCAB - 2))
    with pytest.raises(FormatError, match="changed since the store was opened"):
        MegatronGPTDataset(store, 8, seed=1)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"seqlen": 0}, ValueError, "seqlen must be >= 1"),
        ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*32\)"),
        ({"seed": 2**32}, ValueError, "seed must be in"),
        ({"seed": 1.5}, TypeError, "seed must be an integer"),
        ({"num_samples": -3}, ValueError, "num_samples must be >= 0"),
        ({"index_split": "validation"}, ValueError, "index_split must be one of"),
        ({"split": "1,0,0", "index_split": "test"}, ValueError, "no weight"),
        ({"split": "1,2,3,4"}, ValueError, "one to three non-negative weights"),
        ({"split": 969}, TypeError, "split must be a str"),
        ({"split": "1,0,0", "sequences": [0]}, ValueError, "not both"),
        ({"sequences": [0, 999]}, ValueError, r"sequences must lie in \[0, 40\)"),
        ({"sequences": [[0]]}, TypeError, "1-D integer array"),
        ({"sequences": []}, ValueError, "holds no token"),
        ({"reset_position_ids": True}, ValueError, "need eot="),
        ({"eod_mask_loss": 1}, TypeError, "eod_mask_loss must be a bool"),
        ({"add_extra_token": "yes"}, TypeError, "add_extra_token must be a bool"),
        ({"pad_id": "x"}, TypeError, "pad_id must be an integer"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, kwargs, exc, match):
    store = mmpack.open(_corpus(tmp_path, 15, n=40))
    args = {"seqlen": 8, "seed": 1, **kwargs}
    with pytest.raises(exc, match=match):
        MegatronGPTDataset(store, args.pop("seqlen"), **args)


def test_not_a_store_and_bad_indices(tmp_path):
    with pytest.raises(TypeError, match="must be a TokenStore"):
        MegatronGPTDataset(str(tmp_path), 8, seed=1)
    view = MegatronGPTDataset(mmpack.open(_corpus(tmp_path, 16)), 8, seed=1)
    with pytest.raises(IndexError, match="out of range"):
        view[len(view)]
    with pytest.raises(IndexError, match="out of range"):
        view.__getitems__([0, len(view)])
    assert view[-1]["input_ids"].shape == (8,)
    assert len(view.__getitems__([])) == 0


def test_megatron_refusals_are_mirrored():
    """A kept partial validation sample that ends on an empty sequence fails megatron-core's
    own check; build_order refuses it as well."""
    sizes = np.array([5, 0], dtype=np.int32)
    for seed in range(50):
        rng = np.random.RandomState(seed)
        order = np.array([0, 1], dtype=np.int32)
        rng.shuffle(order)
        if order[-1] == 1:
            break
    with pytest.raises(ValueError, match="megatron-core refuses"):
        build_order(
            sizes,
            np.arange(2),
            3,
            seed=seed,
            index_split="valid",
            drop_last_partial_validation_sequence=False,
        )


def test_locate_names_the_sequences_read(tmp_path):
    prefix = _corpus(tmp_path, 17, split=True)
    view = MegatronGPTDataset(mmpack.open(prefix), 10, seed=6, num_samples=200)
    ds = IndexedDataset(str(prefix))
    for i in range(0, len(view), 7):
        parts = [np.asarray(ds[p["sequence"]])[p["start"] : p["stop"]] for p in view.locate(i)]
        np.testing.assert_array_equal(np.concatenate(parts)[:10], view[i]["input_ids"])
        assert sum(p["stop"] - p["start"] for p in view.locate(i)) == 11


_BOUNDSCHECK_SCRIPT = """
import numpy as np, tempfile, mmpack
from mmpack.formats import MegatronGPTDataset
root = tempfile.mkdtemp()
checked = 0
for case, lens in enumerate([[1], [0, 3, 0], [5, 0, 0, 2], [0, 0, 7], [4] * 9]):
    docs = [np.arange(n) + 1 for n in lens]
    store = mmpack.build(f"{root}/s{case}", docs, fsync=False)
    for seqlen in (1, 2, 3, 8):
        for extra in (True, False):
            for split, drop in (("train", True), ("valid", False)):
                try:
                    view = MegatronGPTDataset(store, seqlen, seed=case, num_samples=20,
                        index_split=split, add_extra_token=extra,
                        drop_last_partial_validation_sequence=drop, cache=False)
                except ValueError:
                    continue
                view.__getitems__(np.arange(len(view)))
                checked += 1
print("checked", checked)
"""


def test_no_out_of_bounds_read_under_numba_boundscheck(tmp_path):
    env = {
        **os.environ,
        "NUMBA_BOUNDSCHECK": "1",
        "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", _BOUNDSCHECK_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(re.search(r"checked (\d+)", out.stdout).group(1)) >= 60
