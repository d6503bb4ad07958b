"""ModernBERT: bertkit's model computes what transformers' ModernBert* classes compute on the same weights (hidden
states, MLM logits, classification logits within 1e-5), on padded batches longer than the local window, and model
directories go both ways with no missing or unexpected tensors; its config reads and writes transformers'
config.json, refusing what bertkit does not build; the unpadded path is pinned to the padded one."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertkit.models.layouts as layouts
from bertkit.checkpoint import CheckpointError
from bertkit.config import ModernBertConfig
from bertkit.models import (IGNORE_INDEX, BertModel, ModernBertForMaskedLM, ModernBertForMultipleChoice,
                            ModernBertForQuestionAnswering, ModernBertForSequenceClassification,
                            ModernBertForTokenClassification, ModernBertModel)
from test_family import family_config

transformers = pytest.importorskip("transformers")
ATOL = 1e-5

# 3 layers, global every 2 (layers 0 and 2 global, 1 local), a window of 8 (+-4 tokens) on rows of up to 27.
TINY = dict(vocab_size=100, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
            global_attn_every_n_layers=2, local_attention=8, max_position_embeddings=64, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_rope_theta=1000.0,
            local_rope_theta=50.0)
BIASES = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)


def tiny(**overrides) -> ModernBertConfig:
    return ModernBertConfig(**{**TINY, **overrides})


def theirs_config(config: ModernBertConfig, attn: str = "sdpa", **extra):
    """transformers' config from ours: our to_dict is what its constructor takes."""
    return transformers.ModernBertConfig(**config.to_dict(), attn_implementation=attn, **extra)


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (norms and biases too), so parity cannot hide behind ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 and p.shape[0] <= 64 else 0.0))
    return model.eval()


