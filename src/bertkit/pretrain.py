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
import json
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from bertkit.config import PRESETS, BertConfig, field_with_help
from bertkit.objectives import FAMILY_OBJECTIVES, OBJECTIVES, build_pretraining, evaluate_pretraining

ALL_OBJECTIVES = {**OBJECTIVES, **FAMILY_OBJECTIVES}  # name -> (instance kind, pair task or None)
from bertkit.trainer import TrainConfig, TrainResult, seed_everything, setup_distributed, train


_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)


@dataclass(frozen=True)
class DataConfig:
    """What the model sees: objective, instance creation, masking and batch size."""

    objective: str = _f("bert", "bert (MLM+NSP), albert (MLM+SOP), roberta (MLM, FULL-SENTENCES), roberta-doc "
                                "(MLM, DOC-SENTENCES), electra (replaced-token detection), causal (next-token LM)")
    max_seq_length: int = _f(128, "tokens per instance, [CLS]/[SEP] included")
    short_seq_prob: float = _f(0.1, "fraction of NSP/SOP instances with a shorter random target length")
    mask_prob: float = _f(0.15, "fraction of (non-special) tokens to predict")
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

    def __post_init__(self) -> None:
        if self.objective not in ALL_OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(ALL_OBJECTIVES)}")
        if self.masking not in ("dynamic", "static"):
            raise ValueError(f"masking must be dynamic or static, got {self.masking!r}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.batch_size < 1 or self.max_seq_length < 8:
            raise ValueError("batch_size must be >= 1 and max_seq_length >= 8")


@dataclass(frozen=True)
class PretrainConfig:
    preset: str = "mini"
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        known = {f.name for f in dataclasses.fields(BertConfig)}
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
    """A recipe as a dict: a file path, or the name of a built-in recipe (see `recipe_names()`)."""
    if name_or_path is None:
        return {}
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
    """Every settable field by section: (name, default, help), for `bertkit pretrain --help`."""
    out: dict[str, list[tuple[str, Any, str]]] = {}
    for section, cls in (("data", DataConfig), ("train", TrainConfig), ("model", BertConfig)):
        rows = []
        for f in dataclasses.fields(cls):
            rows.append((f.name, f.default, f.metadata.get("help", "")))
        out[section] = rows
    return out


def resolve_config(recipe: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PretrainConfig:
    """Recipe file (or built-in name) + overrides -> a validated PretrainConfig.

    overrides: {"field": value} or {"section.field": value}; a bare field name is looked up in data, train and
    model (BertConfig) in that order; "preset" sets the size preset.
    """
    data = load_recipe(recipe)
    sections: dict[str, dict[str, Any]] = {s: dict(data.get(s) or {}) for s in ("model", "data", "train")}
    preset = data.get("preset", "mini")
    fields = {"data": {f.name: f for f in dataclasses.fields(DataConfig)},
              "train": {f.name: f for f in dataclasses.fields(TrainConfig)},
              "model": {f.name: f for f in dataclasses.fields(BertConfig)}}
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


def _special_token_fields(tokenizer, model_fields: dict[str, Any]) -> dict[str, Any]:
    """The config fields the tokenizer's special ids set: pad_token_id (RoBERTa's <pad> is 1, and its positions
    count from it), and bos/eos_token_id where the family writes them (RoBERTa <s>/</s>, ALBERT [CLS]/[SEP])."""
    from bertkit.config import FAMILIES

    fields: dict[str, Any] = {"pad_token_id": tokenizer.pad_id}
    family = FAMILIES.get(model_fields.get("model_type", "bert"))
    if family is not None and "bos_token_id" in family.keys:
        fields.update(bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
    return fields


def build_pretraining_model(config: PretrainConfig, vocab_size: int, init_from: str | Path | None = None,
                            tokenizer=None):
    """(model, objective) for the recipe: a fresh model of the preset, or `init_from`'s weights (fresh heads where
    the directory has none).

    tokenizer: when given, the padding (and for RoBERTa / ALBERT the bos / eos) ids come from it, unless the
    recipe's model section sets them; without it they are BERT's defaults (pad 0).
    """
    from bertkit.models import BertForCausalLM, BertForPreTraining, GeneratorDiscriminator

    d = config.data
    overrides = {"vocab_size": vocab_size, "max_position_embeddings": max(512, d.max_seq_length)}
    if tokenizer is not None:
        overrides.update(_special_token_fields(tokenizer, config.model))
    overrides.update(config.model)
    if overrides.get("padding_offset_positions") and "max_position_embeddings" not in config.model:
        # RoBERTa's table also holds the pad_token_id + 1 offset rows (514 for 512 positions with <pad> = 1).
        overrides["max_position_embeddings"] += overrides.get("pad_token_id", 0) + 1
    model, objective = build_pretraining(d.objective, BertConfig.preset(config.preset, **overrides),
                                         sparse_prediction=d.sparse_prediction, rtd_weight=d.rtd_weight,
                                         generator_fraction=d.generator_fraction)
    if init_from is not None:
        cls = {"electra": GeneratorDiscriminator, "causal": BertForCausalLM}.get(d.objective, BertForPreTraining)
        kwargs = {"new_heads": True} if cls is BertForPreTraining else {}
        model = cls.from_pretrained(init_from, **kwargs)
        if model.config.vocab_size != vocab_size:
            raise ValueError(f"{init_from}: vocab_size {model.config.vocab_size} does not match the prepared data's "
                             f"tokenizer ({vocab_size})")
    return model, objective


def build_model(config: PretrainConfig, vocab_size: int, init_from: str | Path | None = None):
    """The model `pretrain` would train (see `build_pretraining_model`)."""
    return build_pretraining_model(config, vocab_size, init_from)[0]


def init_model_dir(out_dir: str | Path, tokenizer_path: str | Path, preset: str = "mini", seed: int = 0,
                   **overrides: Any) -> Path:
    """Write a randomly initialised BertForPreTraining (BERT initialisation) with the given tokenizer: the
    "from scratch" baseline of a fine-tuning comparison, or a starting point to pretrain."""
    from bertkit.models import BertForPreTraining
    from bertkit.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    fields = {"vocab_size": tokenizer.vocab_size, **overrides}
    model = BertForPreTraining(BertConfig.preset(preset, **fields))
    model.save_pretrained(out_dir, tokenizer=tokenizer)
    return Path(out_dir)


def pretrain(data_dir: str | Path, run_dir: str | Path, config: PretrainConfig, resume: bool = False,
             init_from: str | Path | None = None, eval_at_start: bool = True) -> TrainResult:
    """Pretrain on `bertkit prepare` output; writes metrics, checkpoints and RUN_DIR/model (a model directory)."""
    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream, StreamOptions, fixed_batches
    from bertkit.data.shards import ShardedCorpus

    data_dir, run_dir = Path(data_dir), Path(run_dir)
    dist_info, device = setup_distributed(config.train.device)
    corpus = ShardedCorpus(data_dir, "train")
    # WordPiece or byte-level BPE, as the manifest records; its special ids frame the instances ([CLS] ... [SEP],
    # or RoBERTa's <s> ... </s>) and pad them.
    tokenizer = corpus.manifest.load_tokenizer()
    seed_everything(config.train.seed)
    model, objective = build_pretraining_model(config, tokenizer.vocab_size, init_from, tokenizer=tokenizer)

    instances, _ = ALL_OBJECTIVES[config.data.objective]
    d = config.data
    options = StreamOptions(instances=instances, max_seq_length=d.max_seq_length, short_seq_prob=d.short_seq_prob,
                            mask_prob=d.mask_prob, max_predictions_per_seq=d.max_predictions_per_seq,
                            whole_word_masking=d.whole_word_masking, isolate_documents=d.isolate_documents,
                            dupe_factor=d.dupe_factor if d.masking == "static" else None)
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    random_ids = random_token_ids(tokenizer)
    stream = PretrainingStream(corpus, options, special, tokenizer.vocab_size, d.batch_size, seed=config.train.seed,
                               rank=dist_info.rank, world_size=dist_info.world_size, random_ids=random_ids)

    evaluate = None
    if "eval" in corpus.manifest.splits and dist_info.is_main and d.eval_instances > 0:
        eval_corpus = ShardedCorpus(data_dir, "eval")
        eval_stream = PretrainingStream(eval_corpus, dataclasses.replace(options, dupe_factor=None), special,
                                        tokenizer.vocab_size, d.batch_size, seed=12345, random_ids=random_ids)
        eval_batches = fixed_batches(eval_stream, d.eval_instances, min(d.batch_size, 64))

        def evaluate(m):  # noqa: E306 - closure over the fixed held-out batches
            return evaluate_pretraining(m, objective, eval_batches)

    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = config.to_dict()
        resolved["data_dir"] = str(data_dir)
        resolved["world_size"] = dist_info.world_size
        resolved["global_batch_size"] = d.batch_size * dist_info.world_size * config.train.grad_accumulation
        resolved["model_config"] = model.config.to_dict()
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
        print(f"pretraining a {config.preset} {model.config.model_type} model "
              f"({model.num_parameters() / 1e6:.1f}M parameters) with the "
              f"{d.objective} objective on {corpus.num_tokens:,} tokens; global batch "
              f"{resolved['global_batch_size']} x {d.max_seq_length} tokens on {device}", flush=True)

    def save_model(m, step):  # the model directory tracks the latest checkpoint
        m.save_pretrained(run_dir / "model", tokenizer=tokenizer)

    result = train(model, objective, stream, config.train, run_dir, evaluate=evaluate, resume=resume,
                   on_save=save_model, dist_info=dist_info, device=device, eval_at_start=eval_at_start)
    if dist_info.is_main:
        (run_dir / "result.json").write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result
