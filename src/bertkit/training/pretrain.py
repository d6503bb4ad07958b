"""Pretraining driver: prepared shards + a recipe -> model + objective -> the trainer -> RUN_DIR/model.

A recipe is a YAML (or JSON) file with four parts, each optional:

    preset: mini              # size preset of BertConfig (tiny, mini, small, medium, base, large)
    model: {hidden_dropout_prob: 0.1}      # BertConfig fields over the preset
    data: {objective: bert, max_seq_length: 128, batch_size: 32}   # DataConfig fields
    train: {learning_rate: 1.0e-4, max_steps: 100000}             # TrainConfig fields

Every field can also be set on the command line as `--field value` (or `--data.field value` to be explicit).
The resolved recipe is written beside the run as RUN_DIR/config.yaml.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from bertkit.checkpoint import RESUME_DIR, CheckpointError, latest_checkpoint, refuse_oversized
from bertkit.config import (FAMILIES, BertConfig, ElmoConfig, T5Config, check_finite, config_class_for, field_with_help,
                            presets_for)
from bertkit.data.instances import SpecialIds
from bertkit.data.lmstream import WordWindowStream, fixed_windows
from bertkit.data.loader import PretrainingStream, StreamOptions, fixed_batches
from bertkit.data.shards import ShardedCorpus
from bertkit.io import atomic_write, remove_stale_temporaries, writer_lock
from bertkit.models import ElmoLanguageModel, ModelDir, pretraining_class
from bertkit.models.registry import (ARCHITECTURES, OBJECTIVE_MODEL_TYPES, OBJECTIVES, architecture, architecture_of,
                                     objective)
from bertkit.tokenizers import load_tokenizer
# `bertkit extend-context`'s function, also at this module's path (the CLI's import)
from bertkit.training.extend_context import extend_context  # noqa: F401
from bertkit.training.objectives import build_pretraining, check_objective, evaluate_pretraining
from bertkit.training.trainer import (TrainConfig, TrainResult, end_distributed, seed_everything, setup_distributed,
                                      train)


_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)


@dataclass(frozen=True)
class DataConfig:
    """What the model sees: objective, instance creation, masking and batch size."""

    objective: str = _f("bert", ", ".join(  # one row of the objective table each
        f"{o.name} ({o.label}{f'; a {architecture(o.implies).label}' if o.implies else ''})" for o in OBJECTIVES.values()))
    max_seq_length: int = _f(128, "tokens per instance, [CLS]/[SEP] included (t5: the corrupted input, EOS "
                                  "included)")
    short_seq_prob: float = _f(0.1, "fraction of NSP/SOP instances with a shorter random target length")
    mask_prob: float = _f(0.15, "fraction of (non-special) tokens to predict (t5: the noise density)")
    max_predictions_per_seq: int = _f(20, "cap on predicted tokens per instance (20 at 128, 80 at 512)")
    whole_word_masking: bool = _f(False, "mask all pieces of a word together")
    isolate_documents: bool = _f(False, "packed rows (roberta, causal): attention stays within each document and "
                                        "positions restart at its first token")
    masking: str = _f("dynamic", "dynamic (a fresh mask each time, RoBERTa) or static (dupe_factor fixed copies)")
    dupe_factor: int = _f(10, "masked copies of each instance with static masking")
    batch_size: int = _f(256, "sequences per micro-batch on each rank; global batch = this x ranks x accumulation")
    eval_instances: int = _f(2000, "held-out instances evaluated (from the prepared eval split)")
    sparse_prediction: bool = _f(True, "run the vocabulary projection only on masked positions (same loss)")
    rtd_weight: float = _f(50.0, "ELECTRA: weight of the discriminator loss against the generator's MLM loss")
    generator_fraction: float = _f(0.25, "ELECTRA: generator hidden size as a fraction of the discriminator's")
    mean_noise_span_length: float = _f(3.0, "T5: mean length of a corrupted span")
    partial_k: int = _f(7, "XLNet: predict about 1/K of the tokens, each span with (K - 1) x its length of context "
                           "(the paper's K = 7); max_predictions_per_seq is the exact count")
    workers: int | None = _f(None, "processes that make the batches beside the training process (0: in it, by a "
                                   "background thread); default: up to 4 per GPU, 0 on the CPU. The batches are "
                                   "the same whatever the number")
    lstm_state: str = _f("carry", "elmo: carry the forward LSTMs' state from one batch of word windows to the next "
                                  "(the lanes continue, as bilm-tf trains) or reset it every batch")

    def __post_init__(self) -> None:
        check_finite(self, ("short_seq_prob", "mask_prob", "rtd_weight", "generator_fraction",
                            "mean_noise_span_length"))
        objective(self.objective)  # a row of the objective table
        if self.masking not in ("dynamic", "static"):
            raise ValueError(f"masking must be dynamic or static, got {self.masking!r}")
        for name, ok, rule in _DATA_RANGES:
            if not ok(getattr(self, name)):
                raise ValueError(f"{name} must {rule}, got {getattr(self, name)}")


# DataConfig's ranges: (field, the test its value passes, what the error says it must).
_DATA_RANGES = (
    ("mask_prob", lambda v: 0.0 < v < 1.0, "be in (0, 1)"),
    ("short_seq_prob", lambda v: 0.0 <= v <= 1.0, "be in [0, 1]"),
    ("batch_size", lambda v: v >= 1, "be at least 1"),
    ("max_seq_length", lambda v: v >= 8, "be at least 8"),
    ("max_predictions_per_seq", lambda v: v >= 1, "be at least 1"),  # 0 would mask nothing: nothing learnt
    ("dupe_factor", lambda v: v >= 1, "be at least 1"),
    ("eval_instances", lambda v: v >= 0, "not be negative"),
    ("workers", lambda v: v is None or v >= 0, "not be negative"),
    ("rtd_weight", lambda v: v >= 0, "not be negative"),
    ("generator_fraction", lambda v: 0.0 < v <= 1.0, "be in (0, 1]"),
    ("mean_noise_span_length", lambda v: v > 0, "be positive"),
)


def model_type_of(model: dict[str, Any], objective: str) -> str | None:
    """The model_type a recipe builds: its model section's, else the one its objective implies (`--objective t5`
    alone builds a T5: OBJECTIVE_MODEL_TYPES, from the architecture table); None: BERT's."""
    return model.get("model_type") or OBJECTIVE_MODEL_TYPES.get(objective)


