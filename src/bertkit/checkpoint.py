"""Model directories and training-state checkpoints.

A *model directory* is what every verb consumes and what transformers reads: `config.json` (transformers' BERT
fields), `model.safetensors` (transformers' parameter names) and the tokenizer files (`vocab.txt`, ...).
Our modules have short names of their own; `BERT_KEYS` maps transformers' names to ours, one row per tensor with
`{}` standing for the layer index, and its inverse is derived from it. Loading is strict: an unknown tensor, a
missing tensor or a shape that disagrees with config.json is an error that names the tensor.

Weights are data, never code: `.safetensors` is read with safetensors and a legacy `pytorch_model.bin` with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
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
# Heads of BertForPreTraining (top-level names on both sides).
PRETRAINING_HEAD_KEYS: dict[str, str] = {
    "cls.predictions.transform.dense.weight": "mlm.dense.weight",
    "cls.predictions.transform.dense.bias": "mlm.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "mlm.norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "mlm.norm.bias",
    "cls.predictions.bias": "mlm.bias",
    "cls.seq_relationship.weight": "nsp.weight",
    "cls.seq_relationship.bias": "nsp.bias",
}
# Tensors some writers store that carry nothing of their own: buffers, and the decoder that is tied to the word
# embeddings (older transformers versions wrote it out). Dropped on load.
REDUNDANT_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# TF-era names for LayerNorm parameters, still found in old checkpoints.
_LEGACY_SUFFIXES = ((".gamma", ".weight"), (".beta", ".bias"))

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"


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


def hf_to_bertkit(state: dict[str, torch.Tensor], with_heads: bool,
                  source: str = "checkpoint") -> tuple[dict[str, torch.Tensor], bool, dict[str, str]]:
    """Rename a transformers state dict to bertkit names.

    Encoder tensors may carry the `bert.` prefix (task and pretraining models) or none (a bare BertModel).
    Returns the renamed encoder(+head) tensors, whether the pretraining heads were present, and for each
    renamed tensor the name it had in the file (for error messages).
    Raises CheckpointError naming any tensor the table does not know.
    """
    encoder_rules, head_rules = _compile(ENCODER_KEYS), _compile(PRETRAINING_HEAD_KEYS)
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unknown: list[str] = []
    has_heads = False
    for name, tensor in state.items():
        stored = name
        for old, new in _LEGACY_SUFFIXES:
            if name.endswith(old) and "LayerNorm" in name:
                name = name[: -len(old)] + new
        bare = name[len("bert."):] if name.startswith("bert.") else name
        if bare in REDUNDANT_KEYS or name in REDUNDANT_KEYS:
            continue
        target = _rename(bare, encoder_rules)
        if target is not None:
            target = ("bert." if with_heads else "") + target
            out[target], origin[target] = tensor, stored
            continue
        target = _rename(name, head_rules)
        if target is not None:
            has_heads = True
            if with_heads:
                out[target], origin[target] = tensor, stored
            continue
        unknown.append(stored)
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        raise CheckpointError(f"{source}: tensors that are not part of a BERT model: {shown}")
    return out, has_heads, origin


def bertkit_to_hf(state: dict[str, torch.Tensor], with_heads: bool) -> dict[str, torch.Tensor]:
    """Rename a bertkit state dict to transformers names (inverse of `hf_to_bertkit`)."""
    encoder_rules = _compile(_invert(ENCODER_KEYS))
    head_rules = _compile(_invert(PRETRAINING_HEAD_KEYS))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == "mlm.word_embeddings.weight":  # the tied decoder: transformers re-ties it on load
            continue
        bare = name[len("bert."):] if with_heads and name.startswith("bert.") else name
        target = _rename(bare, encoder_rules)
        if target is not None:
            out[("bert." if with_heads else "") + target] = tensor
            continue
        target = _rename(name, head_rules)
        if target is None:
            raise CheckpointError(f"no transformers name for bertkit tensor {name!r}")
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

    new_heads: when the checkpoint is a bare encoder and `cls` has heads, initialise the heads fresh instead of
    refusing (e.g. to continue pretraining from a sentence-embedding model).
    """
    from bertkit.modeling import BertModel

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a model directory")
    config = BertConfig.from_json_file(directory / CONFIG_NAME)
    with_heads = cls is not BertModel
    state, has_heads, origin = hf_to_bertkit(read_weights(directory), with_heads, source=str(directory))
    if with_heads and not has_heads and not new_heads:
        raise CheckpointError(
            f"{directory} holds only an encoder (no pretraining heads 'cls.*'); load it with "
            f"BertModel.from_pretrained, or pass new_heads=True to start fresh heads on top of it")
    model = cls(config, **model_kwargs)
    load_state_strict(model, state, source=str(directory), allow_missing=() if has_heads else ("mlm.", "nsp."),
                      origin=origin)
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
    from bertkit.modeling import BertModel

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    with_heads = not isinstance(model, BertModel)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    hf_state = bertkit_to_hf(state, with_heads)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        save_file(hf_state, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        model.config.to_json_file(staging / CONFIG_NAME, architectures=[model.architecture])
        if tokenizer is not None:
            tokenizer.save(staging)
        elif directory.is_dir():  # keep tokenizer files a previous save put there
            for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
                if (directory / name).is_file():
                    shutil.copy2(directory / name, staging / name)
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