def batch(config: ModernBertConfig, B: int = 4, T: int = 27, seed: int = 0):
    """Ids padded as a tokenizer pads (right; one row left), rows longer than the window; MLM labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 21:] = 0
    mask[2, 12:] = 0
    mask[3, :5] = 0  # left padding: positions keep their place in the row, as in transformers
    ids[mask == 0] = config.pad_token_id
    labels = torch.full((B, T), IGNORE_INDEX)
    labels[:, 6] = ids[:, 6]
    labels[0, 20] = 7
    return ids, mask, labels


def close(a, b, mask=None):
    """a == b within ATOL; with a (B, T) mask, at real positions only (padding rows are computed by nobody)."""
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def no_loading_problems(info):
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def both_layouts(model: torch.nn.Module):
    """Yield the model twice: on the unpadded path (the default), then on the padded one."""
    encoder = model if isinstance(model, ModernBertModel) else model.encoder
    for unpad in (True, False):
        encoder.unpad = unpad
        yield model
    encoder.unpad = True


# ==================================================================================================================
# Config
# ==================================================================================================================
def test_config_round_trips_through_transformers(tmp_path):
    config = tiny(**BIASES, classifier_pooling="mean", hidden_activation="gelu_pytorch_tanh")
    config.to_json_file(tmp_path / "config.json", architectures=["ModernBertModel"])
    theirs = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert theirs.model_type == "modernbert"
    assert theirs.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert theirs.rope_parameters["full_attention"]["rope_theta"] == 1000.0
    assert theirs.rope_parameters["sliding_attention"]["rope_theta"] == 50.0
    assert theirs.sliding_window == config.sliding_window == 4
    assert (theirs.norm_bias, theirs.classifier_pooling, theirs.hidden_activation) == (True, "mean",
                                                                                         "gelu_pytorch_tanh")
    theirs.save_pretrained(str(tmp_path / "again"))
    assert ModernBertConfig.from_json_file(tmp_path / "again" / "config.json") == config


def test_config_reads_the_released_spelling():
    """The configs published with ModernBERT carry the attention pattern and rotary bases as plain numbers, plus
    keys that change nothing (layer_norm_eps, reference_compile, ...)."""
    released = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 100,
                "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4,
                "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
                "local_attention": 128, "pad_token_id": 0, "layer_norm_eps": 1e-5, "reference_compile": True,
                "repad_logits_with_grad": False, "position_embedding_type": "absolute", "torch_dtype": "float32",
                "sparse_prediction": False, "deterministic_flash_attn": False, "gradient_checkpointing": False}
    config = ModernBertConfig.from_dict(released)
    assert (config.global_attn_every_n_layers, config.global_rope_theta, config.local_rope_theta) == (3, 160000.0,
                                                                                                      10000.0)
    assert [config.is_global(i) for i in range(4)] == [True, False, False, True]
    theirs = transformers.ModernBertConfig(**{k: v for k, v in released.items() if k != "model_type"})
    assert theirs.layer_types == config.layer_types


@pytest.mark.parametrize("key, value, named", [
    ("flash_kernel_size", 3, "flash_kernel_size"),
    ("hidden_activation", "geglu_fancy", "hidden_activation"),
    ("classifier_activation", "mish", "classifier_activation"),
    ("classifier_pooling", "max", "classifier_pooling"),
    ("tie_word_embeddings", False, "tie_word_embeddings"),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling"),
    ("rope_parameters", {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0}},
     "rope_parameters.full_attention"),
    ("layer_types", ["sliding_attention", "full_attention", "full_attention"], "layer_types"),
    ("num_attention_heads", 3, "num_attention_heads"),
])
def test_config_refuses_what_bertkit_does_not_build_naming_the_key(key, value, named):
    data = {**tiny().to_dict(), key: value}
    with pytest.raises(ValueError, match=named):
        ModernBertConfig.from_dict(data, source="dir/config.json")


def test_layer_types_give_the_every_n_pattern_and_win_over_the_number():
    data = tiny(num_hidden_layers=5).to_dict()
    data["layer_types"] = ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                           "sliding_attention"]
    data["rope_parameters"]["sliding_attention"]["rope_theta"] = 77.0
    config = ModernBertConfig.from_dict(data)  # current transformers reads layer_types and rope_parameters first
    assert config.global_attn_every_n_layers == 3 and config.local_rope_theta == 77.0


# ==================================================================================================================
# transformers -> bertkit
# ==================================================================================================================
@pytest.mark.parametrize("attn, overrides", [("sdpa", {}), ("eager", BIASES),
                                             ("sdpa", dict(global_attn_every_n_layers=3, num_hidden_layers=4,
                                                           hidden_activation="silu", decoder_bias=False))])
def test_transformers_mlm_directory_loads_in_bertkit(attn, overrides, tmp_path):
    config = tiny(**overrides)
    theirs = randomize(transformers.ModernBertForMaskedLM(theirs_config(config, attn)), 1)
    theirs.save_pretrained(str(tmp_path))
    ours = ModernBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert ours.config == config
    ids, mask, labels = batch(config)
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        for model in both_layouts(ours):
            a = model(ids, mask, labels=labels, output_hidden_states=True)
            assert len(a.hidden_states) == len(b.hidden_states) == config.num_hidden_layers + 1
            for x, y in zip(a.hidden_states, b.hidden_states):
                close(x, y, mask)
            close(a.prediction_logits, b.logits, mask)
            close(a.loss, b.loss)
        # Without padding and without a mask, every position counts.
        close(ours(ids[:1]).prediction_logits, theirs(input_ids=ids[:1]).logits)


def test_transformers_bare_encoder_loads_in_bertkit(tmp_path):
    config = tiny(**BIASES)
    theirs = randomize(transformers.ModernBertModel(theirs_config(config, "eager")), 2)
    theirs.save_pretrained(str(tmp_path))
    ours = ModernBertModel.from_pretrained(tmp_path).eval()
    ids, mask, _ = batch(config)
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        for model in both_layouts(ours):
            out = model(ids, mask)
            assert out.pooler_output is None
            close(out.last_hidden_state, b, mask)
    # A bare encoder directory also gives the MLM model's encoder, with a fresh head only when asked.
    with pytest.raises(CheckpointError, match="holds no mlm heads"):
        ModernBertForMaskedLM.from_pretrained(tmp_path)
    mlm = ModernBertForMaskedLM.from_pretrained(tmp_path, new_heads=True).eval()
    with torch.no_grad():
        close(mlm.encoder(ids, mask).last_hidden_state, b, mask)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_transformers_sequence_classifier_loads_in_bertkit(pooling, tmp_path):
    config = tiny(classifier_pooling=pooling, **BIASES)
    labels = ["neg", "neutral", "pos"]
    theirs = transformers.ModernBertForSequenceClassification(theirs_config(
        config, id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}))
    randomize(theirs, 3).save_pretrained(str(tmp_path))
    ours = ModernBertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert ours.labels == labels and ours.num_labels == 3
    ids, mask, _ = batch(config)
    target = torch.tensor([0, 2, 1, 1])
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, labels=target)
        for model in both_layouts(ours):
            a = model(ids, mask, labels=target)
            if pooling == "cls":  # a left-padded row pools a padding position in transformers: not compared
                close(a.logits[:3], b.logits[:3])
            else:
                close(a.logits, b.logits)
                close(a.loss, b.loss)


def test_transformers_token_classifier_loads_in_bertkit(tmp_path):
    config = tiny()
    theirs = randomize(transformers.ModernBertForTokenClassification(theirs_config(config, "eager", num_labels=5)), 4)
    theirs.save_pretrained(str(tmp_path))
    ours = ModernBertForTokenClassification.from_pretrained(tmp_path).eval()
    ids, mask, _ = batch(config)
    tags = torch.randint(0, 5, ids.shape).masked_fill(mask == 0, IGNORE_INDEX)
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, labels=tags)
        for model in both_layouts(ours):
            a = model(ids, mask, labels=tags)
            assert a.logits.shape == (4, 27, 5)
            close(a.logits, b.logits, mask)
            close(a.loss, b.loss)


# ==================================================================================================================
# bertkit -> transformers
# ==================================================================================================================
@pytest.mark.parametrize("ours_cls, kwargs", [
    (ModernBertModel, {}),
    (ModernBertForMaskedLM, {}),
    (ModernBertForSequenceClassification, {"num_labels": 3, "labels": ["a", "b", "c"]}),
    (ModernBertForSequenceClassification, {"num_labels": 1}),
    (ModernBertForTokenClassification, {"num_labels": 4}),
    (ModernBertForQuestionAnswering, {}),
])
def test_bertkit_directory_loads_in_transformers(ours_cls, kwargs, tmp_path):
    config = tiny(**BIASES, classifier_pooling="mean") if kwargs.get("num_labels") == 1 else tiny()
    ours = randomize(ours_cls(config, **kwargs), 5)
    ours.save_pretrained(tmp_path)
    name = ours_cls.__name__
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == [name] and raw["model_type"] == "modernbert"
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert "model.layers.0.attn_norm.weight" not in stored and "decoder.weight" not in stored
    theirs, info = getattr(transformers, name).from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    theirs.eval()
    ids, mask, _ = batch(config)
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    if ours_cls is ModernBertModel:
        close(a.last_hidden_state, b.last_hidden_state, mask)
    elif ours_cls is ModernBertForMaskedLM:
        close(a.prediction_logits, b.logits, mask)
    elif ours_cls is ModernBertForTokenClassification:
        close(a.logits, b.logits, mask)
    elif ours_cls is ModernBertForQuestionAnswering:
        close(a.logits, torch.stack([b.start_logits, b.end_logits], -1), mask)
    else:  # a left-padded row (the last) pools a padding position in transformers with "cls": not compared
        close(a.logits, b.logits) if config.classifier_pooling == "mean" else close(a.logits[:3], b.logits[:3])
        assert theirs.config.problem_type == ("regression" if kwargs["num_labels"] == 1 else None)
    # And back: the directory transformers writes from it is ours again, tensor for tensor.
    theirs.save_pretrained(str(tmp_path / "again"))
    again = ours_cls.from_pretrained(tmp_path / "again")
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_multiple_choice_both_ways_with_transformers(pooling, tmp_path):
    """ModernBertForMultipleChoice: transformers' directory in bertkit and bertkit's in transformers, equal choice
    scores (1e-5) on (B, C, T) inputs whose choices are padded, one on the left (transformers pools each choice's
    first real token)."""
    config = tiny(classifier_pooling=pooling, **BIASES)
    theirs = randomize(transformers.ModernBertForMultipleChoice(theirs_config(config)), 12)
    theirs.save_pretrained(str(tmp_path / "theirs"))
    ours = ModernBertForMultipleChoice.from_pretrained(tmp_path / "theirs").eval()
    ids, mask, _ = batch(config, B=6)
    ids, mask = ids.view(2, 3, -1), mask.view(2, 3, -1)  # 2 questions of 3 choices
    ids[1, 2] = ids[1, 2].masked_fill(mask[1, 2] == 0, config.pad_token_id)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels)
        for model in both_layouts(ours):
            a = model(ids, mask, labels=labels)
            assert a.logits.shape == (2, 3)
            close(a.logits, b.logits)
            close(a.loss, b.loss)
    ours.save_pretrained(tmp_path / "ours")
    back, info = transformers.ModernBertForMultipleChoice.from_pretrained(str(tmp_path / "ours"),
                                                                          output_loading_info=True)
    no_loading_problems(info)
    with torch.no_grad():
        close(back.eval()(input_ids=ids, attention_mask=mask).logits, b.logits)


def test_transformers_question_answering_directory_loads_in_bertkit(tmp_path):
    config = tiny(**BIASES)
    theirs = randomize(transformers.ModernBertForQuestionAnswering(theirs_config(config)), 13)
    theirs.save_pretrained(str(tmp_path))
    ours = ModernBertForQuestionAnswering.from_pretrained(tmp_path).eval()
    ids, mask, _ = batch(config)
    start, end = torch.tensor([3, 0, 5, 9]), torch.tensor([4, 0, 7, 12])
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, start_positions=start, end_positions=end)
        for model in both_layouts(ours):
            a = model(ids, mask, start_positions=start, end_positions=end)
            close(a.start_logits, b.start_logits, mask)
            close(a.end_logits, b.end_logits, mask)
    # The QA head starts fresh on an MLM directory and reuses its prediction head, as transformers does.
    randomize(ModernBertForMaskedLM(config), 14).save_pretrained(tmp_path / "mlm")
    qa = ModernBertForQuestionAnswering.from_pretrained(tmp_path / "mlm")
    their_qa = transformers.ModernBertForQuestionAnswering.from_pretrained(str(tmp_path / "mlm"))
    assert torch.equal(qa.head.dense.weight, their_qa.head.dense.weight) and qa.classifier.weight.shape == (2, 32)


# ==================================================================================================================
# Loading rules
# ==================================================================================================================
def test_classifier_on_an_mlm_directory_reuses_its_head_as_transformers_does(tmp_path):
    config = tiny(**BIASES)
    randomize(ModernBertForMaskedLM(config), 6).save_pretrained(tmp_path)
    ours = ModernBertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    theirs = transformers.ModernBertForSequenceClassification.from_pretrained(str(tmp_path), num_labels=3)
    mlm = ModernBertForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(ours.head.dense.weight, mlm.mlm.dense.weight)
    assert torch.equal(ours.head.norm.bias, theirs.head.norm.bias)
    assert torch.equal(ours.head.dense.weight, theirs.head.dense.weight)
    assert ours.classifier.weight.shape == (3, 32)  # the classifier itself starts fresh
    tokens = ModernBertForTokenClassification.from_pretrained(tmp_path, num_labels=2)
    assert torch.equal(tokens.head.dense.bias, mlm.mlm.dense.bias)


def test_loading_is_strict_and_names_the_unknown_tensor(tmp_path):
    config = tiny()
    ModernBertForMaskedLM(config).save_pretrained(tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    stored["model.layers.1.attn.Wk.weight"] = torch.zeros(32, 32)
    save_file(stored, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.attn\.Wk\.weight"):
        ModernBertForMaskedLM.from_pretrained(tmp_path)


def test_layer_zero_has_no_attention_norm_and_a_stray_one_is_refused(tmp_path):
    config = tiny()
    model = ModernBertModel(config)
    assert isinstance(model.layers[0].attn_norm, torch.nn.Identity)
    assert isinstance(model.layers[1].attn_norm, torch.nn.LayerNorm) and model.layers[1].attn_norm.bias is None
    model.save_pretrained(tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    stored["layers.0.attn_norm.weight"] = torch.ones(32)
    save_file(stored, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected \['layers\.0\.attn_norm\.weight'\]"):
        ModernBertModel.from_pretrained(tmp_path)


def test_bert_and_modernbert_directories_are_not_confused(tmp_path):
    ModernBertModel(tiny()).save_pretrained(tmp_path / "modern")
    BertModel(family_config("bert")).save_pretrained(tmp_path / "bert")
    with pytest.raises(CheckpointError, match="holds a ModernBERT model .* BertModel cannot load"):
        BertModel.from_pretrained(tmp_path / "modern")
    with pytest.raises(CheckpointError, match="holds a BERT model .* ModernBertModel cannot load"):
        ModernBertModel.from_pretrained(tmp_path / "bert")


def test_a_config_json_the_weights_do_not_fit_is_named(tmp_path):
    ModernBertModel(tiny()).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["intermediate_size"] = 16
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"'layers\.0\.mlp\.Wi\.weight' has shape \(48, 32\)"):
        ModernBertModel.from_pretrained(tmp_path)


# ==================================================================================================================
# The model itself
# ==================================================================================================================
def test_unpadded_path_matches_padded_path_forward_and_backward():
    """Forward and gradients within 1e-5, on padding of every kind (right, left, an all-padding row, a hole)."""
    config = tiny(**BIASES)
    model = randomize(ModernBertForMaskedLM(config), 7).train()  # dropout is 0 in the config: deterministic
    ids, mask, labels = batch(config, B=5)
    mask[4] = 0
    mask[0, 10:13] = 0  # a hole: the window counts positions in the row, on both paths
    labels[mask == 0] = IGNORE_INDEX
    results = []
    for m in both_layouts(model):
        m.zero_grad()
        out = m(ids, mask, labels=labels, output_hidden_states=True)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = results
    close(a.prediction_logits, b.prediction_logits, mask)
    for x, y in zip(a.hidden_states, b.hidden_states):
        close(x, y, mask)
    close(a.loss, b.loss)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(model.parameters()))
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=ATOL, rtol=1e-4, msg=name)


def test_varlen_kernel_takes_global_and_windowed_layers(monkeypatch):
    """On a GPU the unpadded layers run a varlen FlashAttention kernel: global layers with no window, local layers
    with window_size (w, w) for local_attention 2w; a row with a hole keeps the SDPA path (the kernel's window
    counts places in the sequence, not positions in the row). A reference kernel with PyTorch's varlen_attn
    signature stands in for it; outputs equal the padded path's."""
    import bertkit.models.modernbert as modernbert
    from test_fastpaths import torch_varlen_reference

    config = tiny(**BIASES)
    model = randomize(ModernBertModel(config), 8).eval()
    ids, mask, _ = batch(config, B=4)
    calls = []
    monkeypatch.setattr(layouts, "flash_attn_varlen", None)
    monkeypatch.setattr(layouts, "torch_varlen", torch_varlen_reference(calls))
    monkeypatch.setattr(layouts, "use_flash_attn", lambda q: True)
    monkeypatch.setattr(modernbert, "varlen_kernel_available", lambda t: True)
    with torch.no_grad():
        model.unpad = False
        expected = model(ids, mask).last_hidden_state
        model.unpad = True
        got = model(ids, mask).last_hidden_state
        assert [c[3] for c in calls] == [(-1, -1), (4, 4), (-1, -1)]  # layers 0 and 2 global, 1 local (8 // 2)
        close(got, expected, mask)
        calls.clear()
        mask[0, 3:5] = 0  # a hole
        model.unpad = False
        expected = model(ids, mask).last_hidden_state
        model.unpad = True
        got = model(ids, mask).last_hidden_state
    assert [c[3] for c in calls] == [(-1, -1), (-1, -1)]  # the global layers only; the local layer ran SDPA
    close(got, expected, mask)


