"""Model directories and training-state checkpoints.

A *model directory* is what every verb consumes and what transformers reads: `config.json` (transformers' fields
of the model's family), `model.safetensors` (transformers' parameter names) and the tokenizer files (`vocab.txt`,
or `vocab.json` + `merges.txt`, ...). Our modules have short names of their own; one `Format` per family (BERT,
RoBERTa, ALBERT, ELECTRA, DistilBERT, ModernBERT) maps transformers' names to ours, one row per tensor with `{}`
standing for the layer index, and its inverse is derived from it. Loading is strict: an unknown tensor, a missing
tensor or a shape that disagrees with config.json is an error that names the tensor.

Weights are data, never code: `.safetensors` is read with safetensors and a legacy `pytorch_model.bin` with
`torch.load(weights_only=True)`, a released ELMo's `weights.hdf5` with h5py (`read_bilm_weights`).

A released ELMo (allenai/bilm-tf's `options.json` + `weights.hdf5`, the layout AllenNLP reads) is a model directory
too: `bertkit.models.modeldir.read_config` reads its options.json as an ElmoConfig and `read_weights` its hdf5 file
as bertkit's tensors, so every verb that takes an ELMo directory takes it as it is distributed.

config.json is read by `bertkit.models.ModelDir` (once per load); `load_model` here takes the config it parsed.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

# config_from_dict and CONFIG_NAME are bertkit.config's (re-exported here: the old import path keeps working)
from bertkit.config import (CONFIG_NAME, BertConfig, ElmoConfig, T5Config, config_from_dict,  # noqa: F401
                            label_of, with_article)
from bertkit.errors import CheckpointError
from bertkit.io import disk_full_as_error, fsync_dir, temporary_name
from bertkit.tokenizers import TOKENIZER_FILES
from bertkit.tokenizers.word import BILM_WEIGHTS, is_bilm_directory


def _linear(theirs: str, ours: str) -> dict[str, str]:
    """The weight and bias rows of one Linear or LayerNorm."""
    return {f"{theirs}.weight": f"{ours}.weight", f"{theirs}.bias": f"{ours}.bias"}


def _mlm_head(dense: str, norm: str, bias: str) -> dict[str, str]:
    """A family's masked-LM head (transform, LayerNorm, output bias; the decoder is tied to the word embeddings)."""
    return {**_linear(dense, "mlm.dense"), **_linear(norm, "mlm.norm"), bias: "mlm.bias"}


# The embedding rows every BERT-family encoder shares (DistilBERT without token types).
_EMBEDDING_KEYS = {"embeddings.word_embeddings.weight": "embeddings.word.weight",
                   "embeddings.position_embeddings.weight": "embeddings.position.weight",
                   "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
                   **_linear("embeddings.LayerNorm", "embeddings.norm")}


# Our names of a post-LN layer's eight Linear / LayerNorm modules, in the order `_layer_keys` takes theirs.
_OUR_LAYER = ("attn.query", "attn.key", "attn.value", "attn.out", "attn.norm", "ffn.up", "ffn.down", "ffn.norm")


def _layer_keys(prefix: str, theirs: str) -> dict[str, str]:
    """A BERT-family layer's rows: `theirs`, its family's names of the _OUR_LAYER modules (space-separated, under
    `prefix`, in which "{}" is the layer index)."""
    return {k: v for name, ours in zip(theirs.split(), _OUR_LAYER, strict=True)
            for k, v in _linear(prefix + name, f"layers.{{}}.{ours}").items()}


