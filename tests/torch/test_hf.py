"""hf_inputs: a packed batch fed to real transformers models equals one forward per document.

Tiny models built from configs with random weights (no download), in float64 (eager attention
still takes its softmax in float32, so equality holds to ~1e-7) while cross-document attention
moves the loss by far more.  The FlexAttention case compiles its kernel (about a minute on a
loaded 2-core machine) and runs in float32, the widest CPU flex accepts.  The reference runs each
document alone through the same model; the packed forward must give the same summed loss.
Run: ``pytest tests/torch/test_hf.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from mmpack import PackedDataset, WindowDataset, build
from mmpack._src.torch.hf import ATTN_IMPLEMENTATIONS
from mmpack.torch import collate, hf_inputs

VOCAB, SEQLEN, MASK_ID, EOT = 97, 32, 96, 95


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 90, size=int(n)) for n in rng.integers(2, 20, size=14)]
    return build(tmp_path_factory.mktemp("hf") / "store", docs)


def _batch(store, **kw):
    ds = PackedDataset(store, SEQLEN, eot=EOT, pad_id=0, **kw)
    assert len(ds) >= 3
    return collate([ds[i] for i in range(3)])


def _segments(batch):
    """(row, start, stop) of every non-padding segment."""
    out = []
    for row, cu in enumerate(batch["cu_seqlens_rows"]):
        cu = cu.tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            if batch["attention_mask"][row, a].item() == 1:
                out.append((row, a, b))
    return out


def _ce_sum(logits, labels):
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).double(),
        labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    ).item()


def _per_document(model, batch, causal):
    total = 0.0
    for row, a, b in _segments(batch):
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"][row : row + 1, a:b]).logits
        total += _ce_sum(logits, batch["targets"][row : row + 1, a:b])
    return total


def _llama(attn, dtype=torch.float64):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def _bert(attn):
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation=attn,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config).double().eval()


def _packed(model, kwargs):
    with torch.no_grad():
        out = model(**kwargs)
    labels = kwargs.get("shift_labels", kwargs["labels"])
    n_targets = int((labels != -100).sum())
    return _ce_sum(out.logits, labels), out.loss.item() * n_targets


@pytest.mark.parametrize(
    "attn", ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]
)
def test_causal_lm_packed_loss_equals_per_document_loss(store, attn):
    batch = _batch(store)
    dtype = torch.float32 if attn == "flex_attention" else torch.float64  # CPU flex: no float64
    model = _llama(attn, dtype)
    reference = _per_document(model, batch, causal=True)
    ours, hf_loss = _packed(model, hf_inputs(batch, attn, mask_dtype=dtype))
    assert ours == pytest.approx(reference, rel=1e-6)
    assert hf_loss == pytest.approx(
        reference, rel=1e-6
    )  # transformers computes its loss in float32  # transformers' own loss, not shifted twice
    # the naive call (tokens only) attends across documents and shifts the labels again
    with torch.no_grad():
        naive = _ce_sum(model(input_ids=batch["input_ids"]).logits, batch["targets"])
    assert abs(naive - reference) > 1e-3 * abs(reference)


def test_causal_lm_hf_label_convention(store):
    batch = _batch(store, label_shift="hf")
    model = _llama("sdpa")
    kwargs = hf_inputs(batch, "sdpa", label_shift="hf")
    assert "shift_labels" not in kwargs
    reference = 0.0
    for row, a, b in _segments(batch):
        with torch.no_grad():
            out = model(
                input_ids=batch["input_ids"][row : row + 1, a:b],
                labels=batch["targets"][row : row + 1, a:b],
            )
        reference += out.loss.item() * int((batch["targets"][row, a + 1 : b] != -100).sum())
    with torch.no_grad():
        out = model(**kwargs)
    n_targets = int((batch["targets"][:, 1:] != -100).sum())
    assert out.loss.item() * n_targets == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_packed_loss_equals_per_document_loss(store, attn):
    batch = _batch(store, mode="mlm", mask_id=MASK_ID, vocab_size=VOCAB, mask_prob=0.3, seed=1)
    assert int((batch["targets"] != -100).sum()) > 5
    model = _bert(attn)
    reference = _per_document(model, batch, causal=False)
    ours, hf_loss = _packed(model, hf_inputs(batch, attn, causal=False, mask_dtype=torch.float64))
    assert ours == pytest.approx(reference, rel=1e-6)
    assert hf_loss == pytest.approx(
        reference, rel=1e-6
    )  # transformers computes its loss in float32
    with torch.no_grad():
        naive = _ce_sum(model(input_ids=batch["input_ids"]).logits, batch["targets"])
    assert abs(naive - reference) > 1e-3 * abs(reference)


def _varlen_reference_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """What flash_attn_varlen_func computes, from the kwargs transformers hands a flash kernel."""
    assert attention_mask is None and query.shape[0] == 1  # the flattened, mask-free form
    if "cu_seq_lens_q" in kwargs:
        cu = kwargs["cu_seq_lens_q"].tolist()
        assert kwargs["cu_seq_lens_k"].tolist() == cu and kwargs["max_length_q"] == max(np.diff(cu))
    else:  # one document alone (the reference run): plain causal attention
        cu = [0, query.shape[2]]
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = torch.empty_like(query)
    for a, b in zip(cu[:-1], cu[1:]):
        out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling
        )
    return out.transpose(1, 2).contiguous(), None


def test_flash_form_is_the_packed_path_transformers_detects(store):
    from transformers import AttentionInterface
    from transformers.modeling_flash_attention_utils import (
        _is_packed_sequence,
        prepare_fa_kwargs_from_position_ids,
    )

    batch = _batch(store)
    kwargs = hf_inputs(batch, "flash_attention_2")
    n_tokens = batch["input_ids"].numel()
    assert kwargs["input_ids"].shape == kwargs["position_ids"].shape == (1, n_tokens)
    assert "attention_mask" not in kwargs
    # transformers infers exactly our boundaries from the position ids alone
    assert bool(_is_packed_sequence(kwargs["position_ids"], 1))
    (cu_q, _), (max_q, _) = prepare_fa_kwargs_from_position_ids(kwargs["position_ids"])
    assert cu_q.tolist() == kwargs["cu_seq_lens_q"].tolist() == batch["cu_seqlens"].tolist()
    assert int(max_q) == kwargs["max_length_q"]
    # and a model run with a varlen kernel on those kwargs gives the per-document loss (on CPU,
    # a reference varlen attention registered in place of the flash kernel)
    AttentionInterface.register("mmpack_varlen_reference", _varlen_reference_attention)
    model = _llama("mmpack_varlen_reference")
    reference = _per_document(model, batch, causal=True)
    ours, hf_loss = _packed(model, kwargs)
    assert ours == pytest.approx(reference, rel=1e-6) and hf_loss == pytest.approx(
        reference, rel=1e-6
    )


def test_hf_inputs_validation(store):
    batch = _batch(store)
    assert "flash" not in ATTN_IMPLEMENTATIONS  # the name is flash_attention_2
    with pytest.raises(ValueError, match="attn_implementation='flash'"):
        hf_inputs(batch, "flash")
    with pytest.raises(ValueError, match="label_shift='left'"):
        hf_inputs(batch, "sdpa", label_shift="left")
    with pytest.raises(ValueError, match="cu_seqlens"):
        hf_inputs({k: v for k, v in batch.items() if k != "cu_seqlens"}, "flash_attention_2")
    renamed = {("labels" if k == "targets" else k): v for k, v in batch.items()}
    with pytest.raises(ValueError, match="'labels' but no 'targets'"):
        hf_inputs(renamed, "sdpa")
    mask = hf_inputs(batch, "eager", mask_dtype=torch.float64)["attention_mask"]
    assert mask.dtype == torch.float64 and mask.shape == (3, 1, SEQLEN, SEQLEN)
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float64).min}


# -- a collate batch is not a transformers input (issue 23 item 18) -----------------------------


def _targets_count(kwargs):
    labels = kwargs.get("shift_labels", kwargs["labels"])
    return int((labels != -100).sum())


@pytest.mark.parametrize("kind", ["packed", "packed_hf_shift", "window", "mlm"])
def test_a_collate_batch_gives_a_transformers_model_no_loss(store, kind):
    """``Trainer(train_dataset=PackedDataset, data_collator=collate)`` trained another objective
    without a word: the model shifted mmpack's shifted labels again and let the documents of a
    row attend to each other.  A transformers model takes any keyword and computes a loss only
    from ``labels``; a collate batch carries the labels as ``targets``, so ``model(**batch)``
    gives no loss (and the Trainer stops on it) where it gave a wrong one."""
    causal, shift = kind != "mlm", "hf" if kind == "packed_hf_shift" else "next"
    if kind == "window":
        window = WindowDataset(store, SEQLEN, eot=EOT, labels=True)
        batch = collate([window[i] for i in range(3)])
    elif kind == "mlm":
        batch = _batch(store, mode="mlm", mask_id=MASK_ID, vocab_size=VOCAB, seed=1)
    else:
        batch = _batch(store, label_shift=shift)
    model = _llama("sdpa") if causal else _bert("sdpa")
    assert "labels" not in batch and batch["targets"].shape == batch["input_ids"].shape
    with torch.no_grad():
        out = model(**batch)
    assert out.loss is None and out.logits.shape[:2] == batch["input_ids"].shape
    # the trap the name closes: the same batch with the labels under the model's name gives
    # another loss than the documents' (hf_inputs gives theirs; equal ones agree to ~1e-7)
    right = hf_inputs(batch, "sdpa", causal=causal, label_shift=shift)
    with torch.no_grad():
        wrong = model(**{**batch, "labels": batch["targets"]}).loss.item()
        good = model(**right).loss.item()
    assert abs(wrong - good) > 1e-5 * abs(good)


def _trainer_batches(ds, collator, model):
    """What transformers' ``Trainer`` feeds its model: a DataLoader over the dataset (its
    ``__getitems__`` batches) whose collator is wrapped in ``RemoveColumnsCollator``
    (``remove_unused_columns=True``, the default), which drops every sample key the model's
    ``forward`` does not name: a view's ``cu_seqlens`` and ``max_seqlen``."""
    import inspect

    from transformers.trainer_utils import RemoveColumnsCollator

    columns = [*inspect.signature(model.forward).parameters, "label", "label_ids", "labels"]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, collate_fn=RemoveColumnsCollator(collator, columns)
    )
    return iter(loader)


