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

import contextlib
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

from bertkit.config import BertConfig, check_finite, config_class_for, field_with_help, presets_for
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
        check_finite(self, ("short_seq_prob", "mask_prob", "rtd_weight", "generator_fraction"))
        if self.objective not in ALL_OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(ALL_OBJECTIVES)}")
        if self.masking not in ("dynamic", "static"):
            raise ValueError(f"masking must be dynamic or static, got {self.masking!r}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8, got {self.max_seq_length}")
        if self.max_predictions_per_seq < 1:  # 0 would mask nothing: no loss, no gradient, nothing learnt
            raise ValueError(f"max_predictions_per_seq must be at least 1, got {self.max_predictions_per_seq}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be at least 1, got {self.dupe_factor}")
        if self.eval_instances < 0:
            raise ValueError(f"eval_instances must not be negative, got {self.eval_instances}")
        if self.rtd_weight < 0:
            raise ValueError(f"rtd_weight must not be negative, got {self.rtd_weight}")
        if not 0.0 < self.generator_fraction <= 1.0:
            raise ValueError(f"generator_fraction must be in (0, 1], got {self.generator_fraction}")


@dataclass(frozen=True)
class PretrainConfig:
    preset: str = "mini"
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        model_type = self.model.get("model_type")
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
              "model": {f.name: f for f in dataclasses.fields(config_class_for(sections["model"].get("model_type")))}}
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


def stream_options(data: DataConfig):
    """The loader's `StreamOptions` for a recipe's data section: the objective's instances, lengths, masking,
    document isolation and static copies. Pretraining and MLM distillation both read their stream through this."""
    from bertkit.data.loader import StreamOptions

    instances, _ = ALL_OBJECTIVES[data.objective]
    return StreamOptions(instances=instances, max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob,
                         mask_prob=data.mask_prob, max_predictions_per_seq=data.max_predictions_per_seq,
                         whole_word_masking=data.whole_word_masking, isolate_documents=data.isolate_documents,
                         dupe_factor=data.dupe_factor if data.masking == "static" else None)


def _special_token_fields(tokenizer, model_fields: dict[str, Any]) -> dict[str, Any]:
    """The config fields the tokenizer's special ids set: pad_token_id (RoBERTa's <pad> is 1, and its positions
    count from it), and bos/eos_token_id where the family writes them (RoBERTa <s>/</s>, ALBERT [CLS]/[SEP])."""
    from bertkit.config import FAMILIES

    fields: dict[str, Any] = {"pad_token_id": tokenizer.pad_id}
    family = FAMILIES.get(model_fields.get("model_type", "bert"))
    if family is not None and "bos_token_id" in family.keys:
        fields.update(bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
    if model_fields.get("model_type") == "modernbert":  # ModernBERT's config.json names all four framing ids
        fields.update(cls_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id, bos_token_id=tokenizer.cls_id,
                      eos_token_id=tokenizer.sep_id)
    return fields


def build_pretraining_model(config: PretrainConfig, vocab_size: int, init_from: str | Path | None = None,
                            tokenizer=None):
    """(model, objective) for the recipe: a fresh model of the preset, or `init_from`'s weights (fresh heads where
    the directory has none).

    tokenizer: when given, the padding (and for RoBERTa / ALBERT the bos / eos) ids come from it, unless the
    recipe's model section sets them; without it they are BERT's defaults (pad 0).
    """
    from bertkit.models import BertForCausalLM, GeneratorDiscriminator, model_class

    d = config.data
    overrides = {"vocab_size": vocab_size, "max_position_embeddings": max(512, d.max_seq_length)}
    if tokenizer is not None:
        overrides.update(_special_token_fields(tokenizer, config.model))
    overrides.update(config.model)
    if overrides.get("padding_offset_positions") and "max_position_embeddings" not in config.model:
        # RoBERTa's table also holds the pad_token_id + 1 offset rows (514 for 512 positions with <pad> = 1).
        overrides["max_position_embeddings"] += overrides.get("pad_token_id", 0) + 1
    model_config = config_class_for(overrides.get("model_type")).preset(config.preset, **overrides)
    model, objective = build_pretraining(d.objective, model_config,
                                         sparse_prediction=d.sparse_prediction, rtd_weight=d.rtd_weight,
                                         generator_fraction=d.generator_fraction)
    if init_from is not None:
        cls = ({"electra": GeneratorDiscriminator, "causal": BertForCausalLM}.get(d.objective)
               or model_class(init_from, "pretraining"))  # BertForPreTraining, or the architecture's MLM model
        kwargs = {} if cls in (GeneratorDiscriminator, BertForCausalLM) else {"new_heads": True}
        model = cls.from_pretrained(init_from, **kwargs)
        if model.config.vocab_size != vocab_size:
            raise ValueError(f"{init_from}: vocab_size {model.config.vocab_size} does not match the prepared data's "
                             f"tokenizer ({vocab_size})")
        if tokenizer is not None:
            check_same_vocabulary(init_from, tokenizer)
    return model, objective


def check_same_vocabulary(model_dir: str | Path, tokenizer) -> None:
    """ValueError when the tokenizer files of `model_dir` hold another vocabulary than `tokenizer` (same size or
    not: ids would mean other tokens). A directory without tokenizer files cannot be checked; that is said."""
    import sys

    from bertkit.tokenizers import load_tokenizer

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


def build_model(config: PretrainConfig, vocab_size: int, init_from: str | Path | None = None):
    """The model `pretrain` would train (see `build_pretraining_model`)."""
    return build_pretraining_model(config, vocab_size, init_from)[0]


def init_model_dir(out_dir: str | Path, tokenizer_path: str | Path, preset: str = "mini", seed: int = 0,
                   **overrides: Any) -> Path:
    """Write a randomly initialised BertForPreTraining (BERT initialisation) with the given tokenizer: the
    "from scratch" baseline of a fine-tuning comparison, or a starting point to pretrain."""
    from bertkit.models import BertForPreTraining
    from bertkit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)  # any kind: vocab.txt, vocab.json + merges.txt, tokenizer.json
    torch.manual_seed(seed)
    fields = {"vocab_size": tokenizer.vocab_size, **overrides}
    model = BertForPreTraining(BertConfig.preset(preset, **fields))
    model.save_pretrained(out_dir, tokenizer=tokenizer)
    return Path(out_dir)


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
    from bertkit.io import lock_directory

    run_dir = Path(run_dir)
    dist_info, device = setup_distributed(config.train.device)
    # DDP ranks of one job are one writer: rank 0 holds the lock, the others write nothing of their own.
    with lock_directory(run_dir) if dist_info.is_main else contextlib.nullcontext():
        return _pretrain(Path(data_dir), run_dir, config, resume, init_from, eval_at_start, verify_data,
                         dist_info, device)