# transformers name (without the "bert." prefix for encoder tensors) -> bertkit name; "{}" is the layer index.
ENCODER_KEYS: dict[str, str] = {
    **_EMBEDDING_KEYS,
    **_layer_keys("encoder.layer.{}.", "attention.self.query attention.self.key attention.self.value "
                                       "attention.output.dense attention.output.LayerNorm intermediate.dense "
                                       "output.dense output.LayerNorm"),
    **_linear("pooler.dense", "pooler.dense"),
}
# Heads, by family: transformers name -> bertkit name (top-level names on both sides). A model class declares
# which family it has (`head_family`); tensors of the other families are dropped on load (a pretraining
# checkpoint's MLM head when fine-tuning, say), anything else unknown is an error.
HEAD_KEYS: dict[str, dict[str, str]] = {
    "pretraining": {**_mlm_head("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                "cls.predictions.bias"), **_linear("cls.seq_relationship", "nsp")},
    # BertForSequenceClassification, BertForTokenClassification and BertForMultipleChoice share these names.
    "classifier": {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"},
    "qa": {"qa_outputs.weight": "qa.weight", "qa_outputs.bias": "qa.bias"},
}
PRETRAINING_HEAD_KEYS = HEAD_KEYS["pretraining"]
# BertForMaskedLM and BertLMHeadModel: the MLM head without NSP.
HEAD_KEYS["mlm"] = {k: v for k, v in PRETRAINING_HEAD_KEYS.items() if k.startswith("cls.predictions.")}
# Tensors some writers store that carry nothing of their own: buffers, and the decoder that is tied to the word
# embeddings (older transformers versions wrote it out). Dropped on load.
REDUNDANT_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# TF-era names for LayerNorm parameters, still found in old checkpoints.
_LEGACY_SUFFIXES = ((".gamma", ".weight"), (".beta", ".bias"))




# RoBERTa: BERT's encoder names; the LM head is lm_head.* (decoder tied to the word embeddings, bias lm_head.bias).
_ROBERTA_LM = _mlm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
# ALBERT: one layer per group (inner_group_num 1), so the group index is our weight-set index.
_ALBERT_LAYER = "encoder.albert_layer_groups.{}.albert_layers.0."
ALBERT_ENCODER_KEYS: dict[str, str] = {
    **_EMBEDDING_KEYS,
    **_linear("encoder.embedding_hidden_mapping_in", "project"),
    **_layer_keys(_ALBERT_LAYER, "attention.query attention.key attention.value attention.dense attention.LayerNorm "
                                 "ffn ffn_output full_layer_layer_norm"),
    **_linear("pooler", "pooler.dense"),
}
_ALBERT_MLM = _mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
# ELECTRA: BERT's layers, no pooler, the E -> H projection as embeddings_project.
ELECTRA_ENCODER_KEYS: dict[str, str] = {
    **{k: v for k, v in ENCODER_KEYS.items() if not k.startswith("pooler.")},
    **_linear("embeddings_project", "project"),
}
_ELECTRA_GENERATOR = _mlm_head("generator_predictions.dense", "generator_predictions.LayerNorm",
                               "generator_lm_head.bias")
# DistilBERT: other names for the same post-LN layer; no token types, no pooler.
_DISTIL_LAYER = "transformer.layer.{}."
DISTILBERT_ENCODER_KEYS: dict[str, str] = {
    **{k: v for k, v in _EMBEDDING_KEYS.items() if "token_type" not in k},
    **_layer_keys(_DISTIL_LAYER, "attention.q_lin attention.k_lin attention.v_lin attention.out_lin sa_layer_norm "
                                 "ffn.lin1 ffn.lin2 output_layer_norm"),
}
_DISTIL_MLM = _mlm_head("vocab_transform", "vocab_layer_norm", "vocab_projector.bias")
_TASK_HEADS = {"classifier": HEAD_KEYS["classifier"], "qa": HEAD_KEYS["qa"]}
# RoBERTa's and ELECTRA's sequence classifiers have a dense head of their own (`classifier.dense`,
# `classifier.out_proj`) where BERT has pooler + linear; their token classifiers keep the plain `classifier`.
_DENSE_TASK_HEADS = {**_TASK_HEADS, "classifier": {**HEAD_KEYS["classifier"], **_linear("classifier.dense", "classifier.dense"),
                                                   **_linear("classifier.out_proj", "classifier.out")}}
# ELECTRA's multiple-choice model summarises the first token (`sequence_summary.summary`) before its `classifier`;
# DistilBERT's sequence classifier and multiple-choice model have `pre_classifier` there. Both are the `summary`
# layer of bertkit's task models (bertkit.models.heads.SENTENCE_HEADS).
_ELECTRA_TASK_HEADS = {**_DENSE_TASK_HEADS, "classifier": {**_DENSE_TASK_HEADS["classifier"],
                                                           **_linear("sequence_summary.summary", "summary")}}
_DISTIL_TASK_HEADS = {**_TASK_HEADS, "classifier": {**HEAD_KEYS["classifier"], **_linear("pre_classifier", "summary")}}
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


@dataclass(frozen=True)
class Format:
    """One family's on-disk names: where the encoder sits, its tensors, its heads, and its class names."""

    prefix: str  # the encoder's prefix in transformers' task and pretraining models ("bert.")
    encoder: dict[str, str]  # encoder tensors: their name (without prefix) -> ours (without "bert.")
    heads: dict[str, dict[str, str]]  # head family -> {their name: our name}
    redundant: tuple[str, ...]  # tensors dropped on load: buffers and tied copies
    class_prefix: str  # "Bert" in our architecture names becomes this ("Roberta")
    architectures: dict[str, str] = field(default_factory=dict)  # our architecture -> theirs, where not a rename
    pooler: bool = True  # the bare encoder class takes `add_pooler` (BERT's pooler; ModernBERT has none)
    # head family -> our tensor prefixes that start fresh when the file holds that family's other tensors
    # (a ModernBERT classifier on an MLM directory reuses its prediction head, as transformers does)
    fresh: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (model class, config, weights under their names, directory) -> (config, weights): a family's own rules that
    # only the weights can settle, applied before the tables (T5: an output projection stored although tied)
    adapt: Callable | None = None


# The BERT family: one set of classes, five on-disk spellings.
_BERT_FAMILY: dict[str, Format] = {
    "bert": Format("bert.", ENCODER_KEYS, HEAD_KEYS, REDUNDANT_KEYS, "Bert"),
    "roberta": Format("roberta.", ENCODER_KEYS, {"pretraining": _ROBERTA_LM, "mlm": _ROBERTA_LM, **_DENSE_TASK_HEADS},
                      (*_BUFFERS, "lm_head.decoder.weight", "lm_head.decoder.bias"), "Roberta",
                      {"BertForPreTraining": "RobertaForMaskedLM", "BertLMHeadModel": "RobertaForCausalLM"},
                      "RoBERTa"),
    "albert": Format("albert.", ALBERT_ENCODER_KEYS,
                     {"pretraining": {**_ALBERT_MLM, **_linear("sop_classifier.classifier", "nsp")},
                      "mlm": _ALBERT_MLM, **_TASK_HEADS},
                     (*_BUFFERS, "predictions.decoder.weight", "predictions.decoder.bias"), "Albert"),
    "electra": Format("electra.", ELECTRA_ENCODER_KEYS,
                      {"discriminator": {**_linear("discriminator_predictions.dense", "rtd.dense"),
                                         **_linear("discriminator_predictions.dense_prediction", "rtd.out")},
                       "pretraining": _ELECTRA_GENERATOR, "mlm": _ELECTRA_GENERATOR, **_ELECTRA_TASK_HEADS},
                      (*_BUFFERS, "generator_lm_head.weight"), "Electra",
                      {"BertForPreTraining": "ElectraForMaskedLM", "BertForReplacedTokenDetection":
                       "ElectraForPreTraining", "BertLMHeadModel": "ElectraForCausalLM"}, "ELECTRA"),
    "distilbert": Format("distilbert.", DISTILBERT_ENCODER_KEYS,
                         {"pretraining": _DISTIL_MLM, "mlm": _DISTIL_MLM, **_DISTIL_TASK_HEADS},
                         (*_BUFFERS, "vocab_projector.weight"), "DistilBert",
                         {"BertForPreTraining": "DistilBertForMaskedLM"}, "DistilBERT"),
}

# ModernBERT (transformers' ModernBert*): an architecture of its own, with its own config class. Layer 0 has no
# attn_norm (its input is the normed embedding); bias rows exist only where config.json turns biases on
# (norm_bias, attention_bias, mlp_bias, classifier_bias, decoder_bias). The MLM head and the classifiers share
# transformers' `head.*` transform; the MLM decoder weight is the token-embedding matrix (tied, never stored).
MODERNBERT_ENCODER_KEYS: dict[str, str] = {
    "embeddings.tok_embeddings.weight": "embeddings.word.weight",
    **_linear("embeddings.norm", "embeddings.norm"),
    **_linear("layers.{}.attn_norm", "layers.{}.attn_norm"),
    **_linear("layers.{}.attn.Wqkv", "layers.{}.attn.qkv"),
    **_linear("layers.{}.attn.Wo", "layers.{}.attn.out"),
    **_linear("layers.{}.mlp_norm", "layers.{}.ffn_norm"),
    **_linear("layers.{}.mlp.Wi", "layers.{}.ffn.up"),
    **_linear("layers.{}.mlp.Wo", "layers.{}.ffn.down"),
    **_linear("final_norm", "norm"),
}
# Question answering is transformers' ModernBertForQuestionAnswering: the classifiers' names, two outputs.
_MODERNBERT_CLASSIFIER = {**_linear("head.dense", "head.dense"), **_linear("head.norm", "head.norm"),
                          **_linear("classifier", "classifier")}
_MODERNBERT = Format(
    "model.", MODERNBERT_ENCODER_KEYS,
    {"mlm": _mlm_head("head.dense", "head.norm", "decoder.bias"),
     "classifier": _MODERNBERT_CLASSIFIER, "qa": _MODERNBERT_CLASSIFIER},
    ("decoder.weight",), "ModernBert", pooler=False,
    fresh={"classifier": ("classifier.",), "qa": ("classifier.",)})


# T5 (transformers' T5ForConditionalGeneration, T5EncoderModel): an encoder-decoder with its own config class and
# no name prefix. The shared embeddings and the encoder are the family's encoder; the decoder and the output
# projection are the "seq2seq" head, so T5EncoderModel drops them from a full directory. transformers keeps each
# stack's relative position bias table in its first layer; ours sits on the stack (`position_bias`).
def _t5_stack(stack: str, decoder: bool) -> dict[str, str]:
    """One stack's rows: block.{i}.layer.0 self-attention, (decoder) layer.1 cross-attention, then feed-forward."""
    theirs, ours, ff = f"{stack}.block.{{}}.layer.", f"{stack}.layers.{{}}.", 2 if decoder else 1
    rows = {f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight": f"{stack}.position_bias.weight",
            f"{theirs}0.layer_norm.weight": f"{ours}attn_norm.weight",
            f"{theirs}{ff}.layer_norm.weight": f"{ours}ffn_norm.weight",
            f"{stack}.final_layer_norm.weight": f"{stack}.final_norm.weight"}
    projections = {"q": "query", "k": "key", "v": "value", "o": "out"}
    rows.update({f"{theirs}0.SelfAttention.{p}.weight": f"{ours}attn.{q}.weight" for p, q in projections.items()})
    if decoder:
        rows[f"{theirs}1.layer_norm.weight"] = f"{ours}cross_norm.weight"
        rows.update({f"{theirs}1.EncDecAttention.{p}.weight": f"{ours}cross.{q}.weight" for p, q in projections.items()})
    # T5 1.0's block is wi -> ReLU -> wo; T5 1.1's is GELU(wi_0) * wi_1 -> wo.
    for theirs_ff, ours_ff in {"wi": "up", "wi_0": "gate", "wi_1": "linear", "wo": "down"}.items():
        rows[f"{theirs}{ff}.DenseReluDense.{theirs_ff}.weight"] = f"{ours}ffn.{ours_ff}.weight"
    return rows


def _t5_adapt(cls, config: T5Config, weights: dict[str, torch.Tensor], directory: str):
    """T5's ties as transformers resolves them, before the tables rename the weights.

    The shared embeddings may be stored only as a stack's tied copy (`encoder.embed_tokens.weight`). For the
    encoder-decoder: a directory without a decoder (is_encoder_decoder false) is refused; an `lm_head.weight` stored
    although config.json says tied is dropped when it equals the embeddings, and otherwise makes the model untied
    (what transformers does, keeping the output scaling its config.json says).
    """
    if "shared.weight" not in weights:
        copy = next((k for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if k in weights), None)
        if copy is not None:
            weights = {**weights, "shared.weight": weights[copy]}
    if cls.head_family != "seq2seq":
        return config, weights
    if not config.is_encoder_decoder:
        raise CheckpointError(f"{Path(directory) / CONFIG_NAME}: is_encoder_decoder=false: the directory holds a T5 "
                              f"encoder alone (T5EncoderModel); {cls.__name__} needs the decoder")
    head = weights.get("lm_head.weight")
    if config.tie_word_embeddings and head is not None:
        if "shared.weight" in weights and torch.equal(head, weights["shared.weight"]):
            weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        else:
            config = replace(config, tie_word_embeddings=False, scale_decoder_outputs=config.scale_output)
    return config, weights


_T5_ENCODER = {"shared.weight": "shared.weight", **_t5_stack("encoder", decoder=False)}
_T5 = Format(
    "", _T5_ENCODER, {"seq2seq": {**_t5_stack("decoder", decoder=True), "lm_head.weight": "lm_head.weight"}},
    # tied copies of the shared embeddings, and a cross-attention position table old checkpoints carry unused
    ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
     "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"),
    "T5", pooler=False, adapt=_t5_adapt)


# ELMo (bertkit.models.elmo): transformers has no ELMo, so the names on disk are bertkit's own (no prefix); the word
# softmax is the "lm" head, which ElmoModel (the features) drops from a pretraining directory.
_ELMO_ENCODER = {name: name for name in (
    "char_cnn.embedding.weight", "char_cnn.convs.{}.weight", "char_cnn.convs.{}.bias",
    "char_cnn.highways.{}.linear.weight", "char_cnn.highways.{}.linear.bias", "char_cnn.projection.weight",
    "char_cnn.projection.bias",
    *(f"bilm.{side}_layers.{{}}.lstm.{tensor}_l0" for side in ("forward", "backward")
      for tensor in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")))}
_ELMO = Format("", _ELMO_ENCODER, {"lm": {"softmax.weight": "softmax.weight", "softmax.bias": "softmax.bias"}},
               (), "Elmo", pooler=False)


# XLNet (transformers' XLNetModel, XLNetLMHeadModel, XLNetFor*): its own config class, the encoder under
# "transformer.". The attention tensors keep transformers' (H, N, D) shapes, so the table only renames. The LM head's
# weight is the word embeddings (tied; a stored copy is dropped) and only its bias is stored. Sequence
# classification and multiple choice share the summary and `logits_proj`; token classification has `classifier`.
_XLNET_LAYER = "layer.{}."
XLNET_ENCODER_KEYS: dict[str, str] = {
    "word_embedding.weight": "word.weight",
    "mask_emb": "mask_emb",
    **{f"{_XLNET_LAYER}rel_attn.{name}": f"layers.{{}}.attn.{name}"
       for name in ("q", "k", "v", "o", "r", "r_r_bias", "r_s_bias", "r_w_bias", "seg_embed")},
    **_linear(_XLNET_LAYER + "rel_attn.layer_norm", "layers.{}.attn.norm"),
    **_linear(_XLNET_LAYER + "ff.layer_norm", "layers.{}.ffn.norm"),
    **_linear(_XLNET_LAYER + "ff.layer_1", "layers.{}.ffn.up"),
    **_linear(_XLNET_LAYER + "ff.layer_2", "layers.{}.ffn.down"),
}
_XLNET = Format(
    "transformer.", XLNET_ENCODER_KEYS,
    {"lm": {"lm_loss.bias": "lm_bias"},
     "sequence": {**_linear("sequence_summary.summary", "summary.dense"), **_linear("logits_proj", "classifier")},
     "token": _linear("classifier", "classifier"), "qa": _linear("qa_outputs", "qa")},
    ("lm_loss.weight",), "XLNet", pooler=False)

# model_type -> its mapping table: the one place the on-disk names of every architecture meet.
FORMATS: dict[str, Format] = {**_BERT_FAMILY, "modernbert": _MODERNBERT, "t5": _T5, "elmo": _ELMO, "xlnet": _XLNET}


WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"


class WeightsMismatchError(CheckpointError):
    """The weights' tensor names and the model's disagree; `missing` / `unexpected` hold them (bertkit names)."""

    def __init__(self, message: str, missing: list[str], unexpected: list[str]) -> None:
        super().__init__(message)
        self.missing, self.unexpected = missing, unexpected


class ShapeMismatchError(CheckpointError):
    """A tensor of the weights has another shape than the model built from config.json (`name`: the file's name)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class HeadMismatchError(CheckpointError):
    """The directory's heads are absent or do not fit the model asked for; `new_heads=True` starts fresh ones."""


def _compile(table: dict[str, str]) -> list[tuple[re.Pattern, str]]:
    return [(re.compile("^" + re.escape(src).replace(r"\{\}", r"(\d+)") + "$"), dst) for src, dst in table.items()]


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, template in rules:
        match = pattern.match(name)
        if match:
            return template.format(*match.groups())
    return None


def _invert(table: dict[str, str]) -> dict[str, str]:
    return {dst: src for src, dst in table.items()}


def architecture_name(model) -> str:
    """The transformers class name config.json gets for `model` in its family (BertForPreTraining for BERT,
    RobertaForMaskedLM for RoBERTa, ...)."""
    fmt = FORMATS[model.config.model_type]
    name = model.architecture
    return fmt.architectures.get(name) or (fmt.class_prefix + name[len("Bert"):] if name.startswith("Bert") else name)


def hf_to_bertkit(state: dict[str, torch.Tensor], head_family: str | None, encoder_prefix: str = "bert.",
                  source: str = "checkpoint", model_type: str = "bert",
                  ) -> tuple[dict[str, torch.Tensor], set[str], dict[str, str]]:
    """Rename a transformers state dict of family `model_type` to the bertkit names of a model with heads
    `head_family` (None: bare).

    Encoder tensors may carry the family prefix (`bert.`, `roberta.`, ...: task and pretraining models) or none (a
    bare encoder); they are given `encoder_prefix`. Returns the renamed tensors, the head families found in the
    file, and for each renamed tensor the name it had in the file (for error messages). Raises CheckpointError
    naming any tensor the tables do not know.
    """
    head_rules = _role_rules(model_type)[1]
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unknown: list[str] = []
    found: set[str] = set()
    for stored, tensor in state.items():
        role, name, families = _place(stored, model_type)
        if role == "unknown":
            unknown.append(stored)
        elif role == "encoder":
            out[encoder_prefix + name], origin[encoder_prefix + name] = tensor, stored
        elif role == "head":  # a head tensor may belong to several families ("pretraining" and "mlm")
            found.update(families)
            if head_family in families:
                target = _rename(name, head_rules[head_family])
                out[target], origin[target] = tensor, stored
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        raise CheckpointError(f"{source}: tensors that are not part of {with_article(label_of(model_type))} model: "
                              f"{shown}")
    return out, found, origin


def bertkit_to_hf(state: dict[str, torch.Tensor], head_family: str | None, encoder_prefix: str = "bert.",
                  model_type: str = "bert") -> dict[str, torch.Tensor]:
    """Rename a bertkit state dict to transformers names of family `model_type` (inverse of `hf_to_bertkit`)."""
    fmt = FORMATS[model_type]
    encoder_rules = _compile(_invert(fmt.encoder))
    if head_family and head_family not in fmt.heads:
        raise CheckpointError(f"the {label_of(model_type)} format has no {head_family!r} head; transformers has no "
                              f"such model")
    head_rules = _compile(_invert(fmt.heads[head_family])) if head_family else []
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == "mlm.word_embeddings.weight":  # the tied decoder: transformers re-ties it on load
            continue
        if name.startswith(encoder_prefix):
            target = _rename(name[len(encoder_prefix):], encoder_rules)
            if target is not None:
                out[(fmt.prefix if encoder_prefix else "") + target] = tensor
                continue
        target = _rename(name, head_rules)
        if target is None:
            raise CheckpointError(f"no transformers name for bertkit tensor {name!r} in the {label_of(model_type)} "
                              f"format")
        out[target] = tensor
    return out


# ------------------------------------------------------------------------------------------------------------------
# Reading and writing model directories
# ------------------------------------------------------------------------------------------------------------------
def read_weights(directory: Path, config: Any = None) -> dict[str, torch.Tensor]:
    """The state dict stored in a model directory, from safetensors or (weights only) a PyTorch .bin; a released
    ELMo's weights.hdf5 read as its `config` (the ElmoConfig its options.json makes) says."""
    safetensors_path, bin_path = directory / WEIGHTS_NAME, directory / LEGACY_WEIGHTS_NAME
    if safetensors_path.is_file():
        try:
            return load_file(str(safetensors_path))
        except Exception as err:  # safetensors raises its own error types for truncated or corrupt files
            raise CheckpointError(f"{safetensors_path}: cannot read weights ({err})") from None
    if bin_path.is_file():
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(f"{bin_path}: cannot read weights safely ({err})") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{bin_path}: expected a state dict, found {type(state).__name__}")
        return state
    if is_bilm_directory(directory) and config is not None:
        return read_bilm_weights(directory, config)
    raise CheckpointError(f"{directory}: no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME} in this model directory")


def load_model(cls, directory: str | os.PathLike, raw: dict[str, Any], config: Any, new_heads: bool = False,
               **model_kwargs: Any):
    """Build `cls` from a model directory, strictly, given its config.json as read (`raw`) and as its config class
    (`config`): `bertkit.models.ModelDir.load` reads them once and passes them down (every `from_pretrained` goes
    through it), so config.json is parsed once per load.

    A task model (classifier, QA, ...) loaded from a directory without its head starts that head fresh, as
    fine-tuning from a pretrained encoder needs; `BertForPreTraining` refuses a bare encoder unless
    `new_heads=True`. With `new_heads=True` a head present in the directory is also replaced by a fresh one (to
    fine-tune with a different number of labels, say).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a model directory")
    family, prefix = cls.head_family, cls.encoder_prefix
    fmt, label = FORMATS[config.model_type], label_of(config.model_type)
    if not isinstance(config, getattr(cls, "config_class", BertConfig)):  # a model class names its config class
        raise CheckpointError(f"{directory} holds {with_article(label)} model (model_type {config.model_type!r}), "
                              f"which {cls.__name__} cannot load")
    if family and family not in fmt.heads:
        raise CheckpointError(f"{directory}: {with_article(label)} model directory cannot hold a {cls.__name__} "
                              f"(transformers has no {label} model with a {family!r} head)")
    weights = read_weights(directory, config)
    if fmt.adapt is not None:
        config, weights = fmt.adapt(cls, config, weights, str(directory))
    state, found, origin = hf_to_bertkit(weights, family, prefix, source=str(directory), model_type=config.model_type)
    head_names = tuple(sorted({name.split(".")[0] + "." for name in fmt.heads[family].values()})) if family else ()
    if family and (family not in found or new_heads):
        if family not in found and cls.requires_pretrained_heads and not new_heads:
            stored = ", ".join(sorted({f"'{name.split('.')[0]}.*'" for name in fmt.heads[family]}))
            raise HeadMismatchError(
                f"{directory} holds no {family} heads ({stored}; found {sorted(found) or 'an encoder only'}); "
                f"load it with BertModel.from_pretrained, or pass new_heads=True to start fresh heads on it")
        state = {k: v for k, v in state.items() if not k.startswith(head_names)}
        found.discard(family)
    kwargs = {**cls.kwargs_from_config(raw), **model_kwargs} if family in found else dict(model_kwargs)
    if fmt.pooler and family is None and "add_pooler" not in kwargs and not any(k.startswith("pooler.") for k in state):
        kwargs["add_pooler"] = False  # the encoder of a token-classification or QA model has no pooler
    refuse_oversized(lambda: cls(config, **kwargs), str(directory / CONFIG_NAME))
    model = cls(config, **kwargs)
    # The pooler belongs to some heads only: a token classifier or QA model has none (drop it from the file), and
    # a sequence classifier built on a checkpoint without one starts it fresh, as transformers does.
    own = model.state_dict()
    pooler = prefix + "pooler."
    state = {k: v for k, v in state.items() if not k.startswith(pooler) or k in own}
    missing_ok = head_names if family not in found else fmt.fresh.get(family, ())
    if not any(k.startswith(pooler) for k in state) and family is not None:
        missing_ok = (*missing_ok, pooler)
    try:
        load_state_strict(model, state, source=str(directory), allow_missing=missing_ok, origin=origin)
    except ShapeMismatchError as err:
        # Blame the head only when the tensor that does not fit is one of the head's (an encoder tensor of the
        # wrong shape is a config.json / weights disagreement, whatever heads the file has).
        ours = next((k for k in state if origin.get(k, k) == err.name), err.name)
        if family in found and head_names and ours.startswith(head_names):
            raise HeadMismatchError(f"{err}. The head in {directory} does not fit the task (e.g. another number "
                                    f"of labels); pass new_heads=True to replace it with a fresh one") from None
        raise
    return model


def physical_memory() -> int | None:
    """This machine's RAM in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def refuse_oversized(build: Callable[[], torch.nn.Module], source: str) -> None:
    """Build the model `build` makes on the meta device (shapes only, no memory) and raise CheckpointError naming
    `source` when its parameters and buffers alone would not fit in this machine's RAM: a config with absurd sizes
    is refused before anything is allocated, instead of ending in an allocator error or the OOM killer."""
    limit = physical_memory()
    if limit is None:
        return
    try:
        with torch.device("meta"):
            model = build()
    except Exception:  # a model that cannot be built on the meta device is left to its real construction
        return
    tensors = list(model.parameters()) + list(model.buffers())
    need = sum(t.numel() * t.element_size() for t in tensors)
    if need > limit:
        config = getattr(model, "config", None)
        sizes = ", ".join(f"{k} {getattr(config, k)}" for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                                 "intermediate_size", "max_position_embeddings")
                          if hasattr(config, k))
        raise CheckpointError(f"{source}: this model would need {need / 2**30:,.1f} GiB for its weights alone, "
                              f"more than this machine's {limit / 2**30:,.1f} GiB of memory ({sizes})")


def load_state_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
                      allow_missing: tuple[str, ...] = (), origin: dict[str, str] | None = None) -> None:
    """Copy `state` into `model`, refusing unknown or missing tensors and shape mismatches (named, both shapes).

    allow_missing: name prefixes that may be absent from `state` (heads that start fresh).
    origin: bertkit name -> the name in the file, so that errors speak of what the user can see.
    """
    origin = origin or {}
    own = model.state_dict()
    tied = {"mlm.word_embeddings.weight"}
    missing = [k for k in own if k not in state and k not in tied and not k.startswith(allow_missing)]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise WeightsMismatchError(f"{source}: weights do not match the model: missing {missing[:8]}, "
                                   f"unexpected {unexpected[:8]}", missing, unexpected)
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ShapeMismatchError(f"{source}: tensor {origin.get(name, name)!r} has shape {tuple(tensor.shape)} "
                                     f"in the weights but {tuple(own[name].shape)} in the model built from "
                                     f"config.json", origin.get(name, name))
    state = {name: _float_weights(tensor, own[name].dtype, origin.get(name, name), source)
             for name, tensor in state.items()}
    model.load_state_dict(state, strict=False)


def _float_weights(tensor: torch.Tensor, want: torch.dtype, name: str, source: str) -> torch.Tensor:
    """A stored tensor as the model's dtype: floating point of any width converts (fp16 / bf16 / fp64 -> fp32);
    integer, bool or complex values where the model holds floats are refused, naming the tensor (copying them
    would silently turn a foreign or damaged file into weights)."""
    if not want.is_floating_point or tensor.dtype == want:
        return tensor
    if tensor.is_floating_point():
        return tensor.to(want)
    raise CheckpointError(f"{source}: tensor {name!r} has dtype {str(tensor.dtype).replace('torch.', '')}; "
                          f"weights must be floating point (float32, float16 or bfloat16)")


def save_model(model, directory: str | os.PathLike, tokenizer=None,
               extra_files: dict[str, bytes] | None = None) -> None:
    """Write `model` as a transformers-compatible model directory, atomically (a crash leaves the old one intact).

    extra_files: relative path -> content, written inside the directory too (a sentence-transformers pipeline's
    module files, `bertkit.sentence`)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    hf_state = bertkit_to_hf(state, model.head_family, model.encoder_prefix, model_type=model.config.model_type)
    # A plain mkdir, not tempfile.mkdtemp (0700): the directory gets the permissions the user's umask gives.
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    # A full device anywhere below: the staging folder is removed and DiskFullError names the directory and the
    # bytes the weights need.
    with disk_full_as_error(directory, _tensor_bytes(hf_state), temporaries=(staging,)):
        staging.mkdir()
        try:
            save_file(hf_state, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
            model.config.to_json_file(staging / CONFIG_NAME, architectures=[architecture_name(model)],
                                      extra=model.config_extras())
            if tokenizer is not None:
                tokenizer.save(staging)
            elif directory.is_dir():  # keep the tokenizer files a previous save (or transformers) put there
                for name in TOKENIZER_FILES:
                    if (directory / name).is_file():
                        shutil.copy2(directory / name, staging / name)
            for name, payload in (extra_files or {}).items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(payload)
            # safetensors creates its file 0600; give it the mode config.json got from a plain open().
            shutil.copymode(staging / CONFIG_NAME, staging / WEIGHTS_NAME)
            for path in (p for p in staging.rglob("*") if p.is_file()):
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
            _replace_directory(staging, directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _replace_directory(staging: Path, directory: Path) -> None:
    """Move `staging` into place as `directory`; the old directory survives until the new one is complete."""
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
        os.replace(staging, directory)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, directory)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside DDP / FSDP / torch.compile wrappers, so no wrapper prefix is ever written."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


# ------------------------------------------------------------------------------------------------------------------
# What each stored tensor is (for `bertkit info`): the family tables above, read without building a model
# ------------------------------------------------------------------------------------------------------------------
def tensor_role(name: str, model_type: str = "bert") -> tuple[str, tuple[str, ...]]:
    """What the tensor stored under transformers' `name` is in a `model_type` directory.

    Returns ("encoder", ()), ("head", the head families whose table has it, e.g. ("mlm", "pretraining") for
    BERT's cls.predictions.*), ("redundant", ()) for buffers and tied copies `hf_to_bertkit` drops, or
    ("unknown", ()) for a name no table of the family knows. TF-era LayerNorm gamma/beta count as weight/bias.
    """
    role, _, families = _place(name, model_type)
    return role, families


def _place(name: str, model_type: str) -> tuple[str, str, tuple[str, ...]]:
    """(role, name, head families) of a stored tensor as `tensor_role` says them; the name is ours (without the
    encoder prefix) for an encoder tensor, else the stored one with TF-era LayerNorm suffixes renamed."""
    fmt = FORMATS[model_type]
    encoder_rules, head_rules = _role_rules(model_type)
    for old, new in _LEGACY_SUFFIXES:
        if name.endswith(old) and "LayerNorm" in name:
            name = name[: -len(old)] + new
    bare = name[len(fmt.prefix):] if name.startswith(fmt.prefix) else name
    if bare in fmt.redundant or name in fmt.redundant:
        return "redundant", name, ()
    ours = _rename(bare, encoder_rules)
    if ours is not None:
        return "encoder", ours, ()
    families = tuple(sorted(family for family, rules in head_rules.items() if _rename(name, rules) is not None))
    return ("head" if families else "unknown"), name, families


_ROLE_RULES: dict[str, tuple[list, dict[str, list]]] = {}


def _role_rules(model_type: str) -> tuple[list, dict[str, list]]:
    """The compiled encoder and head tables of a family, compiled once (a directory has hundreds of tensors)."""
    if model_type not in _ROLE_RULES:
        fmt = FORMATS[model_type]
        _ROLE_RULES[model_type] = (_compile(fmt.encoder),
                                   {family: _compile(table) for family, table in fmt.heads.items()})
    return _ROLE_RULES[model_type]


# ------------------------------------------------------------------------------------------------------------------
# Resume state: what only `--resume` reads (optimizer, schedule position, RNG, data position), never a model dir
# ------------------------------------------------------------------------------------------------------------------
RESUME_DIR = "checkpoints"  # run_dir/checkpoints/step-00001000.pt, ...
_RESUME_NAME = re.compile(r"^step-(\d{8})\.pt$")


def resume_state_path(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the resume state after optimizer step `step` lives: run_dir/checkpoints/step-{step:08d}.pt."""
    return Path(run_dir) / RESUME_DIR / f"step-{step:08d}.pt"


def resume_state_step(path: str | os.PathLike) -> int:
    """The optimizer step a resume-state file was written after (step-00001000.pt -> 1000); ValueError otherwise."""
    match = _RESUME_NAME.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: not a resume-state file name (step-NNNNNNNN.pt)")
    return int(match.group(1))


def _resume_files(folder: Path) -> list[Path]:
    """The resume-state files in `folder`, oldest step first (the zero-padded names sort by step)."""
    return sorted(p for p in folder.glob("step-*.pt") if _RESUME_NAME.match(p.name)) if folder.is_dir() else []


def rng_state() -> dict[str, Any]:
    """This process's random states (Python, NumPy's global, torch CPU and every CUDA device), as tensors and
    plain values that `torch.load(weights_only=True)` reads back."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # The (624,) uint32 Mersenne Twister key as an int64 tensor: weights-only loading accepts no numpy arrays.
    state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (the CUDA states only where CUDA is available)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest resume-state file of a run (highest step), or None when the run has none."""
    found = _resume_files(Path(run_dir) / RESUME_DIR)
    return found[-1] if found else None


def save_checkpoint(path: Path, state: dict[str, Any], keep_last: int) -> None:
    """torch.save `state` to `path` atomically (temporary file, fsync, rename: a crash leaves the previous
    checkpoint intact), then delete all but the `keep_last` newest step-*.pt files beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    # A full device: the temporary file is removed and DiskFullError names the file and the bytes it needs.
    with disk_full_as_error(path, _tensor_bytes(state), temporaries=(tmp,)):
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)
    for stale in _resume_files(path.parent)[:-keep_last]:
        stale.unlink(missing_ok=True)


def _tensor_bytes(value: Any) -> int:
    """The bytes of every tensor in a nested dict / list / tuple: about what torch.save writes."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A resume state written by `save_checkpoint`, read with weights_only=True (tensors and plain values only).

    Raises CheckpointError (a ValueError) naming the file when it is torn, foreign or holds pickled objects.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a torn or foreign file: say which
        raise CheckpointError(f"{path}: not a readable bertkit checkpoint ({err})") from None


# ------------------------------------------------------------------------------------------------------------------
# Released ELMo models: allenai/bilm-tf's options.json + weights.hdf5 (what AllenNLP's Elmo reads)
# ------------------------------------------------------------------------------------------------------------------
def _gates_tf_to_torch(w: np.ndarray, cells: int) -> np.ndarray:
    """Rows of (4H, ...) gate weights from TF's LSTMCell order (i, j, f, o) to torch's (i, f, g, o): j is the
    candidate (torch's g), so the second and third blocks swap."""
    i, j, f, o = np.split(w, 4, axis=0)  # each (cells, ...)
    return np.concatenate([i, f, j, o], axis=0)


def read_bilm_weights(directory: str | os.PathLike, config: ElmoConfig) -> dict[str, torch.Tensor]:
    """A released ELMo's weights.hdf5 as the state dict of bertkit's ElmoModel (its names on disk), `config` the
    ElmoConfig its options.json makes (`bertkit.models.modeldir.bilm_config`).

    bilm-tf's datasets -> bertkit:
      char_embed (n_characters - 1, E)        char_cnn.embedding.weight, a zero row 0 first (a padding word)
      CNN/W_cnn_{i} (1, w, E, n), b_cnn_{i}   char_cnn.convs.{i}: (n, E, w) for Conv1d
      CNN_high_{k}/W_carry, b_carry,          char_cnn.highways.{k}.linear: [W_transform; -W_carry] and
        W_transform, b_transform                [b_transform; -b_carry] (bilm-tf's carry gate c multiplies the
                                                transform: c relu(...) + (1 - c) x; ours g = 1 - c = sigmoid(-...))
      CNN_proj/W_proj (n, P), b_proj          char_cnn.projection (identity when absent: bilm-tf has none when the
                                                filters add up to P)
      RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0 (D + P, 4H), B (4H), W_P_0 (H, P)
                                              bilm.{forward,backward}_layers.{l}.lstm (d 0 forward, 1 backward):
                                                W_0 split into input and recurrent halves, gates reordered from TF's
                                                (i, j, f, o) to torch's (i, f, g, o); B with TF LSTMCell's forget
                                                bias 1.0 added; weight_hr = W_P_0^T
    h5py reads the file as data. A missing dataset or a shape that disagrees with options.json is a CheckpointError
    naming the file and the dataset; a missing h5py is one line naming the extra to install."""
    try:  # optional: the elmo extra (a released ELMo's weights are HDF5)
        import h5py
    except ImportError:
        raise CheckpointError(f"{Path(directory) / BILM_WEIGHTS}: reading a released ELMo needs h5py: "
                              f"pip install 'bertkit[elmo]'") from None
    path = Path(directory) / BILM_WEIGHTS
    P, H = config.projection_dim, config.lstm_dim

    try:
        fin = h5py.File(path, "r")
    except OSError as err:
        raise CheckpointError(f"{path}: not an HDF5 file ({err})") from None

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in fin or not isinstance(fin[name], h5py.Dataset):
            raise CheckpointError(f"{path}: no dataset {name!r}")
        value = np.asarray(fin[name][...], dtype=np.float32)
        if value.shape != shape:
            raise CheckpointError(f"{path}: {name} has shape {tuple(value.shape)}, options.json makes it {shape}")
        return value

    out: dict[str, np.ndarray] = {}
    with fin:
        chars = get("char_embed", (config.char_vocab_size - 1, config.char_embedding_dim))
        out["char_cnn.embedding.weight"] = np.concatenate([np.zeros_like(chars[:1]), chars])
        E = config.char_embedding_dim
        for i, (width, count) in enumerate(config.filters):
            w = get(f"CNN/W_cnn_{i}", (1, width, E, count))
            out[f"char_cnn.convs.{i}.weight"] = w[0].transpose(2, 1, 0)  # (count, E, width)
            out[f"char_cnn.convs.{i}.bias"] = get(f"CNN/b_cnn_{i}", (count,))
        n = config.cnn_dim
        for k in range(config.num_highway):
            group = f"CNN_high_{k}"
            out[f"char_cnn.highways.{k}.linear.weight"] = np.concatenate(
                [get(f"{group}/W_transform", (n, n)).T, -get(f"{group}/W_carry", (n, n)).T])
            out[f"char_cnn.highways.{k}.linear.bias"] = np.concatenate(
                [get(f"{group}/b_transform", (n,)), -get(f"{group}/b_carry", (n,))])
        if n == P and "CNN_proj" not in fin:
            out["char_cnn.projection.weight"], out["char_cnn.projection.bias"] = np.eye(P, dtype=np.float32), \
                np.zeros(P, dtype=np.float32)
        else:
            out["char_cnn.projection.weight"] = get("CNN_proj/W_proj", (n, P)).T
            out["char_cnn.projection.bias"] = get("CNN_proj/b_proj", (P,))
        projected = P < H
        out_dim = P if projected else H
        for d, side in enumerate(("forward", "backward")):
            for layer in range(config.num_layers):
                group = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
                ours = f"bilm.{side}_layers.{layer}.lstm"
                w = get(f"{group}/W_0", (P + out_dim, 4 * H)).T  # (4H, input + recurrent)
                out[f"{ours}.weight_ih_l0"] = _gates_tf_to_torch(w[:, :P], H)
                out[f"{ours}.weight_hh_l0"] = _gates_tf_to_torch(w[:, P:], H)
                bias = get(f"{group}/B", (4 * H,)).copy()
                bias[2 * H:3 * H] += 1.0  # TF's LSTMCell adds forget_bias=1.0 to f at run time, not to B
                out[f"{ours}.bias_ih_l0"] = _gates_tf_to_torch(bias, H)
                out[f"{ours}.bias_hh_l0"] = np.zeros(4 * H, dtype=np.float32)
                if projected:
                    out[f"{ours}.weight_hr_l0"] = get(f"{group}/W_P_0", (H, P)).T
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
