"""Model directories and training-state checkpoints.

A *model directory* is what every verb consumes and what transformers reads: `config.json` (transformers' fields
of the model's family), `model.safetensors` (transformers' parameter names) and the tokenizer files (`vocab.txt`,
or `vocab.json` + `merges.txt`, ...). Our modules have short names of their own; one `Format` per family (BERT,
RoBERTa, ALBERT, ELECTRA, DistilBERT) maps transformers' names to ours, one row per tensor with `{}` standing for
the layer index, and its inverse is derived from it. Loading is strict: an unknown tensor, a missing tensor or a
shape that disagrees with config.json is an error that names the tensor.

Weights are data, never code: `.safetensors` is read with safetensors and a legacy `pytorch_model.bin` with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bertkit.config import BertConfig

# transformers name (without the "bert." prefix for encoder tensors) -> bertkit name; "{}" is the layer index.
ENCODER_KEYS: dict[str, str] = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "encoder.layer.{}.attention.self.query.weight": "layers.{}.attn.query.weight",
    "encoder.layer.{}.attention.self.query.bias": "layers.{}.attn.query.bias",
    "encoder.layer.{}.attention.self.key.weight": "layers.{}.attn.key.weight",
    "encoder.layer.{}.attention.self.key.bias": "layers.{}.attn.key.bias",
    "encoder.layer.{}.attention.self.value.weight": "layers.{}.attn.value.weight",
    "encoder.layer.{}.attention.self.value.bias": "layers.{}.attn.value.bias",
    "encoder.layer.{}.attention.output.dense.weight": "layers.{}.attn.out.weight",
    "encoder.layer.{}.attention.output.dense.bias": "layers.{}.attn.out.bias",
    "encoder.layer.{}.attention.output.LayerNorm.weight": "layers.{}.attn.norm.weight",
    "encoder.layer.{}.attention.output.LayerNorm.bias": "layers.{}.attn.norm.bias",
    "encoder.layer.{}.intermediate.dense.weight": "layers.{}.ffn.up.weight",
    "encoder.layer.{}.intermediate.dense.bias": "layers.{}.ffn.up.bias",
    "encoder.layer.{}.output.dense.weight": "layers.{}.ffn.down.weight",
    "encoder.layer.{}.output.dense.bias": "layers.{}.ffn.down.bias",
    "encoder.layer.{}.output.LayerNorm.weight": "layers.{}.ffn.norm.weight",
    "encoder.layer.{}.output.LayerNorm.bias": "layers.{}.ffn.norm.bias",
    "pooler.dense.weight": "pooler.dense.weight",
    "pooler.dense.bias": "pooler.dense.bias",
}
# Heads, by family: transformers name -> bertkit name (top-level names on both sides). A model class declares
# which family it has (`head_family`); tensors of the other families are dropped on load (a pretraining
# checkpoint's MLM head when fine-tuning, say), anything else unknown is an error.
HEAD_KEYS: dict[str, dict[str, str]] = {
    "pretraining": {
        "cls.predictions.transform.dense.weight": "mlm.dense.weight",
        "cls.predictions.transform.dense.bias": "mlm.dense.bias",
        "cls.predictions.transform.LayerNorm.weight": "mlm.norm.weight",
        "cls.predictions.transform.LayerNorm.bias": "mlm.norm.bias",
        "cls.predictions.bias": "mlm.bias",
        "cls.seq_relationship.weight": "nsp.weight",
        "cls.seq_relationship.bias": "nsp.bias",
    },
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


def _linear(theirs: str, ours: str) -> dict[str, str]:
    """The weight and bias rows of one Linear or LayerNorm."""
    return {f"{theirs}.weight": f"{ours}.weight", f"{theirs}.bias": f"{ours}.bias"}


def _embedding_keys(layernorm: str = "LayerNorm") -> dict[str, str]:
    return {"embeddings.word_embeddings.weight": "embeddings.word.weight",
            "embeddings.position_embeddings.weight": "embeddings.position.weight",
            "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
            **_linear(f"embeddings.{layernorm}", "embeddings.norm")}


# RoBERTa: BERT's encoder names; the LM head is lm_head.* (decoder tied to the word embeddings, bias lm_head.bias).
_ROBERTA_LM = {**_linear("lm_head.dense", "mlm.dense"), **_linear("lm_head.layer_norm", "mlm.norm"),
               "lm_head.bias": "mlm.bias"}
# ALBERT: one layer per group (inner_group_num 1), so the group index is our weight-set index.
_ALBERT_LAYER = "encoder.albert_layer_groups.{}.albert_layers.0."
ALBERT_ENCODER_KEYS: dict[str, str] = {
    **_embedding_keys(),
    **_linear("encoder.embedding_hidden_mapping_in", "project"),
    **_linear(_ALBERT_LAYER + "attention.query", "layers.{}.attn.query"),
    **_linear(_ALBERT_LAYER + "attention.key", "layers.{}.attn.key"),
    **_linear(_ALBERT_LAYER + "attention.value", "layers.{}.attn.value"),
    **_linear(_ALBERT_LAYER + "attention.dense", "layers.{}.attn.out"),
    **_linear(_ALBERT_LAYER + "attention.LayerNorm", "layers.{}.attn.norm"),
    **_linear(_ALBERT_LAYER + "ffn", "layers.{}.ffn.up"),
    **_linear(_ALBERT_LAYER + "ffn_output", "layers.{}.ffn.down"),
    **_linear(_ALBERT_LAYER + "full_layer_layer_norm", "layers.{}.ffn.norm"),
    **_linear("pooler", "pooler.dense"),
}
_ALBERT_MLM = {**_linear("predictions.dense", "mlm.dense"), **_linear("predictions.LayerNorm", "mlm.norm"),
               "predictions.bias": "mlm.bias"}
# ELECTRA: BERT's layers, no pooler, the E -> H projection as embeddings_project.
ELECTRA_ENCODER_KEYS: dict[str, str] = {
    **{k: v for k, v in ENCODER_KEYS.items() if not k.startswith("pooler.")},
    **_linear("embeddings_project", "project"),
}
_ELECTRA_GENERATOR = {**_linear("generator_predictions.dense", "mlm.dense"),
                      **_linear("generator_predictions.LayerNorm", "mlm.norm"),
                      "generator_lm_head.bias": "mlm.bias"}
# DistilBERT: other names for the same post-LN layer; no token types, no pooler.
_DISTIL_LAYER = "transformer.layer.{}."
DISTILBERT_ENCODER_KEYS: dict[str, str] = {
    **{k: v for k, v in _embedding_keys().items() if "token_type" not in k},
    **_linear(_DISTIL_LAYER + "attention.q_lin", "layers.{}.attn.query"),
    **_linear(_DISTIL_LAYER + "attention.k_lin", "layers.{}.attn.key"),
    **_linear(_DISTIL_LAYER + "attention.v_lin", "layers.{}.attn.value"),
    **_linear(_DISTIL_LAYER + "attention.out_lin", "layers.{}.attn.out"),
    **_linear(_DISTIL_LAYER + "sa_layer_norm", "layers.{}.attn.norm"),
    **_linear(_DISTIL_LAYER + "ffn.lin1", "layers.{}.ffn.up"),
    **_linear(_DISTIL_LAYER + "ffn.lin2", "layers.{}.ffn.down"),
    **_linear(_DISTIL_LAYER + "output_layer_norm", "layers.{}.ffn.norm"),
}
_DISTIL_MLM = {**_linear("vocab_transform", "mlm.dense"), **_linear("vocab_layer_norm", "mlm.norm"),
               "vocab_projector.bias": "mlm.bias"}
_TASK_HEADS = {"classifier": HEAD_KEYS["classifier"], "qa": HEAD_KEYS["qa"]}
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
    label: str = "BERT"  # how error messages name the family


FORMATS: dict[str, Format] = {
    "bert": Format("bert.", ENCODER_KEYS, HEAD_KEYS, REDUNDANT_KEYS, "Bert"),
    "roberta": Format("roberta.", ENCODER_KEYS, {"pretraining": _ROBERTA_LM, "mlm": _ROBERTA_LM, **_TASK_HEADS},
                      (*_BUFFERS, "lm_head.decoder.weight", "lm_head.decoder.bias"), "Roberta",
                      {"BertForPreTraining": "RobertaForMaskedLM", "BertLMHeadModel": "RobertaForCausalLM"},
                      "RoBERTa"),
    "albert": Format("albert.", ALBERT_ENCODER_KEYS,
                     {"pretraining": {**_ALBERT_MLM, **_linear("sop_classifier.classifier", "nsp")},
                      "mlm": _ALBERT_MLM, **_TASK_HEADS},
                     (*_BUFFERS, "predictions.decoder.weight", "predictions.decoder.bias"), "Albert", label="ALBERT"),
    "electra": Format("electra.", ELECTRA_ENCODER_KEYS,
                      {"discriminator": {**_linear("discriminator_predictions.dense", "rtd.dense"),
                                         **_linear("discriminator_predictions.dense_prediction", "rtd.out")},
                       "pretraining": _ELECTRA_GENERATOR, "mlm": _ELECTRA_GENERATOR, **_TASK_HEADS},
                      (*_BUFFERS, "generator_lm_head.weight"), "Electra",
                      {"BertForPreTraining": "ElectraForMaskedLM", "BertForReplacedTokenDetection":
                       "ElectraForPreTraining", "BertLMHeadModel": "ElectraForCausalLM"}, "ELECTRA"),
    "distilbert": Format("distilbert.", DISTILBERT_ENCODER_KEYS,
                         {"pretraining": _DISTIL_MLM, "mlm": _DISTIL_MLM, "qa": HEAD_KEYS["qa"],
                          "classifier": HEAD_KEYS["classifier"]},
                         (*_BUFFERS, "vocab_projector.weight"), "DistilBert",
                         {"BertForPreTraining": "DistilBertForMaskedLM"}, "DistilBERT"),
}

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"
# Tokenizer files a re-save keeps when no tokenizer is given (WordPiece, then byte-level BPE).
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "tokenizer.json", "vocab.json", "merges.txt")


class CheckpointError(ValueError):
    """A model directory that cannot be loaded as asked; the message names the file or tensor."""


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
    fmt = FORMATS[model_type]
    encoder_rules = _compile(fmt.encoder)
    head_rules = {family: _compile(table) for family, table in fmt.heads.items()}
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unknown: list[str] = []
    found: set[str] = set()
    for name, tensor in state.items():
        stored = name
        for old, new in _LEGACY_SUFFIXES:
            if name.endswith(old) and "LayerNorm" in name:
                name = name[: -len(old)] + new
        bare = name[len(fmt.prefix):] if name.startswith(fmt.prefix) else name
        if bare in fmt.redundant or name in fmt.redundant:
            continue
        target = _rename(bare, encoder_rules)
        if target is not None:
            target = encoder_prefix + target
            out[target], origin[target] = tensor, stored
            continue
        # A head tensor may belong to several head families (the MLM head is in "pretraining" and "mlm").
        families = [family for family, rules in head_rules.items() if _rename(name, rules) is not None]
        if not families:
            unknown.append(stored)
            continue
        found.update(families)
        if head_family in families:
            target = _rename(name, head_rules[head_family])
            out[target], origin[target] = tensor, stored
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        article = "an" if fmt.label[0] in "AE" else "a"
        raise CheckpointError(f"{source}: tensors that are not part of {article} {fmt.label} model: {shown}")
    return out, found, origin


def bertkit_to_hf(state: dict[str, torch.Tensor], head_family: str | None, encoder_prefix: str = "bert.",
                  model_type: str = "bert") -> dict[str, torch.Tensor]:
    """Rename a bertkit state dict to transformers names of family `model_type` (inverse of `hf_to_bertkit`)."""
    fmt = FORMATS[model_type]
    encoder_rules = _compile(_invert(fmt.encoder))
    if head_family and head_family not in fmt.heads:
        raise CheckpointError(f"the {fmt.label} format has no {head_family!r} head; transformers has no such model")
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
            raise CheckpointError(f"no transformers name for bertkit tensor {name!r} in the {fmt.label} format")
        out[target] = tensor
    return out


# ------------------------------------------------------------------------------------------------------------------
# Reading and writing model directories
# ------------------------------------------------------------------------------------------------------------------
def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The state dict stored in a model directory, from safetensors or (weights only) a PyTorch .bin."""
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
    raise CheckpointError(f"{directory}: no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME} in this model directory")