def test_set_fast_paths_and_compile_layers_switch_modernbert():
    """The fast-path switches reach ModernBERT's encoder and heads by their attributes, and the switched-off (plain)
    model and the compiled one compute what the default one does."""
    from bertkit.models import compile_layers, set_fast_paths
    from bertkit.models.kernels import Linear

    config = tiny()
    model = randomize(ModernBertForMaskedLM(config), 21)
    ids, mask, labels = batch(config)
    with torch.no_grad():
        expected = model(ids, mask, labels=labels).prediction_logits
    set_fast_paths(model, unpad=False, onednn=False, fused_qkv=False)
    assert model.encoder.unpad is False and model.mlm.onednn is False
    assert all(not m.onednn for m in model.modules() if isinstance(m, Linear))
    with torch.no_grad():
        close(model(ids, mask, labels=labels).prediction_logits, expected, mask)
    set_fast_paths(model, unpad=True, onednn=True)
    assert model.encoder.unpad is True and model.mlm.onednn is True
    compile_layers(model, backend="eager")
    assert all(layer._compiled_call_impl is not None for layer in model.encoder.layers)
    with torch.no_grad():
        close(model(ids, mask, labels=labels).prediction_logits, expected, mask)


def test_packed_rows_run_each_document_as_if_alone():
    """A row packing documents (attention mask 1, 1, 2, 2, 2, 0: isolate_documents) gives every document the
    hidden states it has alone in its row: attention within it, the window within it, rotary positions from 0."""
    config = tiny(local_attention=4)  # +-2: the local layers are local inside the documents
    model = randomize(ModernBertForMaskedLM(config), 9)
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, 100, (n,), generator=g) for n in (7, 9, 5, 4)]
    rows = [[0, 1], [2, 3]]  # two rows of two documents each, then padding
    T = 18
    ids = torch.zeros(2, T, dtype=torch.long)
    mask = torch.zeros(2, T, dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for number, d in enumerate(members, start=1):
            ids[r, at:at + len(docs[d])] = docs[d]
            mask[r, at:at + len(docs[d])] = number
            at += len(docs[d])
    with torch.no_grad():
        for packed in both_layouts(model):
            out = packed(ids, mask, output_hidden_states=True)
            for r, members in enumerate(rows):
                at = 0
                for d in members:
                    alone = packed(docs[d][None], output_hidden_states=True)
                    n = len(docs[d])
                    close(out.prediction_logits[r, at:at + n], alone.prediction_logits[0])
                    for x, y in zip(out.hidden_states, alone.hidden_states):
                        close(x[r, at:at + n], y[0])
                    at += n


def test_sliding_window_is_what_local_layers_see():
    """Only the window separates the two configs: outputs agree where every distance is inside it, and differ on
    rows longer than it, on both paths."""
    narrow, wide = tiny(), tiny(local_attention=64)
    a = randomize(ModernBertModel(narrow), 8)
    b = ModernBertModel(wide).eval()
    b.load_state_dict(a.state_dict())
    ids, mask, _ = batch(narrow)
    with torch.no_grad():
        for unpad in (True, False):
            a.unpad = b.unpad = unpad
            close(a(ids[:, :5], mask[:, :5]).last_hidden_state, b(ids[:, :5], mask[:, :5]).last_hidden_state,
                  mask[:, :5])
            gap = (a(ids, mask).last_hidden_state - b(ids, mask).last_hidden_state).abs()[mask.bool()].max()
            assert gap > 1e-2


def test_sparse_prediction_matches_dense():
    config = tiny()
    model = randomize(ModernBertForMaskedLM(config), 9)
    ids, mask, labels = batch(config)
    at = labels != IGNORE_INDEX
    with torch.no_grad():
        dense = model(ids, mask, labels=labels)
        sparse = model(ids, mask, labels=labels, predict_at=at)
    assert sparse.prediction_logits.shape == (int(at.sum()), config.vocab_size)
    close(sparse.prediction_logits, dense.prediction_logits[at])
    close(sparse.loss, dense.loss)
    assert dense.seq_relationship_logits is None


def test_training_with_dropout_stays_finite_and_the_loss_falls():
    """Attention dropout takes the bool-mask kernel on the unpadded path; no row of it may be fully hidden (NaN)."""
    config = tiny(attention_dropout=0.1, mlp_dropout=0.1, embedding_dropout=0.1)
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(config).train()
    ids, mask, labels = batch(config, B=8)  # 8 sequences in 4 attention groups: groups with empty slots
    labels = torch.where(mask.bool(), ids, IGNORE_INDEX)  # reproduce every real token
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        loss = model(ids, mask, labels=labels).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.6 * losses[0], losses


def test_initialisation_follows_modernbert():
    config = tiny(num_hidden_layers=8, hidden_size=64, intermediate_size=96)
    torch.manual_seed(0)
    model = ModernBertForSequenceClassification(config, num_labels=2)
    w = model.encoder.layers[3].attn.qkv.weight
    # truncated at 2 std: the standard deviation is 0.88 x 0.02
    assert w.abs().max() <= 2 * 0.02 and abs(float(w.detach().std()) - 0.0176) < 0.002
    out = model.encoder.layers[3].ffn.down.weight
    assert out.abs().max() <= 2 * 0.02 / 4  # initializer_range / sqrt(2L), L = 8
    assert model.classifier.weight.abs().max() <= 2 * 64 ** -0.5 and model.classifier.weight.abs().max() > 0.05
    assert torch.equal(model.encoder.layers[1].attn_norm.weight, torch.ones(64))


def test_inputs_are_checked_with_a_message_naming_the_tensor():
    model = ModernBertModel(tiny(max_position_embeddings=16))
    with pytest.raises(ValueError, match="sequence length 17 is longer than max_position_embeddings"):
        model(torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 100))
    with pytest.raises(ValueError, match="attention_mask .* negative"):
        model(torch.ones(1, 4, dtype=torch.long), torch.tensor([[1, 1, -1, 0]]))
    # token_type_ids are accepted (the verbs pass them) and change nothing: ModernBERT has no segments.
    ids = torch.randint(3, 100, (2, 6))
    model.eval()
    with torch.no_grad():
        close(model(ids, token_type_ids=torch.ones_like(ids)).last_hidden_state, model(ids).last_hidden_state)


