"""Context extension: a model directory made ready for continued pretraining at a longer length (`bertkit
extend-context`): a learned position table grown (copied or interpolated), or a rotary model's length (and rope
theta) raised in its config.json; every other tensor, head and tokenizer file kept."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bertkit.checkpoint import CONFIG_NAME, LEGACY_WEIGHTS_NAME, WEIGHTS_NAME, config_from_dict, read_weights
from bertkit.models import ModelDir
from bertkit.models.registry import architecture_of

EXTEND_METHODS = ("copy", "interpolate")


def grown_position_table(table: torch.Tensor, positions: int, method: str = "copy", offset: int = 0) -> torch.Tensor:
    """A learned position table (P, E) grown to `positions` usable rows: (positions + offset, E).

    offset: rows before the learned positions that are not positions (RoBERTa's pad_token_id + 1); kept as they are.
    copy: the P - offset learned rows repeated one after the other (Longformer's initialisation, Beltagy et al. 2020):
        rows 0 .. P - 1 are unchanged, and every window of the new table looks like one the model learned (only at
        the seams does the position jump back).
    interpolate: the learned rows stretched over the new positions (position interpolation): new position i takes
        the linear blend of the learned rows either side of i x (P - offset - 1) / (positions - 1); the first and
        last rows are the learned first and last, neighbours grow more alike, and continued pretraining then has
        to tell them apart.
    """
    if method not in EXTEND_METHODS:
        raise ValueError(f"unknown extension method {method!r}; choose one of {', '.join(EXTEND_METHODS)}")
    head, learned = table[:offset], table[offset:]  # (offset, E), (P', E)
    P = learned.shape[0]
    if positions <= P:
        raise ValueError(f"the table already has {P} positions; give more than that")
    if method == "copy":
        rows = learned[torch.arange(positions) % P]  # (positions, E)
    else:
        x = torch.arange(positions, dtype=torch.float64) * (P - 1) / (positions - 1)  # (positions,) in [0, P - 1]
        low = x.floor().long().clamp(max=P - 1)
        high = (low + 1).clamp(max=P - 1)
        w = (x - low).to(learned.dtype)[:, None]  # (positions, 1)
        rows = learned[low] * (1 - w) + learned[high] * w
    return torch.cat([head, rows]).contiguous()


def _longer_rotary(raw: dict[str, Any], config, length: int, global_rope_theta: float | None,
                   model_dir: Path) -> None:
    """`extend_context` for rotary positions (ModernBERT): config.json's max_position_embeddings, and the global
    layers' rope theta when given, set in `raw`."""
    if length < config.max_position_embeddings:
        raise ValueError(f"{model_dir} already takes {config.max_position_embeddings} tokens "
                         f"(max_position_embeddings); give more")
    raw["max_position_embeddings"] = length
    if global_rope_theta is not None:
        raw["global_rope_theta"] = global_rope_theta
        if isinstance(raw.get("rope_parameters"), dict) and "full_attention" in raw["rope_parameters"]:
            raw["rope_parameters"] = {**raw["rope_parameters"], "full_attention": {
                **raw["rope_parameters"]["full_attention"], "rope_theta": global_rope_theta}}


def _grown_learned(raw: dict[str, Any], weights: dict[str, torch.Tensor], config, length: int, method: str,
                   model_dir: Path) -> None:
    """`extend_context` for a learned position table (the BERT family): every position table in `weights` grown to
    `length` rows (plus RoBERTa's offset rows) by `method`, the per-position buffers regrown, and `raw`'s
    max_position_embeddings set."""
    offset = config.max_position_embeddings - config.max_length  # RoBERTa's pad_token_id + 1 rows
    keys = [k for k in weights if k.endswith("embeddings.position_embeddings.weight")]
    if not keys:
        raise ValueError(f"{model_dir}: no position table (...embeddings.position_embeddings.weight) in the weights")
    for key in keys:
        if weights[key].shape[0] != config.max_position_embeddings:
            raise ValueError(f"{model_dir}: tensor {key!r} has {weights[key].shape[0]} rows but config.json "
                             f"says max_position_embeddings {config.max_position_embeddings}")
        weights[key] = grown_position_table(weights[key], length, method, offset)
    for key in [k for k in weights if k.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))]:
        # Buffers older writers stored, one entry per position: regrown as transformers makes them.
        grown = torch.arange(length + offset) if key.endswith("position_ids") else torch.zeros(length + offset)
        weights[key] = grown.to(weights[key].dtype)[None]
    raw["max_position_embeddings"] = length + offset


