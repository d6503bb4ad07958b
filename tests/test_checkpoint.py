"""bertkit.checkpoint: model directories (round trips for every family, strict loading, legacy names, no pickle)
and resume-state files (naming, atomic writes, keep_last, weights-only loading); tensor roles for `bertkit info`."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.checkpoint import (CheckpointError, HeadMismatchError, ShapeMismatchError, WeightsMismatchError,
                                latest_checkpoint, load_checkpoint, load_state_strict, resume_state_path,
                                resume_state_step, save_checkpoint, tensor_role)
from bertkit.inference import model_info
from bertkit.models import (BertForMaskedLM, BertForQuestionAnswering, BertForReplacedTokenDetection,
                            BertForSequenceClassification, BertForTokenClassification)
from bertkit.tokenizers import TOKENIZER_FILES, TOKENIZER_KINDS, WordPieceTokenizer, load_tokenizer
from bertkit.tokenizers.load import CLASSES

from conftest import TINY_TEXT, tiny_config

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


def family_config(model_type: str) -> BertConfig:
    extra = {"embedding_size": 16} if model_type in ("albert", "electra") else {}
    return BertConfig.for_family(model_type, **TINY, **extra)


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (LayerNorms and biases too), so a round trip cannot hide behind ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


# ---- model directories: round trips --------------------------------------------------------------------------
FAMILY_MODELS = [("bert", BertForPreTraining), ("roberta", BertForPreTraining), ("albert", BertForPreTraining),
                 ("electra", BertForReplacedTokenDetection), ("electra", BertForMaskedLM),
                 ("distilbert", BertForMaskedLM), ("bert", BertModel)]


@pytest.mark.parametrize("model_type,cls", FAMILY_MODELS, ids=[f"{t}-{c.__name__}" for t, c in FAMILY_MODELS])
def test_model_directory_round_trip(model_type, cls, tmp_path):
    model = randomised(cls(family_config(model_type)))
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == model_type
    again = cls.from_pretrained(tmp_path)
    assert again.config == model.config
    assert_same_state(model, again)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering])
def test_task_model_directory_round_trip(model_type, cls, tmp_path):
    kwargs = {"num_labels": 3, "labels": ["a", "b", "c"]} if cls is not BertForQuestionAnswering else {}
    model = randomised(cls(family_config(model_type), **kwargs))
    model.save_pretrained(tmp_path)
    again = cls.from_pretrained(tmp_path)
    assert_same_state(model, again)
    if kwargs:
        assert again.num_labels == 3 and again.labels == ["a", "b", "c"]


# ---- strict loading ------------------------------------------------------------------------------------------
def test_config_that_does_not_match_weights_names_tensor(tmp_path):
    BertForPreTraining(tiny_config()).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["intermediate_size"] = 40
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"'bert.encoder.layer.0.intermediate.dense.(weight|bias)' has shape "
                                              r"\(37,( 32)?\) in the weights but \(40,( 32)?\)"):
        BertForPreTraining.from_pretrained(tmp_path)


def test_shape_mismatch_is_typed_and_names_the_stored_tensor(tmp_path):
    BertModel(tiny_config()).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["encoder.layer.1.output.dense.bias"] = torch.zeros(31)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ShapeMismatchError) as info:
        BertModel.from_pretrained(tmp_path)
    assert info.value.name == "encoder.layer.1.output.dense.bias"


def test_unknown_tensor_is_named(tmp_path):
    BertModel(tiny_config()).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(3)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="distance_embedding"):
        BertModel.from_pretrained(tmp_path)


def test_load_state_strict_names_missing_and_unexpected_tensors():
    model = BertModel(tiny_config())
    state = dict(model.state_dict())
    del state["layers.1.ffn.up.bias"]
    state["layers.7.ffn.up.bias"] = torch.zeros(37)
    with pytest.raises(WeightsMismatchError, match=r"missing \['layers.1.ffn.up.bias'\], unexpected "
                                                   r"\['layers.7.ffn.up.bias'\]") as info:
        load_state_strict(model, state, source="here")
    assert (info.value.missing, info.value.unexpected) == (["layers.1.ffn.up.bias"], ["layers.7.ffn.up.bias"])
    load_state_strict(model, model.state_dict(), source="here")  # a matching state loads


def test_a_head_that_does_not_fit_is_typed_and_new_heads_replaces_it(tmp_path):
    BertForSequenceClassification(tiny_config(), num_labels=3).save_pretrained(tmp_path / "three")
    with pytest.raises(HeadMismatchError, match="does not fit the task .* new_heads=True"):
        BertForSequenceClassification.from_pretrained(tmp_path / "three", num_labels=2, labels=["x", "y"])
    fresh = BertForSequenceClassification.from_pretrained(tmp_path / "three", num_labels=2, labels=["x", "y"],
                                                          new_heads=True)
    assert fresh.num_labels == 2
    BertModel(tiny_config()).save_pretrained(tmp_path / "bare")
    with pytest.raises(HeadMismatchError, match="holds no pretraining heads"):
        BertForPreTraining.from_pretrained(tmp_path / "bare")


def test_missing_weights_file(tmp_path):
    tiny_config().to_json_file(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(tmp_path)


# ---- legacy files --------------------------------------------------------------------------------------------
def test_legacy_bin_with_gamma_beta_names_loads_the_same_weights(tmp_path):
    model = randomised(BertForPreTraining(tiny_config()))
    model.save_pretrained(tmp_path / "new")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    state = {}
    for name, tensor in load_file(str(tmp_path / "new" / "model.safetensors")).items():
        if "LayerNorm" in name:  # TF-era names: gamma for the weight, beta for the bias
            name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[name] = tensor
    assert sum(name.endswith(".gamma") for name in state) == 2 * 2 + 2  # 2 per layer, embeddings, MLM head
    torch.save(state, legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((tmp_path / "new" / "config.json").read_text())
    assert_same_state(model, BertForPreTraining.from_pretrained(legacy))


class _Payload:
    """Unpickling this runs os.mkdir(path): what a hostile pickle could do."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_pickled_object_in_pytorch_model_bin_is_refused_unrun(tmp_path):
    model = BertModel(tiny_config())
    model.config.to_json_file(tmp_path / "config.json")
    marker = tmp_path / "ran"
    torch.save({**model.state_dict(), "extra": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin: cannot read weights safely"):
        BertModel.from_pretrained(tmp_path)
    assert not marker.exists()
    torch.load(tmp_path / "pytorch_model.bin", weights_only=False)  # the control: an unsafe load runs it
    assert marker.is_dir()


# ---- files and permissions -----------------------------------------------------------------------------------
def test_save_is_atomic_and_keeps_tokenizer(tmp_path, tiny_tokenizer):
    model = BertForPreTraining(tiny_config(vocab_size=tiny_tokenizer.vocab_size))
    model.save_pretrained(tmp_path / "m", tokenizer=tiny_tokenizer)
    model.save_pretrained(tmp_path / "m")  # overwrite: tokenizer files stay
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging leftovers


def _tokenizer_of_kind(kind: str, tmp_path):
    """A tiny tokenizer of each kind of `bertkit.tokenizers.load.CLASSES`, trained here."""
    if kind == "json":  # any tokenizer.json, read as the file says
        WordPieceTokenizer.train(TINY_TEXT, vocab_size=150, min_frequency=1, show_progress=False).save(tmp_path / "j")
        return load_tokenizer(tmp_path / "j", kind="json")
    options = {"unigram": {"extra_ids": 4}}.get(kind, {"min_frequency": 1})
    return CLASSES[kind].train(TINY_TEXT, vocab_size={"bpe": 300}.get(kind, 150), show_progress=False,
                               **options)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_a_resave_without_the_tokenizer_keeps_every_tokenizer_file(kind, tmp_path):
    tokenizer = _tokenizer_of_kind(kind, tmp_path)
    model = BertForMaskedLM(tiny_config(vocab_size=tokenizer.vocab_size))
    model.save_pretrained(tmp_path / "m", tokenizer=tokenizer)
    saved = {p.name for p in (tmp_path / "m").iterdir()} - {"config.json", "model.safetensors"}
    assert saved and saved <= set(TOKENIZER_FILES)  # the list names every file this kind's save writes
    # transformers writes special_tokens_map.json beside the others; a re-save keeps it too
    (tmp_path / "m" / "special_tokens_map.json").write_text('{"unk_token": "[UNK]"}\n', encoding="utf-8")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.name in TOKENIZER_FILES}
    model.save_pretrained(tmp_path / "m")
    after = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.name in TOKENIZER_FILES}
    assert after == before and "special_tokens_map.json" in after
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted({*before, "config.json", "model.safetensors"})