# The recipe `bertkit pretrain` runs without --config, and what PretrainConfig() holds: one file is the default, so
# the command line, the help text and the Python API cannot drift apart (TrainConfig's own defaults, the BERT-base
# paper's 1e-4 with 10,000 warm-up steps, apply only to fields a recipe leaves out).
DEFAULT_RECIPE = "mini"


@functools.cache
def default_config() -> PretrainConfig:
    """The default recipe (DEFAULT_RECIPE) resolved: what `bertkit pretrain` runs without --config."""
    return resolve_config(DEFAULT_RECIPE)


@dataclass(frozen=True)
class PretrainConfig:
    """A whole pretraining recipe. A section left out comes from the default recipe (`default_config()`), so
    `PretrainConfig()` is what `bertkit pretrain` runs without --config."""

    preset: str = field(default_factory=lambda: default_config().preset)
    model: dict[str, Any] = field(default_factory=lambda: dict(default_config().model))
    data: DataConfig = field(default_factory=lambda: default_config().data)
    train: TrainConfig = field(default_factory=lambda: default_config().train)

    def __post_init__(self) -> None:
        model_type = model_type_of(self.model, self.data.objective)
        if self.data.lstm_state not in ("carry", "reset"):
            raise ValueError(f"lstm_state must be carry or reset, got {self.data.lstm_state!r}")
        check_objective(self.data.objective, model_type)
        presets = presets_for(model_type)  # ModernBERT has presets and config fields of its own
        if self.preset not in presets:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(presets)}")
        known = {f.name for f in dataclasses.fields(config_class_for(model_type))} | {"model_type"}
        unknown = sorted(set(self.model) - known)
        if unknown:
            raise ValueError(f"unknown model fields {unknown}")

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "model": dict(self.model), "data": dataclasses.asdict(self.data),
                "train": dataclasses.asdict(self.train)}


# ------------------------------------------------------------------------------------------------------------------
# Recipes and overrides
# ------------------------------------------------------------------------------------------------------------------
def recipe_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("bertkit.recipes").iterdir() if p.name.endswith(".yaml"))


def load_recipe(name_or_path: str | Path | None) -> dict[str, Any]:
    """A recipe as a dict: a file path, or the name of a built-in recipe (see `recipe_names()`); None is the
    default recipe (DEFAULT_RECIPE)."""
    if name_or_path is None:
        name_or_path = DEFAULT_RECIPE
    path = Path(name_or_path)
    if not path.is_file():
        builtin = resources.files("bertkit.recipes") / f"{name_or_path}.yaml"
        if not builtin.is_file():
            raise FileNotFoundError(f"{name_or_path}: no such recipe file or built-in recipe "
                                    f"(built-in: {', '.join(recipe_names())})")
        text = builtin.read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{name_or_path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name_or_path}: a recipe must be a mapping")
    unknown = sorted(set(data) - {"preset", "model", "data", "train"})
    if unknown:
        raise ValueError(f"{name_or_path}: unknown recipe sections {unknown} (expected preset, model, data, train)")
    return data


def _convert(value: Any, annotation: Any, key: str) -> Any:
    """Turn a command-line string into the type a dataclass field declares."""
    if not isinstance(value, str):
        return value
    hint = annotation if not isinstance(annotation, str) else eval(annotation, vars(typing))  # noqa: S307
    args = typing.get_args(hint)
    if value.lower() in ("none", "null") and type(None) in args:
        return None
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in args if a is not type(None))
    try:
        if hint is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(float(value)) if "e" in value.lower() else int(value)
        if hint is float:
            return float(value)
    except ValueError:
        raise ValueError(f"--{key}: {value!r} is not a valid {getattr(hint, '__name__', hint)}") from None
    return value


