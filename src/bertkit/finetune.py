"""Fine-tuning driver: task file -> features -> model + fresh head -> THE trainer -> best model + official metrics.

One call, `finetune(kind, model_dir, train_path, dev_path, out_dir, config)`, does what the BERT paper's section 4
describes for every task family:

    kind      reader (bertkit.tasks)        model                              dev metric that picks the best epoch
    glue      glue.read_glue                BertForSequenceClassification      GLUE's first listed (CoLA mcc, STS-B
                                                                               pearson, MRPC/QQP accuracy, ...)
    classify  glue.read_table (CSV/TSV/     BertForSequenceClassification      accuracy (pearson with --regression)
              JSONL, your columns)
    ner       ner.read_conll                BertForTokenClassification         entity F1 (seqeval, conlleval mode)
    squad     squad.read_squad_with_stats   BertForQuestionAnswering           F1 (v1.1), best_f1 (v2.0)
    swag      swag.read_swag                BertForMultipleChoice              accuracy

Every epoch the model is evaluated on the dev file with the official metric; the best epoch's model is written
to OUT/model (a model directory with the tokenizer, loadable by transformers), its dev predictions beside it
(OUT/predictions.json and null_odds.json for SQuAD, in the official format; OUT/dev_predictions.txt or .conll
otherwise), and OUT/results.json holds every epoch's metrics, the best, the resolved config and the training
throughput. Training itself is `bertkit.trainer.train`: the task objects below only turn a batch into summed
losses, and `EpochBatches` is the resumable, per-epoch-shuffled, length-bucketed batch stream the trainer consumes.

`predict` (labels with probabilities, entity spans, answers, choices) and `evaluate_predictions` (metrics of a
predictions file against a data file, SQuAD with the official scripts' keys) complete the task side.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.config import field_with_help
from bertkit.errors import DataError
from bertkit.models import IGNORE_INDEX

KINDS = ("glue", "classify", "ner", "squad", "swag")
TASK_FILE = "finetune.json"  # written into a fine-tuned model directory: what `predict` needs besides the weights
_ARCHITECTURE_KINDS = {"BertForSequenceClassification": "classify", "BertForTokenClassification": "ner",
                       "BertForQuestionAnswering": "squad", "BertForMultipleChoice": "swag"}


_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)


@dataclass(frozen=True)
class FinetuneConfig:
    """How to fine-tune; the defaults are the BERT paper's (section 4 and appendix A.3)."""

    kind: str | None = _f(None, "task family: glue, classify, ner, squad or swag (set by `finetune`)")
    task: str | None = _f(None, "GLUE task name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli); glue only")
    max_seq_length: int | None = _f(None, "tokens per input, [CLS]/[SEP] included (default 128; SQuAD 384)")
    doc_stride: int = _f(128, "SQuAD: passage tokens between the starts of consecutive windows")
    max_query_length: int = _f(64, "SQuAD: question tokens kept")
    max_answer_length: int = _f(30, "SQuAD: longest answer span, in tokens")
    n_best_size: int = _f(20, "SQuAD: start and end candidates considered per window")
    epochs: float = _f(3.0, "passes over the training set (the paper: 2-4; SQuAD 2-3)")
    learning_rate: float = _f(5e-5, "peak learning rate (the paper's grid: 2e-5, 3e-5, 5e-5)")
    batch_size: int = _f(32, "examples per optimizer step (split into grad_accumulation micro-batches)")
    bucket_window: int = _f(50, "length bucketing: sort each window of this many batches of the shuffled training "
                                "set by length, cut the batches, then shuffle their order (less padding); 0 = off")
    eval_batch_size: int = _f(64, "examples per forward pass when evaluating and predicting")
    warmup_ratio: float = _f(0.1, "linear warm-up over this fraction of the steps, then linear decay to 0")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on biases and LayerNorm)")
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
    save_every: int = _f(0, "write a resume checkpoint every N steps (0 = every epoch)")
    log_every: int = _f(10, "write a training metrics line every N steps")
    device: str = _f("auto", "cpu, cuda, cuda:N or auto")
    progress: bool = _f(True, "show a progress bar")

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"unknown fine-tuning kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.kind == "glue" and self.task is None:
            raise ValueError("glue fine-tuning needs the task name (--task cola, sst2, mrpc, ...)")
        if self.task is not None and self.kind == "glue":
            from bertkit.tasks.metrics import canonical_task

            canonical_task(self.task)  # raises with the list of tasks
        positive = ("doc_stride", "max_query_length", "max_answer_length", "n_best_size", "batch_size",
                    "eval_batch_size", "grad_accumulation", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_seq_length is not None and self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8, got {self.max_seq_length}")
        if self.epochs <= 0:
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.adam_epsilon > 0.0:
            raise ValueError(f"adam_epsilon must be positive, got {self.adam_epsilon}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.batch_size % self.grad_accumulation:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accumulation "
                             f"{self.grad_accumulation}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision must be fp32, bf16 or auto, got {self.precision!r}")
        if self.save_every < 0:
            raise ValueError(f"save_every must be 0 (every epoch) or positive, got {self.save_every}")
        if self.bucket_window < 0:
            raise ValueError(f"bucket_window must be 0 (no length bucketing) or positive, got {self.bucket_window}")

    @property
    def seq_length(self) -> int:
        """max_seq_length, or the kind's default (384 for SQuAD, else 128)."""
        return self.max_seq_length or (384 if self.kind == "squad" else 128)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, help) of every FinetuneConfig field, for the command line."""
    hints = typing.get_type_hints(FinetuneConfig)
    return [(f.name, hints[f.name], f.default, f.metadata.get("help", "")) for f in dataclasses.fields(FinetuneConfig)]


# ------------------------------------------------------------------------------------------------------------------
# Batches: dynamic padding, length bucketing and a resumable per-epoch shuffle
# ------------------------------------------------------------------------------------------------------------------
def _length(feature: dict[str, Any]) -> int:
    """Padded length a feature needs: its tokens, or the longest of its choices (multiple choice)."""
    ids = feature["input_ids"]
    return max(len(r) for r in ids) if isinstance(ids[0], list) else len(ids)


def collate(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of features to the longest in it (dynamic padding).

    A feature has "input_ids" and "token_type_ids" (lists of T ints, or, for multiple choice, C such lists) and
    optionally "label" (int or float), "labels" (T ints, token classification), "start_position"/"end_position".
    Returns input_ids, token_type_ids, attention_mask as (B, T) or (B, C, T) int64, plus "labels" (B,) or (B, T)
    (padding -100), "start_positions"/"end_positions" (B,).
    """
    choice = isinstance(features[0]["input_ids"][0], list)
    rows = [row for f in features for row in (f["input_ids"] if choice else [f["input_ids"]])]
    types = [row for f in features for row in (f["token_type_ids"] if choice else [f["token_type_ids"]])]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    token_types = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, types)):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        token_types[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        mask[i, :len(r)] = 1
    if choice:  # (B*C, T) -> (B, C, T)
        shape = (len(features), len(features[0]["input_ids"]), T)
        ids, token_types, mask = ids.view(shape), token_types.view(shape), mask.view(shape)
    batch = {"input_ids": ids, "token_type_ids": token_types, "attention_mask": mask}
    first = features[0]
    if first.get("labels") is not None:
        labels = torch.full((len(features), T), IGNORE_INDEX, dtype=torch.long)
        for i, f in enumerate(features):
            labels[i, :len(f["labels"])] = torch.tensor(f["labels"], dtype=torch.long)
        batch["labels"] = labels
    elif first.get("label") is not None:
        dtype = torch.float32 if isinstance(first["label"], float) else torch.long
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
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
    """

    def __init__(self, features: Sequence[dict[str, Any]], pad_id: int, batch_size: int, seed: int,
                 grad_accumulation: int = 1, rank: int = 0, world_size: int = 1,
                 stop_after_steps: int | None = None, bucket_window: int = 0) -> None:
        self.features, self.pad_id, self.seed = features, pad_id, seed
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
        self.lengths = np.array([_length(f) for f in features], dtype=np.int64) if bucket_window else None
        self.stop_after_steps = stop_after_steps
        self.position = {"epoch": 0, "step": 0, "micro": 0}
        self.examples_yielded = 0  # by this rank, since construction (for throughput)
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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.stop_after_steps is None or self.steps_done < self.stop_after_steps:
            epoch, step, micro = self.position["epoch"], self.position["step"], self.position["micro"]
            indices = self._micro_batches(epoch, step)[micro]
            micro += 1
            if micro == self.accumulation:
                micro, step = 0, step + 1
                if step == self.steps_per_epoch:
                    epoch, step = epoch + 1, 0
            self.position = {"epoch": epoch, "step": step, "micro": micro}
            batch = collate([self.features[i] for i in indices], self.pad_id)
            batch["_state"] = dict(self.position)
            self.examples_yielded += len(indices)
            yield batch


# ------------------------------------------------------------------------------------------------------------------
# Trainer tasks: summed loss and metric of one micro-batch (see bertkit.trainer)
# ------------------------------------------------------------------------------------------------------------------
class SequenceClassificationTask:
    """Cross-entropy over labels (or squared error for regression) on [CLS]; also for multiple choice (B, C)."""

    def __init__(self, name: str = "cls", regression: bool = False) -> None:
        self.name, self.regression = name, regression

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {f"{self.name}_loss": float(batch["labels"].shape[0])}

    def __call__(self, model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        labels = batch["labels"]
        n = logits.new_tensor(float(labels.shape[0]))
        if self.regression:
            return {f"{self.name}_loss": (F.mse_loss(logits.squeeze(-1), labels.float(), reduction="sum"), n)}
        return {f"{self.name}_loss": (F.cross_entropy(logits, labels, reduction="sum"), n),
                f"{self.name}_accuracy": ((logits.argmax(-1) == labels).sum().float(), n)}


class TokenClassificationTask:
    """Cross-entropy on labelled tokens only (each word's first sub-word; -100 elsewhere)."""

    name = "ner"

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"ner_loss": float((batch["labels"] != IGNORE_INDEX).sum())}

    def __call__(self, model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        labels = batch["labels"]
        keep = labels != IGNORE_INDEX
        n = keep.sum().float()
        scores, gold = logits[keep], labels[keep]  # (N, num_labels), (N,)
        return {"ner_loss": (F.cross_entropy(scores, gold, reduction="sum"), n),
                "ner_accuracy": ((scores.argmax(-1) == gold).sum().float(), n)}


class SpanTask:
    """SQuAD: mean of start and end cross-entropies over window positions (0 = [CLS] = no answer here)."""

    name = "span"

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"span_loss": float(batch["start_positions"].shape[0])}

    def __call__(self, model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        start, end = batch["start_positions"], batch["end_positions"]
        loss = (F.cross_entropy(logits[..., 0], start, reduction="sum")
                + F.cross_entropy(logits[..., 1], end, reduction="sum")) / 2
        return {"span_loss": (loss, logits.new_tensor(float(start.shape[0])))}


# ------------------------------------------------------------------------------------------------------------------
# Forward passes over many features (evaluation and prediction)
# ------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def forward_all(model, features: Sequence[dict[str, Any]], pad_id: int, batch_size: int) -> list[np.ndarray]:
    """Logits of every feature, as float32 numpy arrays in input order: (C,) per sequence or choice set, (T_i, C)
    per token (T_i = the feature's own length, padding cut off). Batches are formed by length to pad little."""
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: _length(features[i]))
    out: list[np.ndarray | None] = [None] * len(features)
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        batch = collate([{k: features[i][k] for k in ("input_ids", "token_type_ids")} for i in chosen], pad_id)
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                       batch["token_type_ids"].to(device)).logits.float().cpu().numpy()
        for row, i in enumerate(chosen):
            ids = features[i]["input_ids"]
            per_token = logits.ndim == 3 and not isinstance(ids[0], list)
            out[i] = logits[row, :len(ids)] if per_token else logits[row]
    return out  # type: ignore[return-value]


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def encode_words(tokenizer, sentences: Sequence[Sequence[str]], max_length: int) -> list[dict[str, Any]]:
    """`[CLS] pieces of the words [SEP]`, truncated to max_length, with each token's word index (None: special).

    Words are the sentence's given words (CoNLL tokens): the tokenizer still splits them into word pieces (and
    on punctuation), and `word_ids` says which given word each piece came from.
    """
    encoded = tokenizer.encode_words(sentences)
    out = []
    for enc in encoded:
        n = min(len(enc.ids), max_length - 2)
        out.append({"input_ids": [tokenizer.cls_id, *enc.ids[:n], tokenizer.sep_id],
                    "token_type_ids": [0] * (n + 2),
                    "word_ids": [None, *enc.word_ids[:n], None]})
    return out