def test_saved_model_directory_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        BertForPreTraining(tiny_config()).save_pretrained(tmp_path / "m")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()} == {0o644}
    model = BertForPreTraining(tiny_config())
    os.umask(0o077)  # a private umask is honoured too
    try:
        model.save_pretrained(tmp_path / "m")
    finally:
        os.umask(old)
    assert {stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / "m", *(tmp_path / "m").iterdir()]} == {0o700, 0o600}


# ---- resume state --------------------------------------------------------------------------------------------
def test_resume_state_naming_keep_last_and_latest(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (5, 10, 100, 20):
        path = resume_state_path(tmp_path, step)
        assert path == tmp_path / "checkpoints" / f"step-{step:08d}.pt" and resume_state_step(path) == step
        save_checkpoint(path, {"step": step, "weights": torch.full((3,), float(step))}, keep_last=2)
    # keep_last counts by step, not by time of writing: step 20 written last still goes before 100.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000020.pt", "step-00000100.pt"]
    latest = latest_checkpoint(tmp_path)
    assert latest == resume_state_path(tmp_path, 100)
    state = load_checkpoint(latest)
    assert state["step"] == 100 and torch.equal(state["weights"], torch.full((3,), 100.0))
    (tmp_path / "checkpoints" / "step-7.pt").write_bytes(b"")  # not one of ours: ignored
    assert latest_checkpoint(tmp_path) == latest
    with pytest.raises(ValueError, match="not a resume-state file name"):
        resume_state_step(tmp_path / "checkpoints" / "step-7.pt")


def test_rng_states_survive_a_weights_only_round_trip(tmp_path):
    import random

    import numpy as np

    from bertkit.checkpoint import rng_state, set_rng_state

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(resume_state_path(tmp_path, 1), {"rng": [rng_state()]}, keep_last=1)
    first = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_checkpoint(latest_checkpoint(tmp_path))["rng"][0])
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == first