def _write_extended(model_dir: Path, out_dir: Path, raw: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """out_dir: model_dir's other files, config.json from `raw` and the weights; staged beside it and moved in
    whole once it loads (nothing is left behind on failure)."""
    staging = out_dir.with_name(f".{out_dir.name}.extend-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for path in model_dir.iterdir():  # tokenizer files, finetune.json, ...: everything but weights and config
            if path.is_file() and path.name not in (CONFIG_NAME, WEIGHTS_NAME, LEGACY_WEIGHTS_NAME):
                shutil.copy2(path, staging / path.name)
        (staging / CONFIG_NAME).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        # Tied tensors may share storage in a .bin file; safetensors wants each tensor on its own.
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, str(staging / WEIGHTS_NAME),
                  metadata={"format": "pt"})
        # The result must load: the encoder through bertkit's strict tables, at the new length.
        ModelDir.open(staging).load("encoder")
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def extend_context(model_dir: str | Path, max_position_embeddings: int, out_dir: str | Path, method: str = "copy",
                   global_rope_theta: float | None = None) -> dict[str, Any]:
    """Write `model_dir` as a model directory that takes inputs of `max_position_embeddings` tokens, to continue
    pretraining at that length (`bertkit pretrain --init-from OUT --max-seq-length N`).

    BERT family (learned absolute positions): the position table grows to N rows by `method` (see
    `grown_position_table`); every other tensor, every head and the tokenizer files are kept, and config.json says
    the new max_position_embeddings (RoBERTa's offset rows included). ModernBERT (rotary positions, no table): only
    config.json changes: its max_position_embeddings, and `global_rope_theta` when given (the paper's 8k stage
    raised it from 10,000 to 160,000). T5 (relative positions) has nothing to grow.

    out_dir must not exist or be empty; it is written completely or not at all. Returns {"model_type", "method",
    "positions_before", "positions_after"}.
    """
    source = ModelDir.open(model_dir)
    model_dir, out_dir = source.path, Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir}: exists and is not empty; give a new directory")
    raw, config = source.raw, source.config
    if not isinstance(max_position_embeddings, int) or max_position_embeddings < 1:
        raise ValueError(f"--max-position-embeddings must be a positive integer, got {max_position_embeddings!r}")
    weights = read_weights(model_dir)
    raw = dict(raw)
    positions = architecture_of(config).positions
    if positions == "rotary":
        before, after, method = config.max_position_embeddings, max_position_embeddings, "config"
        _longer_rotary(raw, config, after, global_rope_theta, model_dir)
        config_from_dict(raw, source=f"{out_dir / CONFIG_NAME}")  # what is written must read back
    elif positions == "learned":
        if global_rope_theta is not None:
            raise ValueError(f"--global-rope-theta is a ModernBERT setting; {model_dir} holds a {config.model_type} "
                             f"model with learned positions")
        before, after = config.max_length, max_position_embeddings
        _grown_learned(raw, weights, config, after, method, model_dir)
    else:
        raise ValueError(f"{model_dir} holds a {config.model_type} model, which has no absolute positions to extend")
    _write_extended(model_dir, out_dir, raw, weights)
    return {"model_type": config.model_type, "method": method, "positions_before": before, "positions_after": after,
            "out": str(out_dir)}