def test_config_validates_fields():
    with pytest.raises(ValueError, match="must be even"):
        tiny(hidden_size=36, num_attention_heads=4, intermediate_size=8)  # head size 9
    with pytest.raises(ValueError, match="attention_dropout"):
        tiny(attention_dropout=1.5)
    assert dataclasses.replace(tiny(), local_attention=9).sliding_window == 4


# ==================================================================================================================
# The verbs on a ModernBERT directory: fill-mask, features, info
# ==================================================================================================================
def json_tokenizer():
    """A byte-level BPE tokenizer.json framed `[CLS] A [SEP]` with [MASK] and [PAD], as ModernBERT's own is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from bertkit.tokenizers.tokenizer_json import JsonTokenizer
    from conftest import TINY_TEXT

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TINY_TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return JsonTokenizer(backend)


@pytest.fixture(scope="module", params=["vocab.txt", "tokenizer.json"])
def modernbert_dir(request, tmp_path_factory):
    """(a ModernBERT MLM directory, its tokenizer): WordPiece, or a tokenizer.json as released models carry."""
    tok = request.getfixturevalue("tiny_tokenizer") if request.param == "vocab.txt" else json_tokenizer()
    config = tiny(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
                  bos_token_id=tok.cls_id, sep_token_id=tok.sep_id, eos_token_id=tok.sep_id)
    directory = tmp_path_factory.mktemp("modernbert")
    randomize(ModernBertForMaskedLM(config), 11).save_pretrained(directory, tokenizer=tok)
    assert (directory / request.param).is_file()
    return directory, tok


def test_fill_mask_on_a_modernbert_directory(modernbert_dir, capsys):
    from bertkit.cli import main
    from bertkit.inference import fill_mask

    modernbert_dir, tokenizer = modernbert_dir

    text = "the quick brown [MASK] jumps over the [MASK] dog"
    found = fill_mask(modernbert_dir, text, top_k=3)
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(str(modernbert_dir)).eval()
    enc = tokenizer.encode(text)
    at = [i for i, t in enumerate(enc.input_ids) if t == tokenizer.mask_id]
    with torch.no_grad():
        probs = theirs(input_ids=torch.tensor([enc.input_ids])).logits[0, at].softmax(-1)
    top = probs.topk(3, dim=-1)
    assert [[c["id"] for c in row] for row in found] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor([[c["probability"] for c in row] for row in found]), top.values,
                               atol=ATOL, rtol=0)
    assert main(["fill-mask", "--model", str(modernbert_dir), "--json", text]) in (0, None)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [c["id"] for c in printed["predictions"][0]][:3] == top.indices[0].tolist()  # the CLI's top 5


def test_features_of_a_modernbert_directory(modernbert_dir, tmp_path):
    from bertkit.cli import main
    from bertkit.features import extract_features, read_features

    modernbert_dir, tokenizer = modernbert_dir

    texts = ["the quick brown fox jumps over the lazy dog and keeps running far away", "a short one"]
    features, tokens = extract_features(modernbert_dir, texts, layers=(-1, 1), combine="concat")
    theirs = transformers.ModernBertModel.from_pretrained(str(modernbert_dir)).eval()
    for text, feature, token_list in zip(texts, features, tokens):
        enc = tokenizer.encode(text)
        assert token_list == enc.tokens and feature.shape == (len(enc.input_ids), 64)
        with torch.no_grad():
            hidden = theirs(input_ids=torch.tensor([enc.input_ids]), output_hidden_states=True).hidden_states
        expected = torch.cat([hidden[-1], hidden[1]], dim=-1)[0]
        torch.testing.assert_close(torch.from_numpy(feature), expected, atol=ATOL, rtol=0)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["features", "--model", str(modernbert_dir), "--input", str(tmp_path / "in.txt"), "--layers=-1,1",
                 "--out", str(tmp_path / "f.safetensors")]) in (0, None)
    again, _ = read_features(tmp_path / "f.safetensors")
    assert all((a == b).all() for a, b in zip(again, features))


def test_info_of_a_modernbert_directory(modernbert_dir, capsys):
    from bertkit.cli import main
    from bertkit.inference import model_info

    modernbert_dir, _ = modernbert_dir
    info = model_info(modernbert_dir)
    model = ModernBertForMaskedLM.from_pretrained(modernbert_dir)
    assert info["architectures"] == ["ModernBertForMaskedLM"] and "mlm" in info["heads"]
    assert info["parameters_total"] == model.num_parameters() and not info["unknown_tensors"]
    assert info["parameters_encoder"] == model.encoder.num_parameters()
    assert ModernBertConfig.from_dict(info["config"]) == model.config and info["tokenizer"]
    assert main(["info", str(modernbert_dir), "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["parameters_total"] == info["parameters_total"]


# ==================================================================================================================
# Pretraining: the modernbert-mini recipe
# ==================================================================================================================
def test_modernbert_recipe_pretrains_and_writes_a_transformers_directory(tmp_path):
    from bertkit import WordPieceTokenizer
    from bertkit.data.corpus import iter_lines
    from bertkit.data.prepare import prepare
    from bertkit.training.pretrain import pretrain, resolve_config
    from conftest import synthetic_corpus

    corpus = synthetic_corpus(tmp_path / "corpus.txt")
    held_out = synthetic_corpus(tmp_path / "held_out.txt", documents=8, seed=1)
    tok = WordPieceTokenizer.train(iter_lines([corpus]), vocab_size=120, min_frequency=1, show_progress=False)
    tok.save(tmp_path / "tok")
    prepare([corpus], tmp_path / "tok", tmp_path / "data", eval_paths=[held_out], progress=False)
    recipe = resolve_config("modernbert-mini")
    assert recipe.model == {"model_type": "modernbert", "local_attention": 64, "global_attn_every_n_layers": 3}
    assert recipe.data.mask_prob == 0.3 and recipe.data.objective == "roberta"
    config = resolve_config("modernbert-mini", {
        "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48, "local_attention": 8,
        "max_seq_length": 32, "max_predictions_per_seq": 10, "batch_size": 16, "max_steps": 40, "eval_instances": 32,
        "learning_rate": 3e-3, "log_every": 1, "save_every": 40, "eval_every": 0, "progress": False})
    pretrain(tmp_path / "data", tmp_path / "run", config)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    curve = [r["loss"] for r in records if "loss" in r]
    assert sum(curve[-10:]) / 10 < sum(curve[:10]) / 10 - 0.5, curve
    evals = [r["eval_mlm_accuracy"] for r in records if "eval_mlm_accuracy" in r]
    assert evals[-1] > evals[0]
    model_dir = tmp_path / "run" / "model"
    ours = ModernBertForMaskedLM.from_pretrained(model_dir).eval()
    assert (ours.config.num_hidden_layers, ours.config.local_attention, ours.config.pad_token_id,
            ours.config.cls_token_id) == (4, 8, tok.pad_id, tok.cls_id)
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(str(model_dir), output_loading_info=True)
    no_loading_problems(info)
    ids = torch.tensor([tok.encode("the cat sees a big red house near the river and the park").input_ids])
    with torch.no_grad():
        close(ours(ids).prediction_logits, theirs.eval()(input_ids=ids).logits)