# Settings a resumed run may change: its budget and bookkeeping, never what it computes.
RESUMABLE_CHANGES = {"train": {"max_steps", "max_time", "max_tokens", "log_every", "eval_every", "save_every",
                               "keep_last", "progress", "device", "precision", "compile"},
                     "data": {"eval_instances"}}


def data_fingerprint(corpus) -> dict[str, Any]:
    """What identifies a prepared training split: its vocabulary and its shards' checksums (not its path, so a
    moved data directory resumes)."""
    import hashlib

    shards = [{k: shard[k] for k in ("name", "documents", "sentences", "tokens", "files")}
              for shard in corpus.manifest.split(corpus.split)["shards"]]
    digest = hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest()[:16]
    return {"vocab_hash": corpus.manifest.vocab_hash, "documents": corpus.num_documents,
            "tokens": corpus.num_tokens, "shards_sha256": digest}


def resume_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the resolved config of a run (its config.yaml) and a resuming one's, beyond
    `RESUMABLE_CHANGES`: ["data.batch_size 8 -> 16", ...]."""
    changes: list[str] = []

    def compare(prefix: str, a: Any, b: Any, allowed: frozenset[str] | set[str] = frozenset()) -> None:
        a, b = a or {}, b or {}
        for key in sorted(set(a) | set(b)):
            if key not in allowed and a.get(key) != b.get(key):
                changes.append(f"{prefix}{key} {a.get(key)!r} -> {b.get(key)!r}")

    compare("data.", old.get("data"), new.get("data"), RESUMABLE_CHANGES["data"])
    compare("train.", old.get("train"), new.get("train"), RESUMABLE_CHANGES["train"])
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
    import sys

    from bertkit.checkpoint import RESUME_DIR, latest_checkpoint, refuse_oversized
    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream, fixed_batches
    from bertkit.data.shards import ShardedCorpus
    from bertkit.io import atomic_write, remove_stale_temporaries

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

    corpus = ShardedCorpus(data_dir, "train", verify=verify_data)
    # WordPiece or byte-level BPE, as the manifest records; its special ids frame the instances ([CLS] ... [SEP],
    # or RoBERTa's <s> ... </s>) and pad them.
    tokenizer = corpus.manifest.load_tokenizer()
    # Absurd sizes are refused from the shapes alone, before anything is allocated.
    refuse_oversized(lambda: build_pretraining_model(config, tokenizer.vocab_size, tokenizer=tokenizer)[0],
                     f"the {config.preset} model of the recipe")
    seed_everything(config.train.seed)
    # A resumed run takes its weights from the checkpoint, not from init_from.
    model, objective = build_pretraining_model(config, tokenizer.vocab_size, None if resuming else init_from,
                                               tokenizer=tokenizer)

    d = config.data
    resolved = config.to_dict()
    resolved["data_dir"] = str(data_dir)
    resolved["data_fingerprint"] = data_fingerprint(corpus)
    resolved["world_size"] = dist_info.world_size
    resolved["global_batch_size"] = d.batch_size * dist_info.world_size * config.train.grad_accumulation
    resolved["model_config"] = model.config.to_dict()
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

    options = stream_options(d)
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    random_ids = random_token_ids(tokenizer)
    stream = PretrainingStream(corpus, options, special, tokenizer.vocab_size, d.batch_size, seed=config.train.seed,
                               rank=dist_info.rank, world_size=dist_info.world_size, random_ids=random_ids)

    evaluate = None
    if "eval" in corpus.manifest.splits and dist_info.is_main and d.eval_instances > 0:
        eval_corpus = ShardedCorpus(data_dir, "eval", verify=verify_data)
        eval_stream = PretrainingStream(eval_corpus, dataclasses.replace(options, dupe_factor=None), special,
                                        tokenizer.vocab_size, d.batch_size, seed=12345, random_ids=random_ids)
        eval_batches = fixed_batches(eval_stream, d.eval_instances, min(d.batch_size, 64))
        evaluate = lambda m: evaluate_pretraining(m, objective, eval_batches)  # noqa: E731 - the fixed batches

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

    result = train(model, objective, stream, config.train, run_dir, evaluate=evaluate, resume=resuming,
                   on_save=save_model, dist_info=dist_info, device=device, eval_at_start=eval_at_start)
    if dist_info.is_main:
        atomic_write(run_dir / "result.json", json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result
