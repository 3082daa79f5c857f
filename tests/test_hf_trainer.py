"""DataCollator: transformers' ``Trainer`` trains on the per-document loss, no dense mask leaves a
DataLoader worker, and ``resume_from_checkpoint`` with a ResumableSampler replays no other batch.

Tiny Llama (causal) and BERT (masked LM) models built from configs with random weights (nothing is
downloaded), in float64.  The reference runs each document alone through the same weights; a
real ``Trainer`` (learning rate 0, so every step sees those weights) must report, step by step,
the mean of the per-document losses over the same target tokens.  The flash layout runs through
a reference varlen kernel registered in place of flash-attn (not installed on CPU).
Run: ``pytest tests/test_hf_trainer.py``.
"""

from __future__ import annotations

import os
import pickle

import accelerate  # noqa: F401
import numpy as np
import pytest
import torch
import transformers
from _trainer import EOT, MASK_ID, SEQLEN, VOCAB, B, _args, _model

from mmpack import PackedDataset, ResumableSampler, build
from mmpack.torch import DataCollator, collate, hf_inputs

REFERENCE_VARLEN = "mmpack_varlen_reference"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 90, size=int(n)) for n in rng.integers(2, 20, size=30)]
    return build(tmp_path_factory.mktemp("hf-trainer") / "store", docs)


def _view(store, causal):
    if causal:
        return PackedDataset(store, SEQLEN, eot=EOT, pad_id=0)
    return PackedDataset(
        store, SEQLEN, eot=EOT, pad_id=0, mode="mlm", mask_id=MASK_ID, vocab_size=VOCAB, seed=1
    )


def _reference_varlen(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """What flash_attn_varlen_func computes, from the kwargs transformers hands a flash kernel."""
    assert attention_mask is None and query.shape[0] == 1  # the flattened, mask-free form
    cu = kw["cu_seq_lens_q"].tolist() if "cu_seq_lens_q" in kw else [0, query.shape[2]]
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = torch.empty_like(query)
    for a, b in zip(cu[:-1], cu[1:]):
        out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            is_causal=module.is_causal,
            scale=scaling,
        )
    return out.transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register(REFERENCE_VARLEN, _reference_varlen)


def _per_document_mean(model, batch):
    """Mean loss over the batch's target tokens, each document run alone."""
    total, count = 0.0, 0
    for row, cu in enumerate(batch["cu_seqlens_rows"]):
        cu = cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            labels = batch["targets"][row, a:b]
            if not (labels != -100).any():
                continue  # padding, or a document without a target
            with torch.no_grad():
                logits = model(input_ids=batch["input_ids"][row : row + 1, a:b]).logits[0]
            total += torch.nn.functional.cross_entropy(
                logits, labels, ignore_index=-100, reduction="sum"
            ).item()
            count += int((labels != -100).sum())
    return total / count


class _Record:
    """Forward hook: the loss and the ``input_ids`` of every call of the model."""

    def __init__(self, model):
        self.losses, self.inputs = [], []
        model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        self.losses.append(output.loss.item())
        self.inputs.append(kwargs["input_ids"].clone())


CASES = [
    ("llama", "eager", "eager", {}),
    ("llama", "sdpa", "sdpa", {}),
    # a model that makes a cache (Trainer's default turns it off) skips transformers' detection
    # of packed documents unless the batch says use_cache=False
    ("llama", "sdpa", "sdpa", {"use_cache": True}),
    ("llama", "flash_attention_2", REFERENCE_VARLEN, {}),
    ("bert", "eager", "eager", {}),
    ("bert", "sdpa", "sdpa", {}),
    ("bert", "flash_attention_2", REFERENCE_VARLEN, {}),
]


@pytest.mark.parametrize(
    ("kind", "layout", "attn", "options"),
    CASES,
    ids=[f"{c[0]}-{c[1]}{'-cache' if c[3] else ''}" for c in CASES],
)
def test_trainer_steps_give_the_per_document_loss(store, tmp_path, kind, layout, attn, options):
    causal = kind == "llama"
    ds = _view(store, causal)
    model = _model(causal, attn)
    collator = DataCollator(layout, causal=causal, model=model)
    steps = 3
    batches = [collate([ds[i] for i in range(s * B, (s + 1) * B)]) for s in range(steps)]
    model.eval()
    reference = [_per_document_mean(model, batch) for batch in batches]
    record = _Record(model)
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=steps, **options),
        train_dataset=ds,
        data_collator=collator,
    )
    trainer.train()
    assert record.losses == pytest.approx(reference, rel=1e-6)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged == pytest.approx(reference, rel=1e-3)
    if attn == REFERENCE_VARLEN:
        return  # the reference kernel takes only the flat form
    # the naive batch (tokens and labels only) gives another loss
    with torch.no_grad():
        model.eval()
        plain = {"input_ids": batches[0]["input_ids"], "labels": batches[0]["targets"]}
        naive = model(**plain).loss.item()
    assert abs(naive - reference[0]) > 1e-4 * abs(reference[0])


