"""hf_inputs: a packed batch fed to real transformers models equals one forward per document.

Tiny models built from configs with random weights (no download), in float64 (eager attention
still takes its softmax in float32, so equality holds to ~1e-7) while cross-document attention
moves the loss by far more.  The FlexAttention case compiles its kernel (about a minute on a
loaded 2-core machine) and runs in float32, the widest CPU flex accepts.  The reference runs each
document alone through the same model; the packed forward must give the same summed loss.
Run: ``pytest tests/test_hf.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from mmpack.store.writer import build
from mmpack.torch.collate import collate
from mmpack.torch.hf import hf_inputs
from mmpack.views.packed import PackedDataset

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
        total += _ce_sum(logits, batch["labels"][row : row + 1, a:b])
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
    ours, hf_loss = _packed(model, hf_inputs(batch, attn, dtype=dtype))
    assert ours == pytest.approx(reference, rel=1e-6)
    assert hf_loss == pytest.approx(
        reference, rel=1e-6
    )  # transformers computes its loss in float32  # transformers' own loss, not shifted twice
    # the naive call (tokens only) attends across documents and shifts the labels again
    with torch.no_grad():
        naive = _ce_sum(model(input_ids=batch["input_ids"]).logits, batch["labels"])
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
                labels=batch["labels"][row : row + 1, a:b],
            )
        reference += out.loss.item() * int((batch["labels"][row, a + 1 : b] != -100).sum())
    with torch.no_grad():
        out = model(**kwargs)
    n_targets = int((batch["labels"][:, 1:] != -100).sum())
    assert out.loss.item() * n_targets == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_packed_loss_equals_per_document_loss(store, attn):
    batch = _batch(store, mode="mlm", mask_id=MASK_ID, vocab_size=VOCAB, mask_prob=0.3, seed=1)
    assert int((batch["labels"] != -100).sum()) > 5
    model = _bert(attn)
    reference = _per_document(model, batch, causal=False)
    ours, hf_loss = _packed(model, hf_inputs(batch, attn, causal=False, dtype=torch.float64))
    assert ours == pytest.approx(reference, rel=1e-6)
    assert hf_loss == pytest.approx(
        reference, rel=1e-6
    )  # transformers computes its loss in float32
    with torch.no_grad():
        naive = _ce_sum(model(input_ids=batch["input_ids"]).logits, batch["labels"])
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
    with pytest.raises(ValueError, match="attn_implementation='flash'"):
        hf_inputs(batch, "flash")
    with pytest.raises(ValueError, match="label_shift='left'"):
        hf_inputs(batch, "sdpa", label_shift="left")
    with pytest.raises(ValueError, match="cu_seqlens"):
        hf_inputs({k: v for k, v in batch.items() if k != "cu_seqlens"}, "flash_attention_2")
    mask = hf_inputs(batch, "eager", dtype=torch.float64)["attention_mask"]
    assert mask.dtype == torch.float64 and mask.shape == (3, 1, SEQLEN, SEQLEN)
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float64).min}