def field_help() -> dict[str, list[tuple[str, Any, str]]]:
    """Every settable field by section: (name, default, help), for `bertkit pretrain --help`. The data and train
    defaults are the default recipe's (what runs without --config), the model's are the config class's."""
    out: dict[str, list[tuple[str, Any, str]]] = {}
    default = default_config()
    # One model section per config class, named by the architectures that read it and how a recipe picks them.
    models = {}
    for row in ARCHITECTURES.values():
        models.setdefault(row.config_class, []).append(row)
    sections = [("data", DataConfig), ("train", TrainConfig)]
    for cls, rows in models.items():
        if cls is BertConfig:
            sections.append(("model", cls))
            continue
        how = f"objective {rows[0].implied_by}" if rows[0].implied_by else f"model_type {rows[0].name}"
        sections.append((f"model ({', '.join(r.name for r in rows)}: {how})", cls))
    for section, cls in sections:
        values = {"data": default.data, "train": default.train}.get(section)
        out[section] = [(f.name, getattr(values, f.name) if values is not None else f.default,
                         f.metadata.get("help", "")) for f in dataclasses.fields(cls)]
    return out


def resolve_config(recipe: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """Recipe file (or built-in name; None: the default recipe, DEFAULT_RECIPE) + overrides -> a validated
    PretrainConfig.

    overrides: {"field": value} or {"section.field": value}; a bare field name is looked up in data, train and
    model (BertConfig) in that order; "preset" sets the size preset.
    """
    data = load_recipe(recipe)
    sections: dict[str, dict[str, Any]] = {s: dict(data.get(s) or {}) for s in ("model", "data", "train")}
    preset = data.get("preset", "mini")
    given = overrides or {}
    objective = given.get("data.objective", given.get("objective", sections["data"].get("objective", "bert")))
    model_type = model_type_of(sections["model"], objective)  # `--objective t5` alone: T5Config's fields
    fields = {"data": {f.name: f for f in dataclasses.fields(DataConfig)},
              "train": {f.name: f for f in dataclasses.fields(TrainConfig)},
              "model": {f.name: f for f in dataclasses.fields(config_class_for(model_type))}}
    for key, value in (overrides or {}).items():
        if key == "preset":
            preset = value
            continue
        section, _, name = key.rpartition(".")
        candidates = [section] if section else [s for s in ("data", "train", "model") if name in fields[s]]
        if not candidates or candidates[0] not in fields or name not in fields[candidates[0]]:
            raise ValueError(f"unknown setting --{key}; see `bertkit pretrain --help` for the list")
        target = candidates[0]
        sections[target][name] = _convert(value, fields[target][name].type, key)
    for section in ("data", "train"):
        unknown = sorted(set(sections[section]) - set(fields[section]))
        if unknown:
            raise ValueError(f"unknown {section} fields {unknown}")
    return PretrainConfig(preset=preset, model=sections["model"], data=DataConfig(**sections["data"]),
                          train=TrainConfig(**sections["train"]))


# ------------------------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------------------------
def random_token_ids(tokenizer) -> np.ndarray:
    """Ids a masked position may be replaced by: every real token (no special tokens, nor WordPiece's [unusedN]
    slots; a byte-level BPE piece such as "[x]" is real text)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.special_ids)
    wordpiece = getattr(tokenizer, "kind", "wordpiece") == "wordpiece"
    return np.array(sorted(i for t, i in vocab.items()
                           if i not in special and not (wordpiece and t.startswith("[") and t.endswith("]"))),
                    dtype=np.int64)


def stream_options(data: DataConfig, tokenizer=None, source: str | Path = "the tokenizer",
                   model: dict[str, Any] | None = None):
    """The loader's `StreamOptions` for a recipe's data section: the objective's instances, lengths, masking,
    document isolation and static copies. Pretraining and MLM distillation both read their stream through this.

    Span corruption (objective t5) takes its sentinels from `tokenizer` (`source` names it in errors).
    """
    instances = objective(data.objective).instances
    spans = {}
    if instances == "xlnet":
        spans = xlnet_stream_fields(data, tokenizer, source, model or {})
    elif instances == "spans":
        spans = dict(noise_density=data.mask_prob, mean_noise_span_length=data.mean_noise_span_length,
                     **span_sentinels(tokenizer, source))
    options = dict(instances=instances, max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob,
                   mask_prob=data.mask_prob, max_predictions_per_seq=data.max_predictions_per_seq,
                   whole_word_masking=data.whole_word_masking, isolate_documents=data.isolate_documents,
                   dupe_factor=data.dupe_factor if data.masking == "static" else None, **spans)
    try:
        return StreamOptions(**options)
    except ValueError as err:
        if not spans or instances == "xlnet":
            raise
        raise ValueError(f"{source}: {err}; train a tokenizer with more (bertkit tokenizer train --kind unigram "
                         f"--extra-ids 100) or lower --max-seq-length") from None


def xlnet_stream_fields(data: DataConfig, tokenizer, source: str | Path, model: dict[str, Any]) -> dict[str, Any]:
    """The XLNet stream's fields: reuse_len (the recipe model section's, 0 when absent) and partial_k; ValueError
    naming `source` when the tokenizer has no <cls> or <sep> (XLNet's segments end `<sep> <cls>`)."""
    if tokenizer is not None and (tokenizer.cls_id is None or tokenizer.sep_id is None):
        raise ValueError(f"{source}: the xlnet objective frames segments `A <sep> B <sep> <cls>`, and this "
                         f"{getattr(tokenizer, 'kind', '')} tokenizer has no "
                         f"{'<cls>' if tokenizer.cls_id is None else '<sep>'} token; prepare the corpus with an XLNet "
                         f"tokenizer (bertkit tokenizer train --kind unigram --xlnet)")
    if data.partial_k < 2:
        raise ValueError(f"partial_k must be at least 2, got {data.partial_k}")
    if model.get("reuse_len") and "mem_len" in model and not model["mem_len"]:
        raise ValueError(f"mem_len {model['mem_len']!r} with reuse_len {model['reuse_len']}: the memory would grow "
                         f"by reuse_len tokens every segment without bound; set mem_len (e.g. 2 x reuse_len)")
    return {"reuse_len": int(model.get("reuse_len") or 0), "partial_k": data.partial_k}


def span_sentinels(tokenizer, source: str | Path) -> dict[str, int]:
    """{first_sentinel_id, sentinels}: the tokenizer's `<extra_id_N>` tokens, which span corruption puts in place of
    the dropped spans, counted down from <extra_id_0> as T5's tokenizer numbers them. ValueError naming `source`
    when it has none (a WordPiece or BPE vocabulary, a Unigram one trained with --extra-ids 0) or when they are
    not numbered down one by one."""
    ids = list(getattr(tokenizer, "sentinel_ids", None) or [])
    if not ids:
        kind = getattr(tokenizer, "kind", "this")
        raise ValueError(f"{source}: the {kind} tokenizer has no sentinel tokens <extra_id_0>, <extra_id_1>, ... "
                         f"for span corruption; prepare the corpus with a tokenizer from `bertkit tokenizer train "
                         f"--kind unigram --extra-ids 100`")
    count = next((k for k, i in enumerate(ids) if i != ids[0] - k), len(ids))
    if count < len(ids):
        raise ValueError(f"{source}: the sentinel tokens are not numbered down from <extra_id_0> (id {ids[0]}): "
                         f"<extra_id_{count}> is id {ids[count]}, not {ids[0] - count} (T5's layout puts them at "
                         f"the end of the vocabulary, <extra_id_0> last)")
    return {"first_sentinel_id": ids[0], "sentinels": len(ids)}


def _special_token_fields(tokenizer, model_fields: dict[str, Any]) -> dict[str, Any]:
    """The config fields the tokenizer's special ids set: pad_token_id (RoBERTa's <pad> is 1, and its positions
    count from it), and those the architecture's registry row names (`tokenizer_fields`: RoBERTa's and ALBERT's
    bos/eos, ModernBERT's four framing ids, T5's decoder start, ELMo's character alphabet)."""
    return architecture(model_fields.get("model_type")).tokenizer_ids(tokenizer)


def build_pretraining_model(config: PretrainConfig, vocab_size: int, init_from: str | Path | None = None,
                            tokenizer=None):
    """(model, objective) for the recipe: a fresh model of the preset, or `init_from`'s weights (fresh heads where
    the directory has none).

    tokenizer: when given, the padding (and for RoBERTa / ALBERT the bos / eos) ids come from it, unless the
    recipe's model section sets them; without it they are BERT's defaults (pad 0).
    """
    d = config.data
    return BUILDERS[objective(d.objective).build](config, vocab_size, init_from, tokenizer)


def _build_encoder(config: PretrainConfig, vocab_size: int, init_from, tokenizer):
    """`build_pretraining_model` for the encoders (the BERT family, the causal LM, ModernBERT, XLNet): the preset
    with the recipe's model fields over it, or `init_from`'s weights."""
    d = config.data
    row = objective(d.objective)
    overrides = {"vocab_size": vocab_size, "max_position_embeddings": max(512, d.max_seq_length)}
    if tokenizer is not None:
        overrides.update(_special_token_fields(tokenizer, config.model))
    overrides.update(config.model)
    model_type = model_type_of(config.model, d.objective)
    if model_type is not None:  # `--objective xlnet` alone builds an XLNet
        overrides["model_type"] = model_type
    if overrides.get("padding_offset_positions") and "max_position_embeddings" not in config.model:
        # RoBERTa's table also holds the pad_token_id + 1 offset rows (514 for 512 positions with <pad> = 1).
        overrides["max_position_embeddings"] += overrides.get("pad_token_id", 0) + 1
    model_config = config_class_for(overrides.get("model_type")).preset(config.preset, **overrides)
    model, task = build_pretraining(d.objective, model_config, **dataclasses.asdict(d))
    if init_from is not None:
        if row.model is not None:  # ELECTRA's generator and discriminator, the causal LM: the directory whole
            model = type(model).from_pretrained(init_from)
        else:
            # The directory's pretraining heads when it has them whole (a later stage continues them), fresh ones
            # where it has none or only part (an encoder, or an MLM head without BERT's NSP head).
            directory = ModelDir.open(init_from)  # BertForPreTraining, or the architecture's MLM model
            try:
                model = directory.load(row.model_role)
            except CheckpointError:
                model = directory.load(row.model_role, new_heads=True)
        check_same_vocabulary(init_from, tokenizer, model, vocab_size)
        if row.pair_task is not None and getattr(model, "nsp", None) is None:
            raise ValueError(f"{init_from}: the {d.objective} objective trains a sentence-pair head, which a "
                             f"{model.config.model_type} model does not have; use the roberta objective")
        model = continued_model(model, config, init_from)
    return model, task


def _build_elmo(config: PretrainConfig, vocab_size: int, init_from, tokenizer):
    """(ElmoLanguageModel, BiLMObjective) for the elmo objective: the preset's sizes, the word tokenizer's
    vocabulary, characters and word width (`init_from`: continue an ELMo directory)."""
    if tokenizer is not None and getattr(tokenizer, "kind", None) != "word":
        raise ValueError(f"the elmo objective reads words and their characters: prepare the corpus with a word "
                         f"tokenizer (bertkit tokenizer train --kind word), not a {tokenizer.kind} one")
    fields: dict[str, Any] = {"vocab_size": vocab_size}
    if tokenizer is not None:
        fields.update(_special_token_fields(tokenizer, {"model_type": "elmo"}))
    fields.update({k: v for k, v in config.model.items() if k != "model_type"})
    model_config = ElmoConfig.preset(config.preset, **fields)
    table = torch.from_numpy(tokenizer.char_table()) if tokenizer is not None else \
        torch.zeros(vocab_size, model_config.max_characters, dtype=torch.long)
    model, task = build_pretraining(config.data.objective, model_config, **dataclasses.asdict(config.data),
                                    char_table=table)
    if init_from is not None:
        model = ElmoLanguageModel.from_pretrained(init_from)
        check_same_vocabulary(init_from, None, model, vocab_size)
    return model, task


def continued_model(model, config: PretrainConfig, init_from: str | Path):
    """The `init_from` model a continued run trains (a later stage at a longer length, say).

    ModernBERT: positions are rotary, so max_position_embeddings (a limit, no table) is raised to the recipe's
    max_seq_length, and the recipe's explicit ModernBERT fields that change no tensor shape (global_rope_theta for
    the paper's long-context stage, the window, dropout) replace the directory's. A model with a position table
    (the BERT family) shorter than max_seq_length is refused, pointing at `bertkit extend-context`.
    """
    length = config.data.max_seq_length
    current = model.config
    if architecture_of(current).positions != "rotary":
        limit = getattr(current, "max_length", None)
        if limit is not None and length > limit:
            raise ValueError(f"{init_from}: max_seq_length {length} is longer than its {limit} positions; grow its "
                             f"position table first (bertkit extend-context --model {init_from} "
                             f"--max-position-embeddings {length} --out NEW_DIR) and continue from NEW_DIR")
        return model
    fields = {}
    if config.model.get("model_type") == current.model_type:  # the recipe's fields are this architecture's
        fields = {k: v for k, v in config.model.items() if k != "model_type" and getattr(current, k) != v}
    if current.max_position_embeddings < length:
        fields["max_position_embeddings"] = max(length, fields.get("max_position_embeddings", length))
    if not fields:
        return model
    changed = type(model)(dataclasses.replace(current, **fields))
    try:
        changed.load_state_dict(model.state_dict())
    except RuntimeError:
        raise ValueError(f"{init_from}: the recipe's model fields {sorted(fields)} change the shapes of its weights; "
                         f"a continued run keeps the architecture (set only rotary, window, dropout or length "
                         f"fields)") from None
    return changed


def _build_t5(config: PretrainConfig, vocab_size: int, init_from, tokenizer):
    """`build_pretraining_model` for T5: the preset's encoder-decoder (padding, EOS and decoder start ids from the
    tokenizer: T5 starts the decoder with the padding id), or `init_from`'s weights."""
    fields: dict[str, Any] = {"vocab_size": vocab_size}
    if tokenizer is not None:
        fields.update(_special_token_fields(tokenizer, {"model_type": "t5"}))
    fields.update({k: v for k, v in config.model.items() if k != "model_type"})
    model, task = build_pretraining(config.data.objective, T5Config.preset(config.preset, **fields),
                                    **dataclasses.asdict(config.data))
    if init_from is not None:
        model = type(model).from_pretrained(init_from)
        check_same_vocabulary(init_from, tokenizer, model, vocab_size)
    return model, task


# How an objective row's model is made (its `build`): a model config from the preset, the recipe and the tokenizer.
BUILDERS = {"encoder": _build_encoder, "t5": _build_t5, "elmo": _build_elmo}


def check_same_vocabulary(model_dir: str | Path, tokenizer, model=None, vocab_size: int | None = None) -> None:
    """ValueError when `model` (loaded from `model_dir`) has another vocab_size than the prepared data's, or the
    tokenizer files of `model_dir` hold another vocabulary than `tokenizer` (same size or not: ids would mean other
    tokens; None: not compared). A directory without tokenizer files cannot be checked; that is said."""
    if model is not None and model.config.vocab_size != vocab_size:
        raise ValueError(f"{model_dir}: vocab_size {model.config.vocab_size} does not match the prepared data's "
                         f"tokenizer ({vocab_size})")
    if tokenizer is None:
        return
    try:
        theirs = load_tokenizer(model_dir)
    except (FileNotFoundError, ValueError, OSError):
        print(f"bertkit: warning: {model_dir} has no readable tokenizer files; its vocabulary cannot be checked "
              f"against the prepared data's", file=sys.stderr, flush=True)
        return
    if theirs.vocab_hash() != tokenizer.vocab_hash():
        raise ValueError(f"{model_dir}: its vocabulary ({theirs.kind}, hash {theirs.vocab_hash()}) is not the prepared "
                         f"data's ({tokenizer.kind}, hash {tokenizer.vocab_hash()}), although both have "
                         f"{tokenizer.vocab_size} tokens: its embeddings would be read with other tokens' ids")


def init_model_dir(out_dir: str | Path, tokenizer_path: str | Path, preset: str = "mini", seed: int = 0,
                   model_type: str = "bert", **overrides: Any) -> Path:
    """Write a randomly initialised model with the given tokenizer: the "from scratch" baseline of a fine-tuning
    comparison, or a starting point to pretrain (or a distillation student).

    model_type: any row of the architecture table (bertkit.models.registry.ARCHITECTURES), written as the model it
    pretrains as with its own initialisation and `preset` size: BERT's BertForPreTraining, a causal BERT-family
    LM, ModernBERT's masked LM, T5's encoder-decoder, XLNet's LM head model, ELMo's biLM (a word tokenizer); the
    padding and framing ids (ELMo: the characters) are the tokenizer's. overrides: config fields over the preset.
    """
    try:
        row = architecture(model_type)
    except ValueError as err:
        raise ValueError(f"--model-type: {err}") from None
    if preset not in row.presets:
        raise ValueError(f"unknown {model_type} preset {preset!r}; choose one of {', '.join(row.presets)}")
    tokenizer = load_tokenizer(tokenizer_path)  # any kind: vocab.txt, vocab.json + merges.txt, tokenizer.json
    if row.positions == "none" and getattr(tokenizer, "kind", None) != "word":  # ELMo reads words' characters
        raise ValueError(f"--model-type {model_type}: {row.label} reads words and their characters; give a word "
                         f"tokenizer (bertkit tokenizer train --kind word), not a {tokenizer.kind} one")
    torch.manual_seed(seed)
    fields = {"vocab_size": tokenizer.vocab_size, "model_type": row.model_type, **row.config_fields,
              **_special_token_fields(tokenizer, {"model_type": row.model_type})}
    family = FAMILIES.get(row.model_type) if row.config_class is BertConfig else None
    fields.update(family.fixed if family is not None else {})  # RoBERTa's offset positions, ALBERT's ...
    fields.update(overrides)
    config = row.config_class.preset(preset, **fields)
    if getattr(config, "padding_offset_positions", False) and "max_position_embeddings" not in overrides:
        # RoBERTa's table also holds the pad_token_id + 1 offset rows (514 for 512 positions with <pad> = 1)
        config = dataclasses.replace(config, max_position_embeddings=config.max_position_embeddings +
                                     config.pad_token_id + 1)
    model = pretraining_class(config)(config)
    model.save_pretrained(out_dir, tokenizer=tokenizer)
    return Path(out_dir)


def init_like(out_dir: str | Path, source_dir: str | Path, seed: int = 0) -> Path:
    """Write a randomly initialised model of exactly `source_dir`'s architecture (its config.json, any family
    bertkit loads) with its tokenizer: the "same model from scratch" of a pretrained-versus-random comparison.

    The weights are the architecture's own initialisation from `seed`; nothing of the source's weights is read.
    Written as the pretraining model (BERT: BertForPreTraining, a causal config: BertForCausalLM, ModernBERT: its
    masked LM, T5: the encoder-decoder), so every verb that takes the source takes the copy.
    """
    try:
        source = ModelDir.open(source_dir)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--like {err}") from None
    tokenizer = source.tokenizer()
    torch.manual_seed(seed)
    model = pretraining_class(source.config)(source.config)
    model.save_pretrained(out_dir, tokenizer=tokenizer)
    return Path(out_dir)


# The tokenizer attribute that holds each special token an objective row may need (its `special_tokens`).
SPECIAL_TOKENS = {"cls": "cls_id", "sep": "sep_id", "pad": "pad_id", "mask": "mask_id", "sentinels": "sentinel_ids"}


def check_special_tokens(name: str, tokenizer, source: str | Path) -> None:
    """ValueError in one line, naming `source`, when the tokenizer lacks a special token objective `name` needs."""
    missing = [token for token in objective(name).special_tokens
               if getattr(tokenizer, SPECIAL_TOKENS[token], None) in (None, [])]
    if missing:
        raise ValueError(f"{source}: the {name} objective needs the tokenizer's {' and '.join(missing)} token"
                         f"{'s' if len(missing) > 1 else ''}, which this {getattr(tokenizer, 'kind', '')} tokenizer "
                         f"does not have; prepare the corpus with a tokenizer that has them")


def _instance_stream(corpus, held_out, tokenizer, config: PretrainConfig, rank: int, world_size: int,
                     workers: int):
    """(this rank's PretrainingStream, fixed held-out batches or None): the objective's masked instances (or
    spans, or permutation segments) from the shards."""
    d = config.data
    options = stream_options(d, tokenizer, corpus.manifest.tokenizer_dir, config.model)
    check_special_tokens(d.objective, tokenizer, corpus.manifest.tokenizer_dir)
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    random_ids = random_token_ids(tokenizer)
    stream = PretrainingStream(corpus, options, special, tokenizer.vocab_size, d.batch_size, seed=config.train.seed,
                               rank=rank, world_size=world_size, random_ids=random_ids, workers=workers)
    if held_out is None:
        return stream, None
    eval_stream = PretrainingStream(held_out, dataclasses.replace(options, dupe_factor=None), special,
                                    tokenizer.vocab_size, d.batch_size, seed=12345, random_ids=random_ids)
    return stream, fixed_batches(eval_stream, d.eval_instances, min(d.batch_size, 64))


def _word_window_stream(corpus, held_out, tokenizer, config: PretrainConfig, rank: int, world_size: int,
                        workers: int):
    """(this rank's WordWindowStream, fixed held-out windows or None): word windows in lanes
    (bertkit.data.lmstream), not masked instances; made in the training process (`workers` unused)."""
    d = config.data
    check_special_tokens(d.objective, tokenizer, corpus.manifest.tokenizer_dir)
    stream = WordWindowStream(corpus, tokenizer.cls_id, tokenizer.sep_id, d.max_seq_length - 1, d.batch_size,
                              seed=config.train.seed, rank=rank, world_size=world_size)
    if held_out is None:
        return stream, None
    eval_stream = WordWindowStream(held_out, tokenizer.cls_id, tokenizer.sep_id, d.max_seq_length - 1,
                                   min(d.batch_size, 64), shuffle=False)
    return stream, fixed_windows(eval_stream, max(1, d.eval_instances // min(d.batch_size, 64)))


# The stream factories an objective row names (its `stream`).
STREAMS = {"instances": _instance_stream, "word-windows": _word_window_stream}


def pretrain(data_dir: str | Path, run_dir: str | Path, config: PretrainConfig, resume: bool = False,
             init_from: str | Path | None = None, eval_at_start: bool = True, verify_data: bool = False) -> TrainResult:
    """Pretrain on `bertkit prepare` output; writes metrics, checkpoints and RUN_DIR/model (a model directory).

    One writer per run directory: rank 0 holds RUN_DIR's lock for the whole run (`bertkit.io.lock_directory`;
    the ranks of one torchrun job are one writer), so a second run on it fails at once, naming the holder's pid.
    Temporary files and staging folders a killed run left are removed first.

    resume: continue from the newest checkpoint. With none there (a new or empty directory) the run starts fresh and
        says so, which lets one command line serve the first launch and every restart of a job. The settings must
        be those the run was started with, except its budget and bookkeeping (`RESUMABLE_CHANGES`); anything else
        (model, data, batch size, number of processes, optimiser) is refused, naming what changed.
    Without `resume`, checkpoints an earlier run left in RUN_DIR are removed first (and said), so that a later
    `resume` can never mix two runs.
    verify_data: check every shard file's SHA-256 before training (otherwise a shard's index files are checked at
        open and its token files just before its first use; see `bertkit.data.shards.ShardedCorpus`).
    """
    run_dir = Path(run_dir)
    dist_info, device = setup_distributed(config.train.device)
    # DDP ranks of one job are one writer: rank 0 holds the lock, the others write nothing of their own.
    with writer_lock(run_dir, dist_info.is_main):
        return _pretrain(Path(data_dir), run_dir, config, resume, init_from, eval_at_start, verify_data,
                         dist_info, device)


# Settings a resumed run may change: its budget and bookkeeping, never what it computes.
RESUMABLE_CHANGES = {"train": {"max_steps", "max_time", "max_tokens", "log_every", "eval_every", "save_every",
                               "keep_last", "progress", "device", "precision", "compile"},
                     "data": {"eval_instances", "workers"}}


def data_workers(workers: int | None, device, dist_info) -> int:
    """The stream's worker processes: `workers`, or by default up to 4 per GPU (this machine's cores shared among
    its ranks, one kept for the training process) and none on the CPU, where they would take the model's cores."""
    if workers is not None:
        return workers
    if getattr(device, "type", "cpu") != "cuda":
        return 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist_info.world_size))
    return max(0, min(4, (os.cpu_count() or 1) // max(local, 1) - 1))


def data_fingerprint(corpus) -> dict[str, Any]:
    """What identifies a prepared training split: its vocabulary and its shards' checksums (not its path, so a
    moved data directory resumes)."""
    shards = [{k: shard[k] for k in ("name", "documents", "sentences", "tokens", "files")}
              for shard in corpus.manifest.split(corpus.split)["shards"]]
    digest = hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest()[:16]
    return {"vocab_hash": corpus.manifest.vocab_hash, "documents": corpus.num_documents,
            "tokens": corpus.num_tokens, "shards_sha256": digest}


def resume_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the resolved config of a run (its config.yaml) and a resuming one's, beyond
    `RESUMABLE_CHANGES`: ["data.batch_size 8 -> 16", ...]."""
    changes: list[str] = []

    def compare(prefix: str, a: Any, b: Any, allowed: frozenset[str] | set[str] = frozenset(),
                defaults: dict[str, Any] | None = None) -> None:
        a, b = a or {}, b or {}
        for key in sorted(set(a) | set(b)):
            if key not in a and defaults is not None and b.get(key) == defaults.get(key, a):
                continue  # a setting added since the run started, at its default: what the run computed
            if key not in allowed and a.get(key) != b.get(key):
                changes.append(f"{prefix}{key} {a.get(key)!r} -> {b.get(key)!r}")

    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    compare("data.", old.get("data"), new.get("data"), RESUMABLE_CHANGES["data"], defaults(DataConfig))
    compare("train.", old.get("train"), new.get("train"), RESUMABLE_CHANGES["train"], defaults(TrainConfig))
    compare("model.", old.get("model_config"), new.get("model_config"))
    for key, label in (("world_size", "processes"), ("global_batch_size", "global batch size")):
        if key in old and old.get(key) != new.get(key):
            changes.append(f"{label} {old.get(key)} -> {new.get(key)}")
    if "data_fingerprint" in old and old["data_fingerprint"] != new.get("data_fingerprint"):
        a, b = old["data_fingerprint"], new.get("data_fingerprint") or {}
        what = "vocabulary" if a.get("vocab_hash") != b.get("vocab_hash") else "shards"
        changes.append(f"data {old.get('data_dir')} -> {new.get('data_dir')} (other {what}: {a.get('documents')} "
                       f"documents, {a.get('tokens')} tokens -> {b.get('documents')}, {b.get('tokens')})")
    return changes


def _pretrain(data_dir: Path, run_dir: Path, config: PretrainConfig, resume: bool, init_from, eval_at_start: bool,
              verify_data: bool, dist_info, device) -> TrainResult:
    def say(message: str) -> None:
        if dist_info.is_main:
            print(message, file=sys.stderr, flush=True)

    if dist_info.is_main:
        for path in remove_stale_temporaries(run_dir, run_dir / RESUME_DIR):
            say(f"bertkit: removed {path}, left by an interrupted run")
    checkpoint = latest_checkpoint(run_dir)
    if resume and checkpoint is None:
        say(f"bertkit: --resume: {run_dir} holds no checkpoint (a new or empty run directory); starting a fresh run")
    resuming = resume and checkpoint is not None

    corpus = ShardedCorpus(data_dir, "train", verify=verify_data).require_documents()
    # WordPiece or byte-level BPE, as the manifest records; its special ids frame the instances ([CLS] ... [SEP],
    # or RoBERTa's <s> ... </s>) and pad them.
    tokenizer = corpus.manifest.load_tokenizer()
    # Absurd sizes are refused from the shapes alone, before anything is allocated.
    refuse_oversized(lambda: build_pretraining_model(config, tokenizer.vocab_size, tokenizer=tokenizer)[0],
                     f"the {config.preset} model of the recipe")
    seed_everything(config.train.seed)
    # A resumed run takes its weights from the checkpoint, not from init_from.
    model, task = build_pretraining_model(config, tokenizer.vocab_size, None if resuming else init_from,
                                          tokenizer=tokenizer)

    d = config.data
    resolved = {**config.to_dict(), "data_dir": str(data_dir), "data_fingerprint": data_fingerprint(corpus),
                "world_size": dist_info.world_size,
                "global_batch_size": d.batch_size * dist_info.world_size * config.train.grad_accumulation,
                "model_config": model.config.to_dict()}
    if resuming and (run_dir / "config.yaml").is_file():
        try:
            old = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            old = None
        changes = resume_changes(old, resolved) if isinstance(old, dict) else []
        if changes:
            raise ValueError(f"{run_dir}: --resume with other settings than the run was started with: "
                             f"{'; '.join(changes)}. Resume with the original settings, or start a new run in "
                             f"another directory")

    # rank 0 evaluates on fixed batches of the held-out split, when there is one
    held_out = None
    if "eval" in corpus.manifest.splits and dist_info.is_main and d.eval_instances > 0:
        held_out = ShardedCorpus(data_dir, "eval", verify=verify_data).require_documents()
    stream, eval_batches = STREAMS[objective(d.objective).stream](
        corpus, held_out, tokenizer, config, rank=dist_info.rank, world_size=dist_info.world_size,
        workers=data_workers(d.workers, device, dist_info))
    evaluate = None if eval_batches is None else lambda m: evaluate_pretraining(m, task, eval_batches)

    if dist_info.is_main:
        if checkpoint is not None and not resuming:
            for stale in sorted((run_dir / RESUME_DIR).glob("step-*.pt")):
                stale.unlink()
            say(f"bertkit: {run_dir} held the checkpoints of an earlier run (up to {checkpoint.name}); a new run "
                f"replaces them (--resume continues a run instead)")
        atomic_write(run_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        print(f"pretraining a {config.preset} {model.config.model_type} model "
              f"({model.num_parameters() / 1e6:.1f}M parameters) with the "
              f"{d.objective} objective on {corpus.num_tokens:,} tokens; global batch "
              f"{resolved['global_batch_size']} x {d.max_seq_length} tokens on {device}", flush=True)
    if dist_info.world_size > 1:  # the other ranks look for checkpoints once rank 0 has settled them
        torch.distributed.barrier()

    def save_model(m, step):  # the model directory tracks the latest checkpoint
        m.save_pretrained(run_dir / "model", tokenizer=tokenizer)

    result = train(model, task, stream, config.train, run_dir, evaluate=evaluate, resume=resuming,
                   on_save=save_model, dist_info=dist_info, device=device, eval_at_start=eval_at_start)
    if dist_info.is_main:
        atomic_write(run_dir / "result.json", json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    end_distributed()
    return result