# ------------------------------------------------------------------------------------------------------------------
# Task families: reading, features, model, dev evaluation
# ------------------------------------------------------------------------------------------------------------------
class TaskFamily:
    """What differs between task families; `finetune` calls these in order.

        read(path, training)                 -> examples (the training file is read first: it fixes the labels)
        features(examples, tokenizer, training) -> model inputs: dicts of token-id lists (see `collate`)
        model_class(), model_kwargs()        -> the task model and its constructor arguments (labels)
        objective()                          -> the trainer task (summed loss of a micro-batch)
        evaluate(model, examples, features, pad_id) -> (dev metrics, predictions for write_predictions)
        write_predictions(out_dir, examples, predictions)  the best epoch's dev predictions, in the task's format
        task_info()                          -> what `predict` needs later, saved as MODEL/finetune.json
    """

    model_class_name = ""
    metric_names: tuple[str, ...] = ()  # what evaluate reports (scalars), any of which may pick the best epoch
    main_metric = ""  # the default of FinetuneConfig.metric

    def __init__(self, config: FinetuneConfig) -> None:
        self.config = config
        self.labels: list[str] | None = None  # class or tag names in id order (None: regression, QA, choice)
        self.stats: dict[str, Any] = {}  # what the readers counted, reported in results.json

    def read(self, path, training: bool) -> list:
        raise NotImplementedError

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        raise NotImplementedError

    def evaluate(self, model, examples, features, pad_id: int) -> tuple[dict[str, Any], Any]:
        raise NotImplementedError

    def write_predictions(self, out_dir: Path, examples, predictions) -> None:
        raise NotImplementedError

    def model_class(self):
        import bertkit.models as modeling

        return getattr(modeling, self.model_class_name)

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def objective(self):
        raise NotImplementedError

    def task_info(self) -> dict[str, Any]:
        """What goes into the model directory's finetune.json."""
        return {"kind": self.config.kind, "task": self.config.task, "max_seq_length": self.config.seq_length}