def load_model(cls, directory: str | os.PathLike, new_heads: bool = False, **model_kwargs: Any):
    """Build `cls` from a model directory, strictly.

    A task model (classifier, QA, ...) loaded from a directory without its head starts that head fresh, as
    fine-tuning from a pretrained encoder needs; `BertForPreTraining` refuses a bare encoder unless
    `new_heads=True`. With `new_heads=True` a head present in the directory is also replaced by a fresh one (to
    fine-tune with a different number of labels, say).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a model directory")
    raw = read_config(directory)
    config = BertConfig.from_dict(raw, source=str(directory / CONFIG_NAME))
    family, prefix = cls.head_family, cls.encoder_prefix
    fmt = FORMATS[config.model_type]
    if family and family not in fmt.heads:
        raise CheckpointError(f"{directory}: a {fmt.label} model directory cannot hold a {cls.__name__} "
                              f"(transformers has no {fmt.label} model with a {family!r} head)")
    state, found, origin = hf_to_bertkit(read_weights(directory), family, prefix, source=str(directory),
                                         model_type=config.model_type)
    head_names = tuple(sorted({name.split(".")[0] + "." for name in fmt.heads[family].values()})) if family else ()
    if family and (family not in found or new_heads):
        if family not in found and cls.requires_pretrained_heads and not new_heads:
            stored = ", ".join(sorted({f"'{name.split('.')[0]}.*'" for name in fmt.heads[family]}))
            raise CheckpointError(
                f"{directory} holds no {family} heads ({stored}; found {sorted(found) or 'an encoder only'}); "
                f"load it with BertModel.from_pretrained, or pass new_heads=True to start fresh heads on it")
        state = {k: v for k, v in state.items() if not k.startswith(head_names)}
        found.discard(family)
    kwargs = {**cls.kwargs_from_config(raw), **model_kwargs} if family in found else dict(model_kwargs)
    if family is None and "add_pooler" not in kwargs and not any(k.startswith("pooler.") for k in state):
        kwargs["add_pooler"] = False  # the encoder of a token-classification or QA model has no pooler
    model = cls(config, **kwargs)
    # The pooler belongs to some heads only: a token classifier or QA model has none (drop it from the file), and
    # a sequence classifier built on a checkpoint without one starts it fresh, as transformers does.
    own = model.state_dict()
    pooler = prefix + "pooler."
    state = {k: v for k, v in state.items() if not k.startswith(pooler) or k in own}
    missing_ok = head_names if family not in found else ()
    if not any(k.startswith(pooler) for k in state) and family is not None:
        missing_ok = (*missing_ok, pooler)
    try:
        load_state_strict(model, state, source=str(directory), allow_missing=missing_ok, origin=origin)
    except CheckpointError as err:
        if family in found and any(k.startswith(head_names) for k in state) and "shape" in str(err):
            raise CheckpointError(f"{err}. The head in {directory} does not fit the task (e.g. another number "
                                  f"of labels); pass new_heads=True to replace it with a fresh one") from None
        raise
    return model


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
        raise CheckpointError(f"{source}: weights do not match the model: missing {missing[:8]}, "
                              f"unexpected {unexpected[:8]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise CheckpointError(f"{source}: tensor {origin.get(name, name)!r} has shape {tuple(tensor.shape)} in the weights but "
                                  f"{tuple(own[name].shape)} in the model built from config.json")
    model.load_state_dict(state, strict=False)


def save_model(model, directory: str | os.PathLike, tokenizer=None) -> None:
    """Write `model` as a transformers-compatible model directory, atomically (a crash leaves the old one intact)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    hf_state = bertkit_to_hf(state, model.head_family, model.encoder_prefix, model_type=model.config.model_type)
    # A plain mkdir, not tempfile.mkdtemp (0700): the directory gets the permissions the user's umask gives.
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        save_file(hf_state, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        model.config.to_json_file(staging / CONFIG_NAME, architectures=[architecture_name(model)],
                                  extra=model.config_extras())
        if tokenizer is not None:
            tokenizer.save(staging)
        elif directory.is_dir():  # keep tokenizer files a previous save put there
            for name in TOKENIZER_FILES:
                if (directory / name).is_file():
                    shutil.copy2(directory / name, staging / name)
        # safetensors creates its file 0600; give it the mode config.json got from a plain open().
        shutil.copymode(staging / CONFIG_NAME, staging / WEIGHTS_NAME)
        for path in staging.iterdir():
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


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """config.json of a model directory as a dict (for `bertkit info`)."""
    return json.loads((Path(directory) / CONFIG_NAME).read_text(encoding="utf-8"))