def test_the_trainer_feeding_path_keeps_the_documents_apart(store):
    """Through the Trainer's own collator wrapper: ``collate`` gives no loss, and
    ``hf_inputs(collate(samples))`` gives the per-document loss although the wrapper dropped the
    samples' ``cu_seqlens`` (collate reads the rows' documents from their position_ids)."""
    ds = PackedDataset(store, SEQLEN, eot=EOT, pad_id=0)
    model = _llama("sdpa")
    plain = next(_trainer_batches(ds, collate, model))
    with torch.no_grad():
        assert model(**plain).loss is None
    bridged = next(_trainer_batches(ds, lambda s: hf_inputs(collate(s), "sdpa"), model))
    batch = _batch(store)  # the same three samples, collated with their cu_seqlens
    assert torch.equal(plain["cu_seqlens"], batch["cu_seqlens"])
    reference = _per_document(model, batch, causal=True)
    ours, hf_loss = _packed(model, bridged)
    assert ours == pytest.approx(reference, rel=1e-6) and hf_loss == pytest.approx(
        reference, rel=1e-6
    )


def test_trainer_train_stops_on_collate_and_trains_through_hf_inputs(store, tmp_path):
    """``Trainer.train()`` itself (it needs ``accelerate``): with ``data_collator=collate`` it
    stops at the first step ("did not return a loss"); with ``hf_inputs`` its first logged loss is
    the documents' own."""

    ds = PackedDataset(store, SEQLEN, eot=EOT, pad_id=0)
    model = _llama("sdpa", torch.float32)
    first = hf_inputs(_batch(store), "sdpa")
    with torch.no_grad():
        reference = _per_document(model, _batch(store), causal=True) / _targets_count(first)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=3,
        train_sampling_strategy="sequential",
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    model.train()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, data_collator=collate)
    with pytest.raises(ValueError, match="did not return a loss.*targets"):
        trainer.train()
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=ds,
        data_collator=lambda samples: hf_inputs(collate(samples), "sdpa"),
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert losses[0] == pytest.approx(reference, rel=1e-3)
