"""What fine-tuning and distillation share: the run's config, its batches, forward passes, and the epoch loop that
evaluates on dev, keeps the best model and reports.

A task run, as `bertkit.tasks.finetune.finetune` and `bertkit.training.distill.distill_task` drive it:

    load_task_data      the family (`bertkit.tasks.family_for(kind)`), the model directory's tokenizer (any kind,
                        `bertkit.tokenizers.load_tokenizer`), the training and dev files read and turned into features
    load_task_model     the task model with a fresh (or kept) head, optionally with other dropout
    run_task            `EpochBatches` over the training features -> THE trainer (`bertkit.training.trainer.train`) for
                        config.epochs epochs; at every epoch's end `forward_all` on dev, the family's official metric,
                        RUN/eval.jsonl, and on a new best RUN/model (weights, the tokenizer it was trained with,
                        finetune.json) plus the dev predictions; RUN/results.json and config.yaml throughout

`EpochBatches` is the resumable, per-epoch-shuffled, length-bucketed batch stream the trainer consumes, `collate`
its dynamic padding (in worker processes with `workers`, in pinned memory on a GPU); the features are made once,
before training; the families (`bertkit.tasks`) never see torch: they get logits as numpy arrays.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from bertkit.checkpoint import HeadMismatchError, latest_checkpoint, resume_state_step, unwrap
from bertkit.config import IGNORE_INDEX, check_finite, field_with_help
from bertkit.data.loader import pack_batch, unpack_batch, unpack_pinned, worker_items
from bertkit.io import atomic_write, disk_full_as_error, read_json_lines
from bertkit.models.modeldir import TASK_FILE, ModelDir  # TASK_FILE: what `predict` needs besides the weights
from bertkit.sentence import pooling_modes
from bertkit.tasks.base import KINDS, TaskFamily, family_for, matrix_family, refusal
from bertkit.tasks.metrics import canonical_task
from bertkit.tasks.text2text import text_to_text_family
from bertkit.training.trainer import TrainConfig, end_distributed, train

_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)


@dataclass(frozen=True)
class FinetuneConfig:
    """How to fine-tune (and distil on a task); the defaults are the BERT paper's (section 4 and appendix A.3)."""

    kind: str | None = _f(None, "task family: glue, classify, ner, squad or swag (set by `finetune`)")
    task: str | None = _f(None, "GLUE task name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli); glue only")
    max_seq_length: int | None = _f(None, "tokens per input, special tokens included (default 128; SQuAD 384)")
    doc_stride: int = _f(128, "SQuAD: passage tokens between the starts of consecutive windows")
    max_query_length: int = _f(64, "SQuAD: question tokens kept")
    max_answer_length: int = _f(30, "SQuAD: longest answer span, in tokens")
    n_best_size: int = _f(20, "SQuAD: start and end candidates considered per window")
    max_target_length: int | None = _f(None, "text to text (T5): target tokens, EOS included, and the most tokens "
                                             "generated (default 32; SQuAD 64); longer targets are cut and counted")
    epochs: float = _f(3.0, "passes over the training set (the paper: 2-4; SQuAD 2-3)")
    learning_rate: float = _f(5e-5, "peak learning rate (the paper's grid: 2e-5, 3e-5, 5e-5)")
    batch_size: int = _f(32, "examples per optimizer step (split into grad_accumulation micro-batches)")
    bucket_window: int = _f(50, "length bucketing: sort each window of this many batches of the shuffled training "
                                "set by length, cut the batches, then shuffle their order (less padding); 0 = off")
    eval_batch_size: int = _f(64, "examples per forward pass when evaluating and predicting")
    warmup_ratio: float = _f(0.1, "linear warm-up over this fraction of the steps, then linear decay to 0")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on biases and LayerNorm)")
    optimizer: str = _f("adamw", "adamw or lamb (AdamW's update scaled per tensor by ||w|| / ||update||)")
    max_grad_norm: float = _f(1.0, "clip the global gradient norm to this (0 = no clipping)")
    adam_epsilon: float = _f(1e-6, "AdamW epsilon (BERT's 1e-6; torch's and transformers' default is 1e-8)")
    dropout: float | None = _f(None, "hidden and attention dropout (default: the model's config, 0.1 for BERT)")
    grad_accumulation: int = _f(1, "micro-batches per optimizer step")
    precision: str = _f("auto", "fp32, bf16 or auto (bf16 on GPUs that support it)")
    seed: int = _f(0, "seed of the head's initialisation, data order and dropout")
    metric: str | None = _f(None, "dev metric that picks the best epoch (default: the task's main metric)")
    text_column: str = _f("text", "classify: column (key) of the text")
    pair_column: str | None = _f(None, "classify: column (key) of the second text of a pair")
    label_column: str = _f("label", "classify: column (key) of the label")
    regression: bool = _f(False, "classify: the label is a number (mean squared error, Pearson/Spearman)")
    lm_weight: float = _f(0.5, "causal (GPT-style) models, glue/classify: weight of GPT-1's auxiliary language-"
                               "modelling loss on the task's inputs during fine-tuning (0 = off)")
    column: int | None = _f(None, "ner: the CoNLL column of the tags, from 0 = the word (default: the last; "
                                  "CoNLL-2003: 1 POS, 2 chunks, 3 entities)")
    scheme: str = _f("auto", "ner: auto (entity tags, IOB1/BIO/IOBES as the training file has them; entity F1) or "
                             "none (a plain tag set such as POS, each tag a label; token accuracy)")
    # the task files' format (bertkit.data.readers): every kind reads tables as well as its own layout
    format: str | None = _f(None, "the task files' format: tsv, csv, jsonl, json, parquet, arrow, datasets (a "
                                  "save_to_disk directory), or the kind's own: conll (ner), squad, swag (CSV); "
                                  "default: from the path")
    records: str | None = _f(None, "JSON files: the key whose list holds the records (dotted for nested keys); "
                                   "default: the file is a list of records")
    tokens_column: str = _f("tokens", "ner, tables: column of each sentence's list of words")
    tags_column: str = _f("ner_tags", "ner, tables: column of each sentence's list of tags (strings, or integers "
                                      "named by the column's ClassLabel names as datasets stores them)")
    save_every: int = _f(0, "write a resume checkpoint every N steps (0 = every epoch)")
    log_every: int = _f(10, "write a training metrics line every N steps")
    frozen: bool = _f(False, "feature-based: the encoder's weights stay fixed and only a task model on its layers "
                             "trains (--layers, --combine, --task-model); the layers are computed once per input")
    layers: str | None = _f(None, "frozen / bilstm task model: the encoder layers it reads, comma-separated "
                                  "(0 = embeddings or ELMo's token layer, -1 = last; write --layers=-1,-2,-3,-4) "
                                  "or all (default: all when frozen, else the last)")
    combine: str | None = _f(None, "frozen / bilstm task model: concat, sum or scalar-mix (ELMo's learned "
                                   "softmax-weighted sum times a scale) of the chosen layers (default scalar-mix; "
                                   "concat for --task-model logistic, which has no mix)")
    task_model: str = _f("linear", "linear (the family's usual head; with --frozen a linear layer on the combined "
                                   "layers), bilstm (a 2-layer BiLSTM, then the head; without --frozen it trains the "
                                   "encoder too) or logistic (--frozen classifiers: L2-regularised logistic "
                                   "regression on the standardised mean and max of the layers, fitted to "
                                   "convergence by L-BFGS; the learning rate, epochs, batch size and warm-up do not "
                                   "apply)")
    logistic_c: float = _f(1.0, "--task-model logistic: inverse L2 strength C, as scikit-learn's "
                                "LogisticRegression")
    words: str | None = _f(None, "ELMo: how text splits into words, whitespace (a released ELMo's default, as "
                                 "bilm-tf and AllenNLP read it) or bert (BERT's pre-tokenizer, bertkit's own ELMo "
                                 "directories' default); the fine-tuned directory keeps it")
    lstm_hidden: int = _f(256, "bilstm task model: hidden size of each direction")
    mix_layer_norm: bool = _f(False, "scalar mix: normalise each layer first (the ELMo paper's variant)")
    feature_cache: str | None = _f(None, "frozen: where the encoder's layers are kept once computed: memory "
                                         "(default), off (run the encoder every step), or a .safetensors file "
                                         "reused by later runs on the same model")
    # embed (bertkit.tasks.embed): contrastive training of an embedding model
    negative_column: str | None = _f(None, "embed: column(s) (keys) of hard negatives, comma-separated (default: "
                                           "negative, or negative_1, negative_2, ... as `bertkit mine` writes)")
    min_score: float | None = _f(None, "embed: keep only training pairs scoring at least this (STS-B: 4.0)")
    pooling: str | None = _f(None, "embed: pooling (cls, mean, max, last, weighted-mean; default: the directory's "
                                   "sentence-transformers pooling, else mean)")
    normalize: bool | None = _f(None, "embed: L2-normalise the embeddings (default: as the directory says)")
    scale: float = _f(20.0, "embed: in-batch negatives' scale on the cosine (1 / temperature)")
    symmetric: bool = _f(False, "embed: add the positives' side to the in-batch loss (symmetric InfoNCE)")
    mini_batch_size: int | None = _f(None, "embed: cached in-batch negatives (GradCache): the loss over the whole "
                                           "batch, activations held for at most N x W padded tokens at a time (W: "
                                           "the batch's longest text), the same gradients")
    gather_negatives: bool = _f(True, "embed under torchrun: every rank's texts are in-batch negatives of every "
                                      "anchor, as in one process over the global batch (false: each rank's own)")
    matryoshka_dims: str | None = _f(None, "embed: train these prefixes of the vector too, comma-separated "
                                           "(Matryoshka: 384,256,128,64); saved in the model directory")
    window: int | None = _f(None, "embed: training and dev texts longer than this many tokens are pooled from "
                                  "overlapping windows (as `features --window`), not cut at max_seq_length")
    stride: int | None = _f(None, "embed: --window's text tokens between window starts (default: half)")
    query_prompt: str | None = _f(None, "embed: text put before every query (anchor), saved as the directory's "
                                        "`query` prompt")
    document_prompt: str | None = _f(None, "embed: text put before every document (positive, negative), saved as "
                                           "the directory's `document` prompt")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto")
    workers: int | None = _f(None, "processes that collate the training batches beside the training process (0: in "
                                   "it; the batches are the same either way); default 1 on a GPU, 0 on the CPU")
    progress: bool = _f(True, "show a progress bar")

    def __post_init__(self) -> None:
        # Each check raises ValueError naming the field (the option): the kind and task, the numbers, the choices,
        # then the embed family's options.
        self._check_kind()
        self._check_numbers()
        self._check_choices()
        self._check_embed()

    def _check_kind(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"unknown fine-tuning kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.words not in (None, "whitespace", "bert"):
            raise ValueError(f"--words must be whitespace or bert, got {self.words!r}")
        if self.kind == "glue" and self.task is None:
            raise ValueError("glue fine-tuning needs the task name (--task cola, sst2, mrpc, ...)")
        if self.task is not None and self.kind == "glue":
            canonical_task(self.task)  # raises with the list of tasks

    def _check_numbers(self) -> None:
        positive = ("doc_stride", "max_query_length", "max_answer_length", "n_best_size", "batch_size",
                    "eval_batch_size", "grad_accumulation", "log_every")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.max_seq_length is not None and self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8, got {self.max_seq_length}")
        if self.max_target_length is not None and self.max_target_length < 2:
            raise ValueError(f"max_target_length must be at least 2 (a token and EOS), got {self.max_target_length}")
        # NaN fails every comparison and infinity passes the lower bounds: finiteness first.
        check_finite(self, ("epochs", "learning_rate", "adam_epsilon", "weight_decay", "max_grad_norm", "warmup_ratio",
                            "lm_weight", "logistic_c")
                     + (("dropout",) if self.dropout is not None else ()))
        for name in ("epochs", "learning_rate", "adam_epsilon", "logistic_c"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name, zero in (("weight_decay", "none"), ("max_grad_norm", "no clipping"), ("lm_weight", "off")):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative (0 = {zero}), got {getattr(self, name)}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.column is not None and (isinstance(self.column, bool) or not isinstance(self.column, int)
                                        or self.column < 1):
            raise ValueError(f"column must be a tag column of at least 1 (column 0 is the word), got {self.column!r}")

    def _check_choices(self) -> None:
        if self.scheme not in ("auto", "none"):
            raise ValueError(f"scheme must be auto or none, got {self.scheme!r}")
        if self.optimizer not in ("adamw", "lamb"):
            raise ValueError(f"optimizer must be adamw or lamb, got {self.optimizer!r}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.batch_size % self.grad_accumulation:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accumulation "
                             f"{self.grad_accumulation}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision must be fp32, bf16 or auto, got {self.precision!r}")
        if self.save_every < 0:
            raise ValueError(f"save_every must be 0 (every epoch) or positive, got {self.save_every}")
        if self.combine is not None and self.combine not in ("concat", "sum", "scalar-mix"):
            raise ValueError(f"combine must be concat, sum or scalar-mix, got {self.combine!r}")
        if self.task_model not in ("linear", "bilstm", "logistic"):
            raise ValueError(f"task_model must be linear, bilstm or logistic, got {self.task_model!r}")
        if self.task_model == "logistic":
            self._check_logistic()
        if self.lstm_hidden < 1:
            raise ValueError(f"lstm_hidden must be at least 1, got {self.lstm_hidden}")
        if self.feature_cache is not None and not self.frozen:
            raise ValueError("--feature-cache keeps a frozen encoder's layers; add --frozen")

    def _check_embed(self) -> None:
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number, got {self.scale!r}")
        if self.mini_batch_size is not None and (isinstance(self.mini_batch_size, bool)
                                                 or not isinstance(self.mini_batch_size, int)
                                                 or self.mini_batch_size < 1):
            raise ValueError(f"mini_batch_size must be an integer of at least 1, got {self.mini_batch_size!r}")
        if self.matryoshka_dims is not None:
            self.dims()  # raises naming the option
        if self.stride is not None and self.window is None:
            raise ValueError("stride goes with window (--window N --stride S)")
        for name in ("window", "stride"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.pooling is not None:
            pooling_modes(self.pooling)  # raises naming the choices
        if self.bucket_window < 0:
            raise ValueError(f"bucket_window must be 0 (no length bucketing) or positive, got {self.bucket_window}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 0):
            raise ValueError(f"workers must be 0 (batches made in the training process) or more, got "
                             f"{self.workers!r}")

    def dims(self) -> tuple[int, ...]:
        """--matryoshka-dims as integers, largest first (empty when unset); ValueError for anything else."""
        if self.matryoshka_dims is None:
            return ()
        try:
            dims = [int(part) for part in str(self.matryoshka_dims).split(",")]
        except ValueError:
            dims = []
        if not dims or min(dims) < 1 or len(set(dims)) != len(dims):
            raise ValueError(f"matryoshka_dims must be distinct positive integers, comma-separated (384,256,128,64), "
                             f"got {self.matryoshka_dims!r}")
        return tuple(sorted(dims, reverse=True))

    def _check_logistic(self) -> None:
        """--task-model logistic fits a single-label classifier on a frozen encoder; ValueError otherwise (the
        family's role and a GLUE regression task are checked again where the model is built)."""
        if not self.frozen:
            raise ValueError("--task-model logistic fits a classifier on a frozen encoder: add --frozen")
        if self.kind is not None and self.kind not in ("classify", "glue"):
            raise ValueError(f"--task-model logistic fits a classifier (classify, glue), not for {self.kind}")
        if self.regression:
            raise ValueError("--task-model logistic fits a classifier, not for --regression")
        if self.combine == "scalar-mix":
            raise ValueError("--task-model logistic has no mix to learn: --combine concat or sum (default concat)")

    @property
    def layer_combine(self) -> str:
        """`combine`, or its default: concat for --task-model logistic (no mix parameters), else scalar-mix."""
        return resolved_combine(self.combine, self.task_model)

    @property
    def seq_length(self) -> int:
        """max_seq_length, or the kind's default (384 for SQuAD, else 128)."""
        return self.max_seq_length or (384 if self.kind == "squad" else 128)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolved_combine(combine: str | None, task_model: str) -> str:
    """FinetuneConfig.combine with its default filled in (also for a config dict read back from results.json, where
    runs before the default became task-dependent wrote scalar-mix)."""
    if combine is not None:
        return combine
    return "concat" if task_model == "logistic" else "scalar-mix"


def config_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, help) of every FinetuneConfig field, for the command line."""
    hints = typing.get_type_hints(FinetuneConfig)
    return [(f.name, hints[f.name], f.default, f.metadata.get("help", "")) for f in dataclasses.fields(FinetuneConfig)]


# ------------------------------------------------------------------------------------------------------------------
# Batches: dynamic padding, length bucketing and a resumable per-epoch shuffle
# ------------------------------------------------------------------------------------------------------------------
def _choices(feature: dict[str, Any]) -> int:
    """Number of choices of a multiple-choice feature (0 for any other)."""
    ids = feature["input_ids"]
    return len(ids) if ids and isinstance(ids[0], list) else 0


def feature_length(feature: dict[str, Any]) -> int:
    """Padded length a feature needs: its tokens, or the longest of its choices (multiple choice)."""
    ids = feature["input_ids"]
    return max(len(r) for r in ids) if _choices(feature) else len(ids)


def _padded(rows: Sequence[Sequence[int]], width: int, fill: int) -> torch.Tensor:
    """(len(rows), width) int64: each row at the start of its line, `fill` after it."""
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return torch.from_numpy(out)


def collate(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of features to the longest in it (dynamic padding).

    A feature has "input_ids" and "token_type_ids" (lists of T ints, or, for multiple choice, C such lists) and
    optionally "label" (int or float), "labels" (T ints, token classification), "start_position"/"end_position",
    "target_ids" (a text-to-text target, any length), "windows" and "window_pieces" (embed --window: its rows are
    the windows of its C texts, the k-th text's `windows[k]` of them, holding `window_pieces` text pieces each).
    Returns input_ids, token_type_ids, attention_mask as (B, T) or (B, C, T) int64 (windows: (R, T), R the windows
    of the batch, with "windows" (B, C) and "window_pieces" (R,) int64), plus "labels" (B,) or (B, T)
    (padding IGNORE_INDEX; for targets (B, L), L the longest target), "start_positions"/"end_positions" (B,).
    """
    choice = _choices(features[0]) > 0
    windows = features[0].get("windows") is not None
    rows = [row for f in features for row in (f["input_ids"] if choice else [f["input_ids"]])]
    types = [row for f in features for row in (f["token_type_ids"] if choice else [f["token_type_ids"]])]
    T = max(len(r) for r in rows)
    # Filled as numpy arrays and wrapped once: a torch op per row costs more than the row (a few us each)
    ids, token_types = _padded(rows, T, pad_id), _padded(types, T, 0)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    mask = torch.from_numpy((np.arange(T)[None, :] < lengths[:, None]).astype(np.int64))
    if choice and not windows:  # (B*C, T) -> (B, C, T); windows stay flat rows (R, T)
        shape = (len(features), len(features[0]["input_ids"]), T)
        ids, token_types, mask = ids.view(shape), token_types.view(shape), mask.view(shape)
    batch = {"input_ids": ids, "token_type_ids": token_types, "attention_mask": mask}
    if windows:
        batch["windows"] = torch.tensor([f["windows"] for f in features], dtype=torch.long)
        batch["window_pieces"] = torch.tensor([n for f in features for n in f["window_pieces"]], dtype=torch.long)
    first = features[0]
    if first.get("labels") is not None:
        batch["labels"] = _padded([f["labels"] for f in features], T, IGNORE_INDEX)
    elif first.get("label") is not None:
        dtype = torch.float32 if isinstance(first["label"], float) else torch.long
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
    elif first.get("target_ids") is not None:  # text to text: the decoder's targets, padded to their own longest
        targets = [f["target_ids"] for f in features]
        batch["labels"] = _padded(targets, max(len(t) for t in targets), IGNORE_INDEX)
    if first.get("start_position") is not None:
        batch["start_positions"] = torch.tensor([f["start_position"] for f in features], dtype=torch.long)
        batch["end_positions"] = torch.tensor([f["end_position"] for f in features], dtype=torch.long)
    return batch


class EpochBatches:
    """Training micro-batches over a fixed list of features, reshuffled every epoch, resumable at any step.

    Epoch e visits the examples in the order `numpy.random.default_rng([seed, e]).permutation(N)`, cut into
    optimizer batches of `batch_size`. With `bucket_window` W > 0 (length bucketing), each run of W x batch_size
    consecutive examples of that order is first sorted by length (stably: equal lengths keep their random order),
    and the batches cut from it are then visited in an order drawn from the same generator. Each batch then holds
    examples of similar length, so dynamic padding adds little, while which lengths come when stays random; W
    bounds how far the sort reaches (W >= steps_per_epoch sorts the whole epoch).

    Each optimizer batch is split into `grad_accumulation x world_size` near-equal micro-batches (contiguous
    slices, so with bucketing each is as homogeneous as its batch), of which this rank yields its
    `grad_accumulation`: the global batch is the same however it is split. A last batch too small to split is
    dropped (the permutation's last examples, before any sorting: bucketing never changes an epoch's examples).
    The stream is endless (the trainer stops it) unless `stop_after_steps` is given. Every micro-batch carries
    under "_state" the position just after it; `load_state_dict` seeks there (an epoch's batches are a pure
    function of the seed, the epoch and the settings, so any position can be resumed).

    With `workers` > 0 the micro-batches are collated by worker processes (`bertkit.data.loader.worker_items`,
    the pretraining stream's hand-over), outside the process that runs the model; a rank's workers collate only
    that rank's rows, and the batches are the same as with 0 workers. A dead worker ends the run with one line
    (`DataError`); `--resume` continues exactly.
    """

    def __init__(self, features: Sequence[dict[str, Any]], pad_id: int, batch_size: int, seed: int,
                 grad_accumulation: int = 1, rank: int = 0, world_size: int = 1,
                 stop_after_steps: int | None = None, bucket_window: int = 0, workers: int = 0,
                 pin_memory: bool = False, prefetch: int = 4) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be 0 (batches made in the training process) or more, got {workers!r}")
        self.features, self.pad_id, self.seed = features, pad_id, seed
        self.workers, self.pin_memory, self.prefetch = workers, pin_memory, prefetch
        self.batch_size, self.accumulation = batch_size, grad_accumulation
        self.rank, self.world_size = rank, world_size
        self.parts = grad_accumulation * world_size
        if batch_size < self.parts:
            raise ValueError(f"batch_size {batch_size} is smaller than grad_accumulation x processes ({self.parts})")
        if bucket_window < 0:
            raise ValueError(f"bucket_window must be 0 (no length bucketing) or positive, got {bucket_window}")
        full, rest = divmod(len(features), batch_size)
        self.steps_per_epoch = full + (1 if rest >= self.parts else 0)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(features)} training examples make no batch of {batch_size}")
        self.bucket_window = bucket_window
        self.lengths = np.array([feature_length(f) for f in features], dtype=np.int64) if bucket_window else None
        self.stop_after_steps = stop_after_steps
        self.position = {"epoch": 0, "step": 0, "micro": 0}
        self.examples_yielded = 0  # by this rank, since construction (for throughput)
        self.tokens_yielded = 0  # real (unpadded) tokens of those examples
        self._cached: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches): one sort per epoch

    @property
    def steps_done(self) -> int:
        """Optimizer steps whose micro-batches have all been handed out."""
        return self.position["epoch"] * self.steps_per_epoch + self.position["step"]

    def state_dict(self) -> dict[str, int]:
        return dict(self.position)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = {"epoch": int(state["epoch"]), "step": int(state["step"]), "micro": int(state["micro"])}

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The optimizer batches of `epoch` in visiting order: steps_per_epoch arrays of example indices."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch])
        # The examples of an epoch do not depend on bucketing: a dropped last batch is the permutation's tail.
        order = rng.permutation(len(self.features))[:self.steps_per_epoch * self.batch_size]
        if self.bucket_window:
            window = np.arange(len(order)) // (self.bucket_window * self.batch_size)
            order = order[np.lexsort((self.lengths[order], window))]  # by window, then length; lexsort is stable
        batches = [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(self.steps_per_epoch)]
        if self.bucket_window:  # sorted batches run short to long within each window: shuffle which comes when
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cached = (epoch, batches)
        return batches

    def _micro_batches(self, epoch: int, step: int) -> list[np.ndarray]:
        parts = np.array_split(self.epoch_batches(epoch)[step], self.parts)
        return parts[self.rank * self.accumulation:(self.rank + 1) * self.accumulation]

    def planned(self) -> Iterator[tuple[np.ndarray, dict[str, int]]]:
        """(example indices of a micro-batch, the position just after it), from the current position on: what
        this rank yields, without collating anything."""
        epoch, step, micro = self.position["epoch"], self.position["step"], self.position["micro"]
        while self.stop_after_steps is None or epoch * self.steps_per_epoch + step < self.stop_after_steps:
            indices = self._micro_batches(epoch, step)[micro]
            micro += 1
            if micro == self.accumulation:
                micro, step = 0, step + 1
                if step == self.steps_per_epoch:
                    epoch, step = epoch + 1, 0
            yield indices, {"epoch": epoch, "step": step, "micro": micro}

    def make(self, indices: np.ndarray, position: dict[str, int], pin: bool = False) -> dict[str, Any]:
        """The micro-batch of `indices` (`collate`), carrying `position` under "_state"; `pin`: its tensors in
        pinned memory (a copy to the GPU from pageable memory may wait for the device's queue to drain)."""
        batch = collate([self.features[i] for i in indices], self.pad_id)
        if pin:
            batch = {k: v.pin_memory() for k, v in batch.items()}
        batch["_state"] = dict(position)
        return batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This rank's micro-batches from the current position on: collated here, or with `workers` > 0 by worker
        processes (micro-batch k by worker k mod workers, handed over as one flat array each), the same batches
        either way; in pinned memory when `pin_memory` (a CUDA run: the trainer's copy is then non-blocking)."""
        if self.workers > 0:
            made: Iterator[dict[str, Any]] = self._from_workers()
        else:
            made = (self.make(indices, position, self.pin_memory) for indices, position in self.planned())
        try:
            for batch in made:
                self.position = dict(batch["_state"])
                self.examples_yielded += len(batch["windows"] if "windows" in batch else batch["input_ids"])
                self.tokens_yielded += int(batch["attention_mask"].sum())
                yield batch
        finally:
            made.close()  # worker processes end with the iteration

    def _from_workers(self) -> Iterator[dict[str, Any]]:
        items = worker_items(_WorkerBatches(self), self.workers, self.prefetch, self.seed, self.rank)
        try:
            for item in items:
                yield unpack_pinned(item) if self.pin_memory else unpack_batch(item)
        finally:
            items.close()


class _WorkerBatches(torch.utils.data.IterableDataset):
    """The DataLoader's view of an `EpochBatches`: worker w collates micro-batches w, w + n, w + 2n, ... (n
    workers) of the plan from the stream's position; the DataLoader hands the workers' items out round robin, so
    they arrive in the plan's order."""

    def __init__(self, stream: EpochBatches) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[tuple]:
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        for k, (indices, position) in enumerate(self.stream.planned()):
            if k % n == w:
                yield pack_batch(self.stream.make(indices, position))


# ------------------------------------------------------------------------------------------------------------------
# Forward passes over many features (evaluation and prediction)
# ------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def forward_all(model, features: Sequence[dict[str, Any]], pad_id: int, batch_size: int) -> list[np.ndarray]:
    """Logits of every feature, as float32 numpy arrays in input order: (C,) per sequence or choice set, (T_i, C)
    per token (T_i = the feature's own length, padding cut off).

    Batches are formed by length to pad little; multiple-choice features are batched only with features of the
    same number of choices, so inputs may have any number each.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: (_choices(features[i]), feature_length(features[i])))
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) == batch_size or _choices(features[batches[-1][0]]) != _choices(features[i]):
            batches.append([])
        batches[-1].append(i)
    out: list[np.ndarray | None] = [None] * len(features)
    for chosen in batches:
        batch = collate([{k: features[i][k] for k in ("input_ids", "token_type_ids")} for i in chosen], pad_id)
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                       batch["token_type_ids"].to(device)).logits.float().cpu().numpy()
        for row, i in enumerate(chosen):
            per_token = logits.ndim == 3 and not _choices(features[i])
            out[i] = logits[row, :len(features[i]["input_ids"])] if per_token else logits[row]
    return out  # type: ignore[return-value]


@torch.no_grad()
def generate_all(model, features: Sequence[dict[str, Any]], pad_id: int, batch_size: int,
                 max_new_tokens: int) -> list[np.ndarray]:
    """Greedy generations of an encoder-decoder (`generate`) for every feature's input, in input order: int64
    arrays of the generated token ids, the decoder's start token, EOS and what follows it left out. Batches are
    formed by length, as in `forward_all`."""
    device = next(model.parameters()).device
    eos = model.config.eos_token_id
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    out: list[np.ndarray | None] = [None] * len(features)
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        batch = collate([{k: features[i][k] for k in ("input_ids", "token_type_ids")} for i in chosen], pad_id)
        generated = model.generate(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                   max_new_tokens=max_new_tokens)[:, 1:].cpu().numpy()  # (B, n) after the start
        for row, i in enumerate(chosen):
            ids = generated[row]
            ends = np.flatnonzero(ids == eos)
            out[i] = ids[:ends[0]] if len(ends) else ids
    return out  # type: ignore[return-value]


def model_outputs(family: TaskFamily, model, features: Sequence[dict[str, Any]], pad_id: int,
                  batch_size: int) -> list[np.ndarray]:
    """What a family's `evaluate` and `predictions` read: logits (`forward_all`), or for a family that generates
    (text to text) the greedy generations (`generate_all`, up to the family's max_new_tokens)."""
    if getattr(family, "generates", False):
        return generate_all(model, features, pad_id, batch_size, family.max_new_tokens)
    return forward_all(model, features, pad_id, batch_size)


# ------------------------------------------------------------------------------------------------------------------
# Model directories: tokenizer, positions, task model, task file
# ------------------------------------------------------------------------------------------------------------------
def load_task_model(cls, model_dir: str | Path, new_heads: bool = False, dropout: float | None = None, **kwargs):
    """`cls.from_pretrained(model_dir)` with a fresh head, optionally rebuilt with other dropout probabilities.

    The checkpoint code explains a head that does not fit (another number of labels, say); the message is kept
    and told how to replace the head from the command line too.
    """
    try:
        model = cls.from_pretrained(model_dir, new_heads=new_heads, **kwargs)
    except HeadMismatchError as err:
        raise HeadMismatchError(f"{err} (bertkit finetune: --new-head)") from None
    if dropout is not None:
        config = with_dropout(model.config, dropout)
        own = {k: getattr(model, k) for k in ("num_labels", "labels", "regression") if k in kwargs}
        rebuilt = cls(config, **own)
        rebuilt.load_state_dict(model.state_dict())
        model = rebuilt
    return model


def with_dropout(config, dropout: float):
    """`config` with every dropout probability of its architecture set to `dropout`: BERT's hidden and attention
    dropout, ModernBERT's embedding, attention, feed-forward and classifier dropout, T5's dropout rate (the config
    fields whose name says dropout)."""
    names = [f.name for f in dataclasses.fields(config) if "dropout" in f.name
             and isinstance(getattr(config, f.name), float)]
    return dataclasses.replace(config, **{name: dropout for name in names})


def save_best(family: TaskFamily, run_dir: Path, dev_examples, output, model, tokenizer) -> None:
    """The best epoch so far: dev predictions and run_dir/model (weights, the tokenizer, task file)."""
    with disk_full_as_error(run_dir, None):  # the family's predictions file: a full disk names the run directory
        family.write_predictions(run_dir, dev_examples, output)
    model.save_pretrained(run_dir / "model", tokenizer=tokenizer)
    atomic_write(run_dir / "model" / TASK_FILE, json.dumps(family.task_info(), indent=2) + "\n")


# ------------------------------------------------------------------------------------------------------------------
# The run: data, epochs, evaluation records
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class TaskData:
    """A task run's data, as `load_task_data` prepares it."""

    kind: str
    config: FinetuneConfig  # with kind set and max_seq_length cut to the model's positions when it was the default
    family: TaskFamily
    model_dir: ModelDir  # the model directory the run starts from (the teacher's, for distillation)
    tokenizer: Any  # the model directory's, of any kind
    metric: str  # the dev metric that picks the best epoch
    train_examples: list
    dev_examples: list
    train_features: list[dict[str, Any]]
    dev_features: list[dict[str, Any]]


def load_task_data(kind: str, model_dir: str | os.PathLike, train_path, dev_path,
                   config: FinetuneConfig | None = None, who: str = "model") -> TaskData:
    """Read a task's training and dev files into features for the model directory's tokenizer.

    kind: a key of `bertkit.tasks.KINDS`; config: its `kind` is set from `kind`; max_seq_length, when unset,
    becomes the kind's default cut to what the model has; a longer one is refused (ValueError naming the `who`).
    The family is `task_family`'s: the kind's own, or text to text for a T5 directory.
    The training file is read first (it fixes the labels); ValueError when config.metric is not one the family
    reports.
    """
    config = dataclasses.replace(config or FinetuneConfig(kind=kind), kind=kind)
    model_dir = ModelDir.open(model_dir)
    family_class = task_family(kind, model_dir, "finetune" if who == "model" else "distill")
    tokenizer = model_dir.tokenizer(who, config.words)
    positions = model_dir.max_positions
    if config.max_seq_length is None and config.seq_length > positions:
        config = dataclasses.replace(config, max_seq_length=positions)  # the default, cut to what the model has
    if config.seq_length > positions:
        raise ValueError(f"max_seq_length {config.seq_length} is longer than the {who}'s max_position_embeddings "
                         f"({positions}, {model_dir})")
    if config.window is not None and config.window > positions:
        raise ValueError(f"--window {config.window} is longer than the {who}'s max_position_embeddings ({positions}, "
                         f"{model_dir})")
    family = family_class(config)
    train_examples = family.read(train_path, training=True)
    dev_examples = family.read(dev_path, training=False)
    metric = config.metric or family.main_metric
    if metric not in family.metric_names:
        raise ValueError(f"--metric {metric!r} is not reported for {kind}; choose one of {list(family.metric_names)}")
    train_features = family.features(train_examples, tokenizer, training=True)
    dev_features = family.features(dev_examples, tokenizer, training=False)
    return TaskData(kind, config, family, model_dir, tokenizer, metric, train_examples, dev_examples, train_features,
                    dev_features)


def task_family(kind: str, model_dir: str | os.PathLike | ModelDir, verb: str = "finetune") -> type[TaskFamily]:
    """The family that fine-tunes `model_dir` for `kind`: the kind's own (`family_for`), or for an encoder-decoder
    (T5) the text-to-text family (`bertkit.tasks.text2text`), which takes glue, classify and squad; ValueError
    naming the verb, the kind and the model type for another kind, and for the matrix's refused cells
    (`bertkit.tasks.base.REFUSED`), before any task file is read."""
    model_dir = ModelDir.open(model_dir)
    message = refusal(matrix_family(model_dir.raw), kind, f"bertkit {verb} {kind}")
    if message is not None:
        raise ValueError(message)
    if model_dir.text_to_text:
        if verb == "distill":
            raise ValueError(f"bertkit distill {kind}: {model_dir} holds a {model_dir.model_type} model (model_type "
                             f"{model_dir.model_type}); distillation takes encoder models (BERT, ModernBERT)")
        return text_to_text_family(kind, model_dir.model_type, verb)
    return family_for(kind)


def epoch_train_config(config: FinetuneConfig, steps_per_epoch: int):
    """The trainer's settings for a task run: `config.epochs` epochs of `steps_per_epoch` steps, evaluated (and
    checkpointed, unless `save_every` says otherwise) at every epoch's end. Shared by fine-tuning and distillation."""
    return TrainConfig(
        max_steps=max(1, round(config.epochs * steps_per_epoch)), learning_rate=config.learning_rate,
        warmup_steps=0, warmup_ratio=config.warmup_ratio, weight_decay=config.weight_decay, optimizer=config.optimizer,
        max_grad_norm=config.max_grad_norm, adam_epsilon=config.adam_epsilon,
        grad_accumulation=config.grad_accumulation, precision=config.precision, log_every=config.log_every,
        eval_every=steps_per_epoch, save_every=config.save_every or steps_per_epoch, keep_last=1, seed=config.seed,
        device=config.device, progress=config.progress)


def task_workers(workers: int | None, device: torch.device) -> int:
    """The worker processes that collate a task run's batches: `workers`, or by default 1 on a GPU (one worker
    collates a fine-tuning batch (SST-2, 32 sentences) in about 0.3 ms, ahead of the step, outside the process
    that launches the GPU's kernels) and none on the CPU, where a worker would take a core from the model's step."""
    if workers is not None:
        return workers
    return 1 if device.type == "cuda" else 0


def resume_history(run_dir: Path, resume: bool, metric: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(evaluations so far, the best of them) for a resumed run: eval.jsonl up to the newest checkpoint's step;
    nothing for a fresh run."""
    checkpoint = latest_checkpoint(run_dir) if resume else None
    path = run_dir / "eval.jsonl"
    if checkpoint is None or not path.is_file():
        return [], None
    up_to_step = resume_state_step(checkpoint)
    # Written whole and atomically (record_evaluation), but a file from an older version may end in a torn line.
    records = [record for _, record in read_json_lines(path)[0]]
    history = [r for r in records if r["step"] <= up_to_step]
    return history, (max(history, key=lambda r: r[metric]) if history else None)


def record_evaluation(run_dir: Path, history: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    """`history` with `record` in place of any earlier one of its step, rewritten to run_dir/eval.jsonl."""
    history = [r for r in history if r["step"] != record["step"]] + [record]
    # Atomically: a full disk names the file and leaves the previous history whole for --resume.
    atomic_write(run_dir / "eval.jsonl", "".join(json.dumps(r, default=float) + "\n" for r in history))
    return history


def train_and_report(model, objective, stream, train_config, run_dir: Path, evaluate, resume: bool, dist_info,
                     device, runs: _Evaluations) -> None:
    """The shared training loop for a task run, then the run's throughput (evaluation time excluded) into
    results.json through `runs.write_results`; ends the process group of a distributed run."""
    started = time.perf_counter()
    result = train(model, objective, stream, train_config, run_dir, evaluate=evaluate, resume=resume,
                   dist_info=dist_info, device=device)
    train_seconds = max(time.perf_counter() - started - runs.eval_s, 1e-9)
    if dist_info.is_main:
        runs.write_results({"steps": result.step, "stopped_by": result.stopped_by,
                       "train_seconds": round(train_seconds, 3),
                       "train_examples_per_s": stream.examples_yielded * dist_info.world_size / train_seconds,
                       "train_tokens_per_s": stream.tokens_yielded * dist_info.world_size / train_seconds,
                       "final_train_metrics": result.last_metrics})
    end_distributed()


def run_task(data: TaskData, model, objective, run_dir: str | os.PathLike, *, dist_info, device,
             resume: bool = False, stop_after_steps: int | None = None,
             extra_features: Sequence[dict[str, Any]] = (),
             evaluated: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
             extra_metrics: Callable[[Any], dict[str, float]] | None = None,
             summary: dict[str, Any] | None = None, resolved: dict[str, Any] | None = None,
             banner: Callable[[int, int], str] | None = None,
             fit: Callable[[torch.nn.Module], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Train for config.epochs epochs with a dev evaluation at every epoch's end, keeping the best epoch.

    Args:
        data: from `load_task_data`.
        model: what the trainer optimises; `evaluated(model)` is the task model evaluated and saved (default: the
            model itself).
        objective: the trainer task (the family's loss, or a distillation task).
        run_dir: metrics.jsonl, eval.jsonl, checkpoints/, model/ (the best epoch's), results.json, config.yaml,
            the dev predictions.
        extra_features: more training features after the task's own (a distillation transfer set).
        extra_metrics: output of the family's evaluate -> more dev metrics (recorded and shown, never the metric).
        summary: the fields results.json starts with (what was run on what); resolved: config.yaml's, to which
            the trainer's settings and the world size are added; banner(max_steps, steps_per_epoch): the line
            printed before training.
        resume, stop_after_steps: continue from run_dir's newest checkpoint; stop early as if interrupted.
        fit: instead of the trainer, fit(model) fits the model at once on `device` (a full-batch fit such as
            --task-model logistic's; the batch settings and the schedule do not apply) and returns facts for
            results.json "fit"; one dev evaluation follows, recorded as epoch 1 (step 0), "steps" 0.
    Returns:
        The content of results.json: summary, then "labels", "metric", example counts, "steps_per_epoch",
        "max_steps", "epochs" (every evaluation), "best", "data" (the readers' counts), "config", and at the end
        the run's steps and throughput.
    """
    run_dir = Path(run_dir)
    config = data.config
    if fit is None:
        stream = EpochBatches([*data.train_features, *extra_features], data.tokenizer.pad_id, config.batch_size,
                              config.seed, config.grad_accumulation, dist_info.rank, dist_info.world_size,
                              stop_after_steps, bucket_window=config.bucket_window,
                              workers=task_workers(config.workers, device), pin_memory=device.type == "cuda")
        train_config = epoch_train_config(config, stream.steps_per_epoch)
        steps_per_epoch, max_steps = stream.steps_per_epoch, train_config.max_steps
    else:  # a fit at once: no batches, no steps
        stream, train_config, steps_per_epoch, max_steps = None, None, 0, 0
    runs = _Evaluations(data, run_dir, evaluated or (lambda m: m), extra_metrics, summary or {}, dist_info.is_main,
                        stream, steps_per_epoch, max_steps, *resume_history(run_dir, resume, data.metric))
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        written = {**(resolved or {}), "world_size": dist_info.world_size,
                   **({"train_config": dataclasses.asdict(train_config)} if train_config is not None else {})}
        atomic_write(run_dir / "config.yaml", yaml.safe_dump(written, sort_keys=False))
        if banner is not None:
            print(banner(max_steps, steps_per_epoch), flush=True)
    if fit is None:
        train_and_report(model, objective, stream, train_config, run_dir, runs.at_epoch_end, resume, dist_info,
                         device, runs)
    else:
        started = time.perf_counter()
        facts = fit(model.to(device))
        fit_seconds = time.perf_counter() - started
        if dist_info.is_main:
            runs.evaluate_at(model, 0, 1)
            runs.write_results({"steps": 0, "stopped_by": "fit", "train_seconds": round(fit_seconds, 3),
                                "fit": facts})
        end_distributed()
    return dict(runs.results)


@dataclass
class _Evaluations:
    """A task run's dev evaluations (eval.jsonl, the best epoch's model directory and predictions) and its
    results.json, rewritten after each; see `run_task`."""

    data: TaskData
    run_dir: Path
    evaluated: Callable[[torch.nn.Module], torch.nn.Module]  # the trained model -> the task model to evaluate
    extra_metrics: Callable[[Any], dict[str, float]] | None
    summary: dict[str, Any]  # the fields results.json starts with
    is_main: bool
    stream: EpochBatches | None  # None for a fit at once
    steps_per_epoch: int
    max_steps: int
    history: list[dict[str, Any]]  # every evaluation so far
    best: dict[str, Any] | None
    eval_s: float = 0.0  # seconds spent evaluating (left out of the throughput)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    shown: list[str] = dataclasses.field(default_factory=list)  # the metrics printed, the family's first

    def __post_init__(self) -> None:
        self.shown = list(self.data.family.metric_names)

    def write_results(self, extra: dict[str, Any] | None = None) -> None:
        data, family = self.data, self.data.family
        self.results = {
            **self.summary, "labels": family.labels, "metric": data.metric,
            "train_examples": len(data.train_examples), "train_features": len(data.train_features),
            "dev_examples": len(data.dev_examples), "steps_per_epoch": self.steps_per_epoch,
            "max_steps": self.max_steps, "epochs": self.history, "best": self.best,
            **({"data": family.stats} if family.stats else {}), "config": data.config.to_dict(), **(extra or {})}
        atomic_write(self.run_dir / "results.json", json.dumps(self.results, indent=2, default=float) + "\n")

    def at_epoch_end(self, m) -> dict[str, float]:
        """The trainer's `evaluate`: whole epochs (and the end) only."""
        step = self.stream.steps_done
        if step % self.steps_per_epoch and step != self.max_steps:
            return {}  # an interrupted run's final evaluation: only whole epochs (and the end) are evaluated
        return self.evaluate_at(m, step, round(step / self.steps_per_epoch, 4))

    def evaluate_at(self, m, step: int, epoch: float) -> dict[str, float]:
        """Evaluate on dev, record it (the best epoch's model and predictions saved), print its line; the record's
        finite numbers."""
        data, family, metric = self.data, self.data.family, self.data.metric
        started = time.perf_counter()
        plain = self.evaluated(unwrap(m))
        logits = model_outputs(family, plain, data.dev_features, data.tokenizer.pad_id, data.config.eval_batch_size)
        metrics, output = family.evaluate(data.dev_examples, data.dev_features, logits)
        if self.extra_metrics is not None:
            more = self.extra_metrics(output)
            self.shown.extend(k for k in more if k not in self.shown)
            metrics.update(more)
        record = {"epoch": epoch, "step": step, **metrics}
        self.history = record_evaluation(self.run_dir, self.history, record)
        if self.best is None or record[metric] > self.best[metric] or self.best["step"] == step:
            self.best = record
            save_best(family, self.run_dir, data.dev_examples, output, plain, data.tokenizer)
        self.write_results()
        self.eval_s += time.perf_counter() - started
        if self.is_main:
            line = ", ".join(f"{k} {record[k]:.4f}" for k in self.shown if k in record)
            print(f"epoch {record['epoch']:g} (step {step}): {line}", flush=True)
        return {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and math.isfinite(v)}