class ClassificationFamily(TaskFamily):
    """GLUE tasks and the user's CSV/TSV/JSONL classification or regression files."""

    model_class_name = "BertForSequenceClassification"

    def __init__(self, config: FinetuneConfig) -> None:
        super().__init__(config)
        if config.kind == "glue":
            from bertkit.tasks.glue import get_task

            self.spec = get_task(config.task)
            self.regression = self.spec.is_regression
            self.labels = None if self.regression else list(self.spec.labels)
            self.metric_names = self.spec.metrics
        else:
            self.spec = None
            self.regression = config.regression
            self.metric_names = ("pearson", "spearmanr", "mse") if self.regression else ("accuracy", "macro_f1")
        self.main_metric = self.metric_names[0]

    def read(self, path, training: bool) -> list:
        from bertkit.tasks.glue import read_glue, read_table

        c = self.config
        if self.spec is not None:
            examples = read_glue(self.spec.name, path)
        else:
            examples = read_table(path, c.text_column, c.pair_column, c.label_column, regression=self.regression,
                                  labels=None if training else self.labels)
            if training and not self.regression:
                self.labels = sorted({e.label for e in examples})
                if len(self.labels) < 2:
                    raise DataError.at(path, None, f"the training file has {len(self.labels)} distinct label(s) "
                                                   f"{self.labels}; classification needs at least 2")
        if examples and examples[0].label is None:
            raise DataError.at(path, None, "the file has no labels (a test file?); training and dev files need them")
        if not examples:
            raise DataError.at(path, None, "no examples")
        return examples

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        pairs = [e.pair for e in examples] if examples[0].pair is not None else None
        encoded = tokenizer.encode_batch([e.text for e in examples], pairs, max_length=self.config.seq_length)
        to_id = {name: i for i, name in enumerate(self.labels or [])}
        return [{"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids,
                 "label": float(e.label) if self.regression else to_id[e.label]}
                for enc, e in zip(encoded, examples)]

    def model_kwargs(self) -> dict[str, Any]:
        if self.regression:
            return {"num_labels": 1, "regression": True}
        return {"num_labels": len(self.labels), "labels": list(self.labels)}

    def objective(self):
        return SequenceClassificationTask("cls", self.regression)

    def metrics(self, logits: np.ndarray, gold: Sequence) -> dict[str, float]:
        if self.spec is not None:
            from bertkit.tasks.metrics import glue_metrics

            return glue_metrics(self.spec.name, logits, np.asarray(gold))
        return classification_metrics(logits[:, 0] if self.regression else logits.argmax(-1), gold,
                                      self.regression)

    def evaluate(self, model, examples, features, pad_id) -> tuple[dict[str, float], Any]:
        logits = np.stack(forward_all(model, features, pad_id, self.config.eval_batch_size))
        metrics = self.metrics(logits, [f["label"] for f in features])
        return metrics, logits

    def write_predictions(self, out_dir: Path, examples, logits) -> None:
        lines = ([f"{v:.6g}" for v in logits[:, 0]] if self.regression
                 else [self.labels[i] for i in logits.argmax(-1)])
        (out_dir / "dev_predictions.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        return {**super().task_info(), "regression": self.regression}


def classification_metrics(predictions: Sequence, gold: Sequence, regression: bool) -> dict[str, float]:
    """accuracy and macro-F1 of class ids (or names), or pearson, spearmanr and mse of numbers."""
    from bertkit.tasks.metrics import accuracy, pearson, spearman

    if regression:
        p, y = np.asarray(predictions, dtype=np.float64), np.asarray(gold, dtype=np.float64)
        return {"pearson": pearson(p, y), "spearmanr": spearman(p, y), "mse": float(np.mean((p - y) ** 2))}
    import sklearn.metrics

    p, y = np.asarray(predictions), np.asarray(gold)
    classes = sorted(set(y.tolist()) | set(p.tolist()))
    return {"accuracy": accuracy(p, y),
            "macro_f1": float(sklearn.metrics.f1_score(y, p, labels=classes, average="macro", zero_division=0.0))}


class TaggingFamily(TaskFamily):
    """CoNLL-style named-entity recognition: tags on each word's first sub-word (paper section 5.3).

    IOB1 files (CoNLL-2003 as distributed) are converted to BIO; the labels are "O" then B-/I- (IOBES files:
    B-/I-/E-/S-) of every entity type of the training file. A sentence longer than max_seq_length is cut: its
    last words get no training label and are predicted "O".
    """

    model_class_name = "BertForTokenClassification"
    metric_names = ("f1", "precision", "recall", "accuracy")
    main_metric = "f1"

    def read(self, path, training: bool) -> list:
        from bertkit.tasks.ner import iob1_to_bio, read_conll

        sentences = read_conll(path)
        if not sentences:
            raise DataError.at(path, None, "no sentences")
        iobes = any(t[0] in "ES" for s in sentences for t in s.tags)
        if training:
            self.scheme = "IOBES" if iobes else "BIO"
            kinds = sorted({t[2:] for s in sentences for t in s.tags if t != "O"})
            prefixes = "BIES" if iobes else "BI"
            self.labels = ["O"] + [f"{p}-{k}" for k in kinds for p in prefixes]
        known = set(self.labels)
        out = []
        for s in sentences:
            # CoNLL-2003 is IOB1; BIO (IOB2) is what the model learns. Valid BIO and IOBES pass through unchanged.
            tags = s.tags if self.scheme == "IOBES" else iob1_to_bio(s.tags)
            for i, (written, tag) in enumerate(zip(s.tags, tags)):
                if tag not in known:
                    raise DataError.at(path, s.line + i, f"unknown label {written!r}; the training file has "
                                                         f"{self.labels}")
            out.append((s.tokens, tags))
        return out

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        from bertkit.tasks.ner import align_labels

        to_id = {name: i for i, name in enumerate(self.labels)}
        encoded = encode_words(tokenizer, [words for words, _ in examples], self.config.seq_length)
        for feature, (words, tags) in zip(encoded, examples):
            feature["labels"] = align_labels(feature["word_ids"], tags, to_id)
        return encoded

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": len(self.labels), "labels": list(self.labels)}

    def objective(self):
        return TokenClassificationTask()

    def word_tags(self, logits: list[np.ndarray], features, examples) -> list[list[str]]:
        from bertkit.tasks.ner import decode_word_predictions

        out = []
        for scores, feature, (words, _) in zip(logits, features, examples):
            ids = decode_word_predictions(feature["word_ids"], scores.argmax(-1).tolist(), len(words),
                                          fill=self.labels.index("O"))
            out.append([self.labels[i] for i in ids])  # words cut off by max_seq_length are predicted "O"
        return out

    def evaluate(self, model, examples, features, pad_id):
        from bertkit.tasks.ner import ner_metrics

        logits = forward_all(model, features, pad_id, self.config.eval_batch_size)
        predicted = self.word_tags(logits, features, examples)
        metrics = ner_metrics([tags for _, tags in examples], predicted)
        return metrics, predicted

    def write_predictions(self, out_dir: Path, examples, predicted) -> None:
        # conlleval's layout: word, gold tag, predicted tag; a blank line between sentences.
        lines = []
        for (words, gold), tags in zip(examples, predicted):
            lines += [f"{w} {g} {p}" for w, g, p in zip(words, gold, tags)] + [""]
        (out_dir / "dev_predictions.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        return {**super().task_info(), "scheme": self.scheme}


class SquadFamily(TaskFamily):
    """SQuAD v1.1 / v2.0 extractive QA: windows of the passage, best span (or no answer) per question."""

    model_class_name = "BertForQuestionAnswering"

    def __init__(self, config: FinetuneConfig) -> None:
        super().__init__(config)
        self.version_2 = False
        self.null_threshold = 0.0

    @property
    def metric_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("exact", "f1", "best_exact", "best_f1", "best_f1_thresh") if self.version_2 else ("exact_match", "f1")

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return "best_f1" if self.version_2 else "f1"

    def read(self, path, training: bool) -> list:
        from bertkit.tasks.squad import read_squad_with_stats

        examples, stats = read_squad_with_stats(path)
        if not examples:
            raise DataError.at(path, None, "no questions")
        self.version_2 = self.version_2 or any(e.is_impossible for e in examples)
        self.stats["train" if training else "dev"] = {
            "articles": stats.articles, "questions": stats.examples, "answers": stats.answers,
            "impossible": stats.impossible, "answers_not_matching_context": len(stats.mismatches),
            "first_mismatches": [m.qid for m in stats.mismatches[:5]]}
        if stats.mismatches:
            print(f"{path}: {len(stats.mismatches)} of {stats.answers} answers do not match "
                  f"context[answer_start:answer_start+len(text)]; first question ids: "
                  f"{', '.join(m.qid for m in stats.mismatches[:5])}"
                  + (" (skipped for training)" if training else ""), flush=True)
        return examples

    def windows(self, examples, tokenizer, training: bool) -> tuple[list, int]:
        """Windows of every example; for training, examples whose answer does not match its context are skipped."""
        from bertkit.tasks.squad import make_windows

        c = self.config
        contexts = sorted({e.context for e in examples})
        encoded = tokenizer.encode_raw(contexts)
        by_context = {t: (enc.ids, enc.offsets) for t, enc in zip(contexts, encoded)}
        questions = tokenizer.encode_raw([e.question for e in examples])
        windows, skipped = [], 0
        for example, question in zip(examples, questions):
            answer = None
            if training and not example.is_impossible:
                if not example.answers:
                    skipped += 1
                    continue
                text, start = example.answers[0]
                if example.context[start:start + len(text)] != text:
                    skipped += 1  # as Google's run_squad.py: an answer not found in its context is not trained on
                    continue
                answer = (text, start)
            ids, offsets = by_context[example.context]
            try:
                windows += make_windows(question.ids, ids, offsets, qid=example.id, context=example.context,
                                        cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id,
                                        max_seq_length=c.seq_length, doc_stride=c.doc_stride,
                                        max_query_length=c.max_query_length, answer=answer,
                                        is_impossible=training and example.is_impossible, pad_to_max_length=False)
            except ValueError:
                if not training:
                    raise
                skipped += 1  # an answer made of characters no token covers (whitespace, say)
        return windows, skipped

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        windows, skipped = self.windows(examples, tokenizer, training)
        if training:
            self.stats["train"]["skipped_for_training"] = skipped
            self.stats["train"]["windows"] = len(windows)
        else:
            self.dev_windows = windows
        return [{"input_ids": w.input_ids, "token_type_ids": w.token_type_ids,
                 "start_position": w.start_position, "end_position": w.end_position} for w in windows]

    def objective(self):
        return SpanTask()

    def predict_windows(self, logits: list[np.ndarray], windows, null_threshold: float):
        from bertkit.tasks.squad import postprocess

        return postprocess(windows, [x[:, 0] for x in logits], [x[:, 1] for x in logits],
                           n_best_size=self.config.n_best_size, max_answer_length=self.config.max_answer_length,
                           version_2=self.version_2, null_threshold=null_threshold)

    def evaluate(self, model, examples, features, pad_id):
        from bertkit.tasks.squad import squad_evaluate

        logits = forward_all(model, features, pad_id, self.config.eval_batch_size)
        predictions, null_odds, _ = self.predict_windows(logits, self.dev_windows, 0.0)
        metrics = squad_evaluate(examples, predictions, null_odds if self.version_2 else None, self.version_2)
        if self.version_2:
            # The threshold chosen on dev: the written predictions.json answers "" where the null odds exceed it.
            predictions, null_odds, _ = self.predict_windows(logits, self.dev_windows, metrics["best_f1_thresh"])
        return metrics, (predictions, null_odds, metrics.get("best_f1_thresh", 0.0))

    def write_predictions(self, out_dir: Path, examples, output) -> None:
        from bertkit.tasks.squad import write_null_odds, write_predictions

        predictions, null_odds, threshold = output
        self.null_threshold = threshold
        write_predictions(out_dir / "predictions.json", predictions)
        if self.version_2:
            write_null_odds(out_dir / "null_odds.json", null_odds)

    def task_info(self) -> dict[str, Any]:
        c = self.config
        return {**super().task_info(), "version_2": self.version_2, "null_threshold": self.null_threshold,
                "doc_stride": c.doc_stride, "max_query_length": c.max_query_length,
                "max_answer_length": c.max_answer_length, "n_best_size": c.n_best_size}


class SwagFamily(TaskFamily):
    """SWAG four-way multiple choice: one [CLS] score per (context, ending) pair, softmax over the four."""

    model_class_name = "BertForMultipleChoice"
    metric_names = ("accuracy",)
    main_metric = "accuracy"

    def read(self, path, training: bool) -> list:
        from bertkit.tasks.swag import read_swag

        examples = read_swag(path)
        if not examples:
            raise DataError.at(path, None, "no examples")
        if examples[0].label is None:
            raise DataError.at(path, None, "the file has no label column (the test file?)")
        return examples

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        return [choice_features(tokenizer, e.context, e.choices, self.config.seq_length, e.label) for e in examples]

    def objective(self):
        return SequenceClassificationTask("swag")

    def evaluate(self, model, examples, features, pad_id):
        from bertkit.tasks.swag import multiple_choice_accuracy

        logits = np.stack(forward_all(model, features, pad_id, self.config.eval_batch_size))
        return {"accuracy": multiple_choice_accuracy(logits, [e.label for e in examples])}, logits

    def write_predictions(self, out_dir: Path, examples, logits) -> None:
        (out_dir / "dev_predictions.txt").write_text("".join(f"{i}\n" for i in logits.argmax(-1)), encoding="utf-8")


def choice_features(tokenizer, context: str, choices: Sequence[str], max_length: int,
                    label: int | None = None) -> dict[str, Any]:
    """One multiple-choice input: (context, choice_k) pairs, longest-first truncated to max_length each."""
    encoded = tokenizer.encode_batch([context] * len(choices), list(choices), max_length=max_length)
    return {"input_ids": [e.input_ids for e in encoded], "token_type_ids": [e.token_type_ids for e in encoded],
            "label": label}


# kind -> the family that reads, featurises, builds the model for and evaluates it
FAMILIES = {"glue": ClassificationFamily, "classify": ClassificationFamily, "ner": TaggingFamily,
            "squad": SquadFamily, "swag": SwagFamily}


# ------------------------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------------------------
def load_task_model(cls, model_dir: str | Path, new_heads: bool = False, dropout: float | None = None, **kwargs):
    """`cls.from_pretrained(model_dir)` with a fresh head, optionally rebuilt with other dropout probabilities.

    The checkpoint code explains a head that does not fit (another number of labels, say); the message is kept
    and told how to replace the head from the command line too.
    """
    from bertkit.checkpoint import CheckpointError

    try:
        model = cls.from_pretrained(model_dir, new_heads=new_heads, **kwargs)
    except CheckpointError as err:
        if "new_heads=True" in str(err):
            raise CheckpointError(f"{err} (bertkit finetune: --new-head)") from None
        raise
    if dropout is not None:
        config = dataclasses.replace(model.config, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        own = {k: getattr(model, k) for k in ("num_labels", "labels", "regression") if k in kwargs}
        rebuilt = cls(config, **own)
        rebuilt.load_state_dict(model.state_dict())
        model = rebuilt
    return model


def _max_positions(model_dir: Path) -> int:
    from bertkit.checkpoint import CONFIG_NAME, read_config
    from bertkit.config import BertConfig

    if not (model_dir / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{model_dir}: no {CONFIG_NAME}; not a model directory")
    return BertConfig.from_dict(read_config(model_dir), source=str(model_dir / CONFIG_NAME)).max_length


def epoch_train_config(config: FinetuneConfig, steps_per_epoch: int):
    """The trainer's settings for a task run: `config.epochs` epochs of `steps_per_epoch` steps, evaluated (and
    checkpointed, unless `save_every` says otherwise) at every epoch's end. Shared by fine-tuning and distillation."""
    from bertkit.trainer import TrainConfig

    return TrainConfig(
        max_steps=max(1, round(config.epochs * steps_per_epoch)), learning_rate=config.learning_rate,
        warmup_steps=0, warmup_ratio=config.warmup_ratio, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, adam_epsilon=config.adam_epsilon,
        grad_accumulation=config.grad_accumulation, precision=config.precision, log_every=config.log_every,
        eval_every=steps_per_epoch, save_every=config.save_every or steps_per_epoch, keep_last=1, seed=config.seed,
        device=config.device, progress=config.progress)


def resume_history(run_dir: Path, resume: bool, metric: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(evaluations so far, the best of them) for a resumed run: eval.jsonl up to the newest checkpoint's step;
    nothing for a fresh run."""
    from bertkit.trainer import latest_checkpoint

    checkpoint = latest_checkpoint(run_dir) if resume else None
    path = run_dir / "eval.jsonl"
    if checkpoint is None or not path.is_file():
        return [], None
    up_to_step = int(checkpoint.stem.split("-")[1])
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    history = [r for r in records if r["step"] <= up_to_step]
    return history, (max(history, key=lambda r: r[metric]) if history else None)


def record_evaluation(run_dir: Path, history: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    """`history` with `record` in place of any earlier one of its step, rewritten to run_dir/eval.jsonl."""
    history = [r for r in history if r["step"] != record["step"]] + [record]
    with open(run_dir / "eval.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, default=float) + "\n" for r in history)
    return history


def save_best(family, run_dir: Path, dev_examples, output, model, tokenizer) -> None:
    """The best epoch so far: dev predictions and run_dir/model (weights, tokenizer, task file)."""
    family.write_predictions(run_dir, dev_examples, output)
    model.save_pretrained(run_dir / "model", tokenizer=tokenizer)
    (run_dir / "model" / TASK_FILE).write_text(json.dumps(family.task_info(), indent=2) + "\n", encoding="utf-8")


def train_and_report(model, objective, stream, train_config, run_dir: Path, evaluate, resume: bool, dist_info,
                     device, timing: dict[str, float], write_results) -> None:
    """The shared training loop for a task run, then the run's throughput (evaluation time excluded) into
    results.json through `write_results`; ends the process group of a distributed run."""
    from bertkit.trainer import train

    started = time.perf_counter()
    result = train(model, objective, stream, train_config, run_dir, evaluate=evaluate, resume=resume,
                   dist_info=dist_info, device=device)
    train_seconds = max(time.perf_counter() - started - timing["eval_s"], 1e-9)
    if dist_info.is_main:
        write_results({"steps": result.step, "stopped_by": result.stopped_by,
                       "train_seconds": round(train_seconds, 3),
                       "train_examples_per_s": stream.examples_yielded * dist_info.world_size / train_seconds,
                       "final_train_metrics": result.last_metrics})
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def finetune(kind: str, model_dir: str | os.PathLike, train_path: str | os.PathLike, dev_path: str | os.PathLike,
             out_dir: str | os.PathLike, config: FinetuneConfig | None = None, *, resume: bool = False,
             new_heads: bool = False, stop_after_steps: int | None = None) -> dict[str, Any]:
    """Fine-tune the encoder in `model_dir` on a task and keep the best epoch's model; see the module docstring.

    Args:
        kind: glue, classify, ner, squad or swag.
        model_dir: a model directory (pretraining or encoder checkpoint, bertkit's or transformers') with its
            tokenizer files; the task head starts fresh (or is kept if the directory already has a fitting one).
        train_path, dev_path: task files in the reader's format (see bertkit.tasks).
        out_dir: run directory: metrics.jsonl, eval.jsonl, checkpoints/, model/, results.json, predictions.
        config: FinetuneConfig (its `kind` is set from `kind`).
        resume: continue from the newest checkpoint in out_dir/checkpoints.
        new_heads: replace a head the directory already has (another task's, another number of labels).
        stop_after_steps: stop after this many optimizer steps as if interrupted (the schedule still spans every
            epoch); a later call with resume=True continues. For tests and time-sliced runs.
    Returns:
        The content of results.json: {"epochs": [{"epoch", "step", metrics...}], "best": {...},
        "train_examples_per_s", "config", ...}.
    """
    from bertkit.checkpoint import unwrap
    from bertkit.tokenizers import WordPieceTokenizer
    from bertkit.trainer import seed_everything, setup_distributed

    if kind not in KINDS:
        raise ValueError(f"unknown fine-tuning kind {kind!r}; choose one of {', '.join(KINDS)}")
    config = dataclasses.replace(config or FinetuneConfig(kind=kind), kind=kind)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not (model_dir / "vocab.txt").is_file():
        raise FileNotFoundError(f"{model_dir}: no vocab.txt; fine-tuning needs a model directory with its tokenizer")
    positions = _max_positions(model_dir)
    if config.max_seq_length is None and config.seq_length > positions:
        config = dataclasses.replace(config, max_seq_length=positions)  # the default, cut to what the model has
    if config.seq_length > positions:
        raise ValueError(f"max_seq_length {config.seq_length} is longer than the model's max_position_embeddings "
                         f"({positions})")
    family = FAMILIES[kind](config)
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    train_examples = family.read(train_path, training=True)
    dev_examples = family.read(dev_path, training=False)
    metric = config.metric or family.main_metric
    if metric not in family.metric_names:
        raise ValueError(f"--metric {metric!r} is not reported for {kind}; choose one of {list(family.metric_names)}")
    train_features = family.features(train_examples, tokenizer, training=True)
    dev_features = family.features(dev_examples, tokenizer, training=False)

    dist_info, device = setup_distributed(config.device)
    seed_everything(config.seed)  # the fresh head's initialisation comes from the seed
    model = load_task_model(family.model_class(), model_dir, new_heads=new_heads, dropout=config.dropout,
                            **family.model_kwargs())
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{model_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")

    stream = EpochBatches(train_features, tokenizer.pad_id, config.batch_size, config.seed,
                          config.grad_accumulation, dist_info.rank, dist_info.world_size, stop_after_steps,
                          bucket_window=config.bucket_window)
    steps_per_epoch = stream.steps_per_epoch
    train_config = epoch_train_config(config, steps_per_epoch)
    max_steps = train_config.max_steps
    history, best = resume_history(out_dir, resume, metric)
    timing = {"eval_s": 0.0}
    results: dict[str, Any] = {}

    def write_results(extra: dict[str, Any] | None = None) -> None:
        results.clear()
        results.update({
            "kind": kind, "task": config.task, "model_dir": str(model_dir), "train": str(train_path),
            "dev": str(dev_path), "labels": family.labels, "metric": metric,
            "train_examples": len(train_examples), "train_features": len(train_features),
            "dev_examples": len(dev_examples), "steps_per_epoch": steps_per_epoch, "max_steps": max_steps,
            "epochs": history, "best": best, **({"data": family.stats} if family.stats else {}),
            "config": config.to_dict(), **(extra or {})})
        text = json.dumps(results, indent=2, default=float) + "\n"
        (out_dir / "results.json").write_text(text, encoding="utf-8")

    def evaluate(m) -> dict[str, float]:
        nonlocal best, history
        step = stream.steps_done
        if step % steps_per_epoch and step != max_steps:
            return {}  # an interrupted run's final evaluation: only whole epochs (and the end) are evaluated
        started = time.perf_counter()
        metrics, output = family.evaluate(m, dev_examples, dev_features, tokenizer.pad_id)
        record = {"epoch": round(step / steps_per_epoch, 4), "step": step, **metrics}
        history = record_evaluation(out_dir, history, record)
        if best is None or record[metric] > best[metric] or best["step"] == step:
            best = record
            save_best(family, out_dir, dev_examples, output, unwrap(m), tokenizer)
        write_results()
        timing["eval_s"] += time.perf_counter() - started
        flat = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if dist_info.is_main:
            shown = ", ".join(f"{k} {record[k]:.4f}" for k in family.metric_names if k in record)
            print(f"epoch {record['epoch']:g} (step {step}): {shown}", flush=True)
        return flat

    if dist_info.is_main:
        import yaml

        out_dir.mkdir(parents=True, exist_ok=True)
        resolved = {"kind": kind, "model_dir": str(model_dir), "train": str(train_path), "dev": str(dev_path),
                    "finetune": config.to_dict(), "train_config": dataclasses.asdict(train_config),
                    "model_config": model.config.to_dict(), "world_size": dist_info.world_size}
        (out_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
        print(f"fine-tuning {kind}{' ' + config.task if config.task else ''} from {model_dir} "
              f"({model.num_parameters() / 1e6:.1f}M parameters) on {len(train_examples):,} examples "
              f"({len(train_features):,} inputs): {max_steps} steps of {config.batch_size}, {steps_per_epoch} per "
              f"epoch, on {device}", flush=True)

    train_and_report(model, family.objective(), stream, train_config, out_dir, evaluate, resume, dist_info, device,
                     timing, write_results)
    return dict(results)


# ------------------------------------------------------------------------------------------------------------------
# Prediction with a fine-tuned model directory
# ------------------------------------------------------------------------------------------------------------------
_WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")  # words (with inner hyphens, apostrophes, dots) and punctuation


def split_words(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) of every word and punctuation mark of `text`, the way CoNLL files split sentences."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def tags_to_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entities of a tag sequence as (type, first word, last word + 1); conlleval's reading of BIO/IOB1/IOBES."""
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, this = tag.partition("-")
        begins = prefix in ("B", "S") or (prefix in ("I", "E") and this != kind)
        if kind is not None and (prefix == "O" or begins):
            spans.append((kind, start, i))
            kind = None
        if prefix != "O" and (begins or kind is None):
            kind, start = this, i
        if prefix in ("E", "S") and kind is not None:
            spans.append((kind, start, i + 1))
            kind = None
    return spans


def read_task_info(model_dir: Path) -> dict[str, Any]:
    path = model_dir / TASK_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _kind_of(model_dir: Path, kind: str | None) -> str:
    if kind is not None:
        return "classify" if kind == "glue" else kind
    from bertkit.checkpoint import read_config

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json; not a model directory")
    for arch in read_config(model_dir).get("architectures") or []:
        if arch in _ARCHITECTURE_KINDS:
            return _ARCHITECTURE_KINDS[arch]
    raise ValueError(f"{model_dir} is not a fine-tuned task model (architectures "
                     f"{read_config(model_dir).get('architectures')}); say which kind to predict")


@torch.no_grad()
def predict(model_dir: str | os.PathLike, kind: str | None, inputs: Sequence, *, batch_size: int = 32,
            max_seq_length: int | None = None, top_k: int | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """Predictions of a fine-tuned model directory, one dict per input.

    kind (None: from config.json's architecture) and inputs:
        classify (or glue): texts, or (text, pair) tuples -> {"label", "probability", "probabilities": {label: p}}
            (regression: {"score"}); top_k keeps that many labels in "probabilities".
        ner: texts (split into words and punctuation) or lists of words -> {"words", "tags", "entities":
            [{"type", "text", "start", "end" (characters; word indices for word lists), "score"}]}.
        squad: (question, context) tuples -> {"answer", "score" (n-best probability), "start_logit",
            "end_logit", "nbest"}; "" is the no-answer of a SQuAD 2.0 model (its dev-chosen null threshold).
        swag: (context, [choices]) tuples -> {"choice", "text", "probabilities"}.
    """
    from bertkit.tokenizers import WordPieceTokenizer

    model_dir = Path(model_dir)
    kind = _kind_of(model_dir, kind)
    if kind not in ("classify", "ner", "squad", "swag"):
        raise ValueError(f"unknown prediction kind {kind!r}; choose one of classify, ner, squad, swag")
    info = read_task_info(model_dir)
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    config = FinetuneConfig(kind=kind, max_seq_length=max_seq_length or info.get("max_seq_length"),
                            eval_batch_size=batch_size,
                            **{k: info[k] for k in ("doc_stride", "max_query_length", "max_answer_length",
                                                    "n_best_size") if k in info})
    family = FAMILIES[kind](config)
    import bertkit.models as modeling
    from bertkit.checkpoint import read_config

    architectures = read_config(model_dir).get("architectures") or []
    if family.model_class_name not in architectures:  # a missing head would silently start fresh: refuse
        raise ValueError(f"{model_dir} holds a {' / '.join(architectures) or 'model without a task head'}, not a "
                         f"{family.model_class_name}; fine-tune it for {kind} first (bertkit finetune {kind})")
    model = getattr(modeling, family.model_class_name).from_pretrained(model_dir).to(device).eval()
    T = min(config.seq_length, model.config.max_length)
    inputs = list(inputs)
    if not inputs:
        return []

    if kind == "classify":
        texts = [x if isinstance(x, str) else x[0] for x in inputs]
        pairs = [None if isinstance(x, str) else x[1] for x in inputs]
        if any(p is not None for p in pairs) and any(p is None for p in pairs):
            raise ValueError("give either every input a pair or none")
        encoded = tokenizer.encode_batch(texts, pairs if pairs[0] is not None else None, max_length=T)
        features = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids} for e in encoded]
        logits = np.stack(forward_all(model, features, tokenizer.pad_id, batch_size))
        if model.regression:
            return [{"score": float(x[0])} for x in logits]
        probs = _softmax(logits)
        out = []
        for p in probs:
            order = np.argsort(-p, kind="stable")[:top_k]
            out.append({"label": model.labels[order[0]], "probability": float(p[order[0]]),
                        "probabilities": {model.labels[i]: float(p[i]) for i in order}})
        return out

    if kind == "ner":
        sentences, spans_of = [], []
        for x in inputs:
            if isinstance(x, str):
                pieces = split_words(x)
                sentences.append([w for w, _, _ in pieces])
                spans_of.append((x, [(s, e) for _, s, e in pieces]))
            else:
                sentences.append(list(x))
                spans_of.append((None, None))
        features = encode_words(tokenizer, sentences, T)
        logits = forward_all(model, features, tokenizer.pad_id, batch_size)
        from bertkit.tasks.ner import decode_word_predictions

        outside = model.labels.index("O") if "O" in model.labels else 0  # for words cut off by truncation
        out = []
        for words, feature, scores, (text, offsets) in zip(sentences, features, logits, spans_of):
            probs = _softmax(scores)
            ids = decode_word_predictions(feature["word_ids"], probs.argmax(-1).tolist(), len(words), fill=outside)
            confidence = decode_word_predictions(feature["word_ids"], probs.max(-1).tolist(), len(words), fill=0.0)
            tags = [model.labels[i] for i in ids]
            entities = []
            for etype, first, last in tags_to_spans(tags):
                entity = {"type": etype, "score": float(np.mean(confidence[first:last]))}
                if text is not None:
                    start, end = offsets[first][0], offsets[last - 1][1]
                    entity.update(text=text[start:end], start=start, end=end)
                else:
                    entity.update(text=" ".join(words[first:last]), start=first, end=last)
                entities.append(entity)
            out.append({"words": words, "tags": tags, "entities": entities})
        return out

    if kind == "squad":
        from bertkit.tasks.squad import SquadExample

        family.version_2 = bool(info.get("version_2", False))
        family.config = dataclasses.replace(config, max_seq_length=T)
        examples = [SquadExample(id=str(i), question=q, context=c, answers=[], is_impossible=False)
                    for i, (q, c) in enumerate(inputs)]
        windows, _ = family.windows(examples, tokenizer, training=False)
        features = [{"input_ids": w.input_ids, "token_type_ids": w.token_type_ids} for w in windows]
        logits = forward_all(model, features, tokenizer.pad_id, batch_size)
        threshold = float(info.get("null_threshold", 0.0))
        predictions, null_odds, nbest = family.predict_windows(logits, windows, threshold)
        out = []
        for example in examples:
            answer = predictions[example.id]
            top = next((n for n in nbest[example.id] if n["text"] == answer), {"probability": 0.0,
                                                                               "start_logit": 0.0, "end_logit": 0.0})
            record = {"answer": answer, "score": top["probability"], "start_logit": top["start_logit"],
                      "end_logit": top["end_logit"], "nbest": nbest[example.id][:top_k or 5]}
            if family.version_2:
                record["null_odds"] = null_odds[example.id]
            out.append(record)
        return out

    features = [choice_features(tokenizer, context, choices, T) for context, choices in inputs]
    counts = {len(f["input_ids"]) for f in features}
    out = []
    for n in sorted(counts):  # inputs with the same number of choices are batched together
        chosen = [i for i, f in enumerate(features) if len(f["input_ids"]) == n]
        logits = forward_all(model, [features[i] for i in chosen], tokenizer.pad_id, batch_size)
        for i, scores in zip(chosen, logits):
            p = _softmax(scores)
            out.append((i, {"choice": int(p.argmax()), "text": inputs[i][1][int(p.argmax())],
                            "probabilities": [float(x) for x in p]}))
    return [record for _, record in sorted(out, key=lambda pair: pair[0])]


# ------------------------------------------------------------------------------------------------------------------
# Evaluating predictions files
# ------------------------------------------------------------------------------------------------------------------
def read_prediction_lines(path: str | os.PathLike) -> list[tuple[int, str]]:
    """(line, prediction) from a file of one prediction per line, or a GLUE submission TSV (`index<TAB>prediction`
    with a header): then the rows are put in index order and the last column is the prediction."""
    lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    rows = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if rows and "\t" in rows[0][1] and rows[0][1].split("\t")[0].strip().lower() in ("index", "id"):
        indexed = []
        for number, line in rows[1:]:
            fields = line.split("\t")
            try:
                indexed.append((int(fields[0]), number, fields[-1].strip()))
            except ValueError:
                raise DataError.at(path, number, f"index {fields[0]!r} is not an integer") from None
        return [(number, value) for _, number, value in sorted(indexed)]
    return [(number, line.strip()) for number, line in rows]


def _check_count(predictions: Sequence, gold: Sequence, predictions_path, data_path) -> None:
    if len(predictions) != len(gold):
        raise ValueError(f"{predictions_path}: {len(predictions)} predictions for {len(gold)} examples in "
                         f"{data_path}")


def evaluate_predictions(kind: str, data_path: str | os.PathLike, predictions_path: str | os.PathLike,
                         null_odds_path: str | os.PathLike | None = None, task: str | None = None, *,
                         text_column: str = "text", pair_column: str | None = None, label_column: str = "label",
                         regression: bool = False) -> dict[str, Any]:
    """Metrics of a predictions file against a labelled data file.

    squad: predictions.json ({qid: answer}) and optionally null_odds.json; exactly the official scripts' output
        (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_*, NoAns_*, and with null odds best_exact,
        best_exact_thresh, best_f1, best_f1_thresh). v2.0 is chosen when the data has unanswerable questions.
    glue (task required) / classify (columns as for fine-tuning): one label per line, or a GLUE submission TSV
        (`index<TAB>prediction`); the task's GLUE metrics, or accuracy and macro-F1 (pearson, spearmanr, mse).
    ner: a CoNLL file whose last column is the predicted tag, words in the data file's order; entity-level
        precision, recall, F1 (conlleval rules) and per-type scores.
    swag: one chosen ending index (0-3) per line; accuracy.
    """
    if kind == "squad":
        from bertkit.tasks.squad import read_squad_with_stats, squad_evaluate

        examples, _ = read_squad_with_stats(data_path)
        predictions = _read_json_object(predictions_path)
        null_odds = _read_json_object(null_odds_path) if null_odds_path is not None else None
        version_2 = any(e.is_impossible for e in examples) or null_odds is not None
        return squad_evaluate(examples, {k: str(v) for k, v in predictions.items()}, null_odds, version_2)
    if kind in ("glue", "classify"):
        from bertkit.tasks.glue import get_task, read_glue, read_table

        if kind == "glue":
            if task is None:
                raise ValueError("glue evaluation needs the task name (--task)")
            spec = get_task(task)
            gold = [e.label for e in read_glue(spec.name, data_path)]
            regression = spec.is_regression
        else:
            gold = [e.label for e in read_table(data_path, text_column, pair_column, label_column,
                                                regression=regression)]
        if gold and gold[0] is None:
            raise DataError.at(data_path, None, "the data file has no labels")
        rows = read_prediction_lines(predictions_path)
        _check_count(rows, gold, predictions_path, data_path)
        if regression:
            predicted = []
            for number, value in rows:
                try:
                    predicted.append(float(value))
                except ValueError:
                    raise DataError.at(predictions_path, number, f"prediction {value!r} is not a number") from None
        else:
            predicted = [value for _, value in rows]
        if kind == "classify":
            return classification_metrics(predicted, gold, regression)
        from bertkit.tasks.metrics import glue_metrics

        if regression:
            return glue_metrics(spec.name, np.asarray(predicted), np.asarray(gold, dtype=np.float64))
        to_id = spec.label_to_id
        for number, value in rows:
            if value not in to_id:
                raise DataError.at(predictions_path, number, f"unknown label {value!r}; expected one of "
                                                             f"{list(spec.labels)}")
        return glue_metrics(spec.name, np.array([to_id[v] for v in predicted]), np.array([to_id[v] for v in gold]))
    if kind == "ner":
        from bertkit.tasks.ner import ner_metrics, read_conll

        gold, pred = read_conll(data_path), read_conll(predictions_path)
        _check_count(pred, gold, predictions_path, data_path)
        for g, p in zip(gold, pred):
            if g.tokens != p.tokens:
                i = next((i for i, (a, b) in enumerate(zip(g.tokens, p.tokens)) if a != b),
                         min(len(g.tokens), len(p.tokens)))
                raise DataError.at(predictions_path, p.line + min(i, len(p.tokens) - 1),
                                   f"the sentence does not match {data_path}:{g.line} (word {i + 1})")
        return ner_metrics([g.tags for g in gold], [p.tags for p in pred])
    if kind == "swag":
        from bertkit.tasks.swag import multiple_choice_accuracy, read_swag

        gold = [e.label for e in read_swag(data_path)]
        rows = read_prediction_lines(predictions_path)
        _check_count(rows, gold, predictions_path, data_path)
        predicted = []
        for number, value in rows:
            if value not in ("0", "1", "2", "3"):
                raise DataError.at(predictions_path, number, f"prediction {value!r} is not one of 0, 1, 2, 3")
            predicted.append(int(value))
        return {"accuracy": multiple_choice_accuracy(predicted, gold)}
    raise ValueError(f"unknown evaluation kind {kind!r}; choose one of {', '.join(KINDS)}")


def _read_json_object(path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as err:
        raise DataError.at(path, err.lineno, f"invalid JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise DataError.at(path, None, "expected a JSON object {question id: value}")
    return data