@pytest.mark.parametrize("kind", ["llama", "bert"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_model_inputs_are_those_of_hf_inputs(store, kind, attn):
    """The logits of ``model(**DataCollator(...)(samples))`` are those of
    ``model(**hf_inputs(collate(samples), ...))``, for samples with and without their
    ``cu_seqlens`` (Trainer drops it) and rows padded to a multiple."""
    causal = kind == "llama"
    ds = _view(store, causal)
    model = _model(causal, attn).eval()
    samples = [ds[i] for i in range(4)]
    for given, options in (
        (samples, {}),
        ([{k: v for k, v in s.items() if k != "cu_seqlens"} for s in samples], {}),
        (samples, {"pad_to_multiple_of": 24}),
    ):
        ours = DataCollator(attn, causal=causal, model=model, **options)(given)
        from mmpack.torch import Collator

        theirs = hf_inputs(
            Collator(**options)(given), attn, causal=causal, mask_dtype=torch.float64
        )
        assert "attention_mask" not in ours and ours["labels"].dtype == torch.int64
        with torch.no_grad():
            a, b = model(**ours), model(**theirs)
        assert torch.allclose(a.logits, b.logits, rtol=0, atol=1e-12)
        assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-12)


def _shapes(value):
    if isinstance(value, torch.Tensor):
        return [tuple(value.shape)]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _shapes(v)]
    return []


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_no_dense_mask_leaves_a_worker(store, kind):
    """Through 2 DataLoader workers the batches hold nothing larger than B * seqlen elements, no
    tensor of more than 2 dimensions and no attention mask; the mask the model gets is built in
    the main process (by transformers for the causal LM, by the collator's hook for BERT)."""
    causal = kind == "llama"
    ds = _view(store, causal)
    model = _model(causal, "sdpa").eval()
    collator = DataCollator("sdpa", causal=causal, model=model)
    seen = []

    def look(module, args, kwargs):
        seen.append((os.getpid(), kwargs.get("attention_mask")))

    if not causal:
        model.register_forward_pre_hook(look, with_kwargs=True)  # after the collator's hook
    else:  # the mask transformers builds reaches the attention layers
        model.model.layers[0].register_forward_pre_hook(look, with_kwargs=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=B, num_workers=2, collate_fn=collator)
    for batch in loader:
        assert "attention_mask" not in batch
        shapes = [s for v in batch.values() for s in _shapes(v)]
        assert all(len(s) <= 2 for s in shapes), shapes
        assert max(int(np.prod(s)) for s in shapes) <= B * SEQLEN
        with torch.no_grad():
            model(**batch)
    assert seen and all(pid == os.getpid() for pid, _ in seen)
    masks = [mask for _, mask in seen]
    assert all(m.dtype == torch.bool and m.shape[-2:] == (SEQLEN, SEQLEN) for m in masks)


def test_encoder_collator_needs_its_model_and_matching_implementation(store):
    with pytest.raises(ValueError, match="needs model="):
        DataCollator("sdpa", causal=False)
    with pytest.raises(ValueError, match="runs attn_implementation='eager'"):
        DataCollator("sdpa", model=_model(True, "eager"))
    with pytest.raises(ValueError, match="attn_implementation='flash'"):
        DataCollator("flash")
    DataCollator("flash_attention_2", causal=False)  # varlen boundaries: no hook needed
    bert = _model(False, "sdpa")
    collator = DataCollator("sdpa", causal=False, model=bert)
    assert pickle.loads(pickle.dumps(collator)).causal is False  # holds no model: spawn workers
    batch = collator([_view(store, False)[0]])
    with pytest.raises(ValueError, match="needs its .* 'input_ids'"):
        bert(
            inputs_embeds=torch.zeros(1, SEQLEN, 32, dtype=torch.float64),
            **batch | {"input_ids": None},
        )