def test_resume_state_refuses_torn_files_and_pickled_objects(tmp_path):
    torn = resume_state_path(tmp_path, 1)
    save_checkpoint(torn, {"step": 1, "weights": torch.zeros(1000)}, keep_last=5)
    torn.write_bytes(torn.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=f"{torn}: not a readable bertkit checkpoint"):
        load_checkpoint(torn)
    marker = tmp_path / "ran"
    hostile = resume_state_path(tmp_path, 2)
    save_checkpoint(hostile, {"step": 2, "extra": _Payload(marker)}, keep_last=5)
    with pytest.raises(CheckpointError, match="not a readable bertkit checkpoint"):
        load_checkpoint(hostile)
    assert not marker.exists()
    assert sorted(p.name for p in hostile.parent.iterdir()) == ["step-00000001.pt", "step-00000002.pt"]  # no tmp


# ---- what each tensor is: `bertkit info` -----------------------------------------------------------------------
INFO_MODELS = [("bert", BertForPreTraining, ["mlm", "pretraining"]),
               ("roberta", BertForPreTraining, ["mlm", "pretraining"]),
               ("albert", BertForPreTraining, ["mlm", "pretraining"]),
               ("electra", BertForReplacedTokenDetection, ["discriminator"]),
               ("electra", BertForMaskedLM, ["mlm", "pretraining"]),
               ("bert", BertForSequenceClassification, ["classifier"]),
               ("roberta", BertForSequenceClassification, ["classifier"]),
               ("bert", BertForQuestionAnswering, ["qa"]),
               ("bert", BertModel, [])]


@pytest.mark.parametrize("model_type,cls,heads", INFO_MODELS,
                         ids=[f"{t}-{c.__name__}" for t, c, _ in INFO_MODELS])
def test_model_info_counts_encoder_and_heads_for_every_family(model_type, cls, heads, tmp_path):
    model = cls(family_config(model_type))
    model.save_pretrained(tmp_path)
    info = model_info(tmp_path)
    encoder = model if isinstance(model, BertModel) else model.bert
    assert info["parameters_encoder"] == encoder.num_parameters()
    assert info["parameters_total"] == model.num_parameters()  # the tied decoder counted once, buffers not at all
    assert info["parameters_heads"] == model.num_parameters() - encoder.num_parameters()
    assert info["heads"] == heads and info["unknown_tensors"] == []


def test_tensor_roles_per_family():
    assert tensor_role("bert.encoder.layer.3.output.LayerNorm.gamma") == ("encoder", ())
    assert tensor_role("cls.predictions.transform.dense.weight") == ("head", ("mlm", "pretraining"))
    assert tensor_role("cls.seq_relationship.bias") == ("head", ("pretraining",))
    assert tensor_role("cls.predictions.decoder.weight") == ("redundant", ())
    assert tensor_role("lm_head.dense.weight", "roberta") == ("head", ("mlm", "pretraining"))
    assert tensor_role("lm_head.decoder.weight", "roberta") == ("redundant", ())
    assert tensor_role("classifier.out_proj.weight", "roberta") == ("head", ("classifier",))
    assert tensor_role("predictions.LayerNorm.bias", "albert") == ("head", ("mlm", "pretraining"))
    assert tensor_role("sop_classifier.classifier.weight", "albert") == ("head", ("pretraining",))
    assert tensor_role("albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight", "albert") == ("encoder", ())
    assert tensor_role("discriminator_predictions.dense_prediction.bias", "electra") == ("head", ("discriminator",))
    assert tensor_role("generator_lm_head.bias", "electra") == ("head", ("mlm", "pretraining"))
    assert tensor_role("qa_outputs.weight") == ("head", ("qa",))
    assert tensor_role("cls.predictions.transform.dense.weight", "roberta") == ("unknown", ())