def test_causal_lm_with_labels_in_the_hf_convention(store):
    """``label_shift="hf"`` views: labels pass unshifted, the model shifts them (hf_inputs')."""
    ds = PackedDataset(store, SEQLEN, eot=EOT, pad_id=0, label_shift="hf")
    model = _model(True, "sdpa").eval()
    samples = [ds[i] for i in range(B)]
    ours = DataCollator("sdpa", label_shift="hf")(samples)
    assert "shift_labels" not in ours
    with torch.no_grad():
        a = model(**ours).loss.item()
        b = model(**hf_inputs(collate(samples), "sdpa", label_shift="hf")).loss.item()
    assert a == pytest.approx(b, rel=1e-12)


def test_causal_positions_must_restart_at_the_boundaries(store):
    """transformers reads a causal LM's documents from restarting positions: a sample whose
    positions run on across a boundary would be one document to it, so it is refused."""
    ds = _view(store, True)
    sample = dict(ds[0])
    assert len(sample["cu_seqlens"]) > 2
    sample["position_ids"] = np.arange(SEQLEN)
    with pytest.raises(ValueError, match="row 0 .* do not restart exactly at its cu_seqlens"):
        DataCollator("sdpa")([sample])


def test_collate_as_data_collator_stops_at_the_first_step(store, tmp_path):
    """The obvious wrong path, ``data_collator=collate``, trains nothing: the labels are under
    ``targets``, the model returns no loss and Trainer stops, naming the batch's keys."""
    ds = _view(store, True)
    trainer = transformers.Trainer(
        model=_model(True, "sdpa"),
        args=_args(tmp_path, max_steps=2),
        train_dataset=ds,
        data_collator=collate,
    )
    with pytest.raises(ValueError, match="did not return a loss.*targets"):
        trainer.train()


# -- Trainer with ResumableSampler: kill and resume_from_checkpoint -----------------------------


class ResumableTrainer(transformers.Trainer):
    """The recipe of docs/guide/torch.md: the training order of a ResumableSampler."""

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return ResumableSampler(len(dataset), seed=self.args.seed)


class _StopAt(transformers.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def _resumable_run(store, tmp_path, max_steps, stop_at=None, resume=None, workers=0):
    ds = _view(store, True)
    model = _model(True, "sdpa")
    record = _Record(model)
    args = _args(
        tmp_path,
        max_steps=max_steps,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=stop_at or max_steps,
        dataloader_num_workers=workers,
        train_sampling_strategy="random",
    )
    trainer = ResumableTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        data_collator=DataCollator("sdpa"),
        callbacks=[] if stop_at is None else [_StopAt(stop_at)],
    )
    trainer.train(resume_from_checkpoint=resume)
    return record


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_resume_from_checkpoint_gives_the_same_batches(store, tmp_path, workers):
    """Stopped after k steps (a checkpoint saved there) and resumed from it, the run sees the
    batches and losses of an uninterrupted run, across an epoch boundary (set_epoch reshuffles)."""
    steps_per_epoch = len(_view(store, True)) // B + bool(len(_view(store, True)) % B)
    total = steps_per_epoch + 3
    whole = _resumable_run(store, tmp_path / "whole", total, workers=workers)
    assert len(whole.inputs) == total
    first = _resumable_run(store, tmp_path / "cut", total, stop_at=steps_per_epoch - 1)
    rest = _resumable_run(
        store,
        tmp_path / "cut",
        total,
        resume=str(tmp_path / "cut" / f"checkpoint-{steps_per_epoch - 1}"),
        workers=workers,
    )
    assert len(first.inputs) == steps_per_epoch - 1 and len(rest.inputs) == 4
    for a, b in zip(whole.inputs, first.inputs + rest.inputs):
        assert torch.equal(a, b)
    assert whole.losses == pytest.approx(first.losses + rest.losses, rel=1e-9)
    # the order is the sampler's: shuffled, another one in epoch 1
    sampler = ResumableSampler(len(_view(store, True)), seed=42)
    ds = _view(store, True)
    expected = collate([ds[int(i)] for i in list(sampler)[:B]])["input_ids"]
    assert torch.equal(whole.inputs[0], expected)
    assert not torch.equal(whole.inputs[0], whole.inputs[steps_per_epoch])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_flex_attention_inputs_are_those_of_hf_inputs(store, kind):
    """FlexAttention (compiled on CPU, float32): transformers' own BlockMask for the causal LM,
    the hook's for BERT, give hf_inputs' logits."""
    causal = kind == "llama"
    ds = _view(store, causal)
    model = _model(causal, "flex_attention").float().eval()
    samples = [ds[i] for i in range(B)]
    ours = DataCollator("flex_attention", causal=causal, model=model)(samples)
    theirs = hf_inputs(collate(samples), "flex_attention", causal=causal)
    with torch.no_grad():
        a, b = model(**ours), model(**theirs)
    assert torch.allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
