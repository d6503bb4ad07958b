"""Fine-tuning driver: task file -> features -> model + fresh head -> THE trainer -> best model + official metrics.

One call, `finetune(kind, model_dir, train_path, dev_path, out_dir, config)`, does what the BERT paper's section 4
describes for every task family. The kind names a family in `bertkit.tasks` (the registry, `family_for`), which
reads the files, makes the features with the model directory's tokenizer (any kind), chooses the task model and
its loss, and evaluates with the official metric:

    kind      family (file)                   model                              dev metric that picks the best epoch
    glue      GlueFamily (tasks/glue.py)      BertForSequenceClassification      GLUE's first listed (CoLA mcc, STS-B
                                                                                 pearson, MRPC/QQP accuracy, ...)
    classify  ClassificationFamily            BertForSequenceClassification      accuracy (pearson with --regression)
              (tasks/classify.py; CSV/TSV/JSONL, your columns)
    ner       TaggingFamily (tasks/ner.py)    BertForTokenClassification         entity F1 (seqeval, conlleval mode)
    squad     SquadFamily (tasks/squad.py)    BertForQuestionAnswering           F1 (v1.1), best_f1 (v2.0)
    swag      SwagFamily (tasks/swag.py)      BertForMultipleChoice              accuracy

The model column is the BERT family's class (RoBERTa, ALBERT, ... directories included); another architecture's
directory gets its own class for the family's role (`TaskFamily.model_role`: ModernBertForSequenceClassification,
...), and a kind the architecture has no model for is refused naming both.

A T5 model directory (an encoder-decoder) is fine-tuned for glue, classify and squad as text to text instead
(`bertkit.tasks.text2text.Text2TextFamily`: the answer written as words, scored from greedy generations with the
same official metrics); `predict` on it generates too.

The run itself is `bertkit.tasks.run.run_task`, which distillation shares: every epoch the model is evaluated on
the dev file; the best epoch's model is written to OUT/model (a model directory with the tokenizer it was trained
with, loadable by transformers), its dev predictions beside it (OUT/predictions.json and null_odds.json for SQuAD,
in the official format; OUT/dev_predictions.txt or .conll otherwise), and OUT/results.json holds every epoch's
metrics, the best, the resolved config and the training throughput.

When the run ends, `score_best` scores the best epoch's model on any extra labelled files (`eval_files`: a test
set, CoLA's out-of-domain sentences) and, for a classifier, writes the confusion matrices (OUT/confusion_matrix.json).
`finetune_sweep` repeats the run over seeds (and a learning-rate grid) and writes the result card (`bertkit.tasks.card`).

A causal (GPT-style) model fine-tuned for glue or classify reads the last real token and, unless
config.lm_weight is 0, keeps GPT-1's auxiliary language-modelling loss (`bertkit.models.heads`,
`bertkit.tasks.classify.SequenceClassificationTask`), scored with the LM head the directory was pretrained with
(`pretrained_lm_head`; results.json's "lm_head" says "pretrained", or "tied embeddings" for a directory without one).

`predict` (labels with probabilities, entity spans, answers, choices) and `evaluate_predictions` (metrics of a
predictions file against a data file, SQuAD with the official scripts' keys) ask the same families.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.checkpoint import HeadMismatchError
from bertkit.features import FeatureTaskModel, build_task_model, fit_logistic_head
from bertkit.io import atomic_write, writer_lock
from bertkit.models.modeldir import TASK_FILE, ModelDir
from bertkit.tasks.base import KINDS, family_for, kind_of_architectures, prediction_kind
from bertkit.tasks.card import card_from_runs, read_results, run_dir_name, write_card
from bertkit.tasks.metrics import confusion_matrix
from bertkit.tasks.run import (FinetuneConfig, load_task_data, load_task_model, model_outputs, resolved_combine,
                               run_task)
from bertkit.tasks.text2text import Text2TextFamily, text_to_text_family
from bertkit.tokenizers.word import apply_words
from bertkit.training.trainer import seed_everything, setup_distributed

__all__ = ["FinetuneConfig", "Predictor", "evaluate_predictions", "finetune", "finetune_sweep", "load_predictor",
           "predict", "pretrained_lm_head", "score_best"]


def finetune(kind: str, model_dir: str | os.PathLike, train_path: str | os.PathLike, dev_path: str | os.PathLike,
             out_dir: str | os.PathLike, config: FinetuneConfig | None = None, *, resume: bool = False,
             new_heads: bool = False, stop_after_steps: int | None = None,
             eval_files: Sequence[str | os.PathLike] = ()) -> dict[str, Any]:
    """Fine-tune the encoder in `model_dir` on a task and keep the best epoch's model; see the module docstring.

    Args:
        kind: glue, classify, ner, squad or swag (`bertkit.tasks.KINDS`).
        model_dir: a model directory (pretraining or encoder checkpoint, bertkit's or transformers', any family
            bertkit loads) with its tokenizer files (any kind `bertkit.tokenizers.load_tokenizer` reads); the task
            head starts fresh (or is kept if the directory already has a fitting one).
        train_path, dev_path: task files in the family's format (see bertkit.tasks).
        out_dir: run directory: metrics.jsonl, eval.jsonl, checkpoints/, model/, results.json, predictions.
        config: FinetuneConfig (its `kind` is set from `kind`).
        resume: continue from the newest checkpoint in out_dir/checkpoints.
        new_heads: replace a head the directory already has (another task's, another number of labels).
        stop_after_steps: stop after this many optimizer steps as if interrupted (the schedule still spans every
            epoch); a later call with resume=True continues. For tests and time-sliced runs.
        eval_files: more labelled files in the dev file's format (a test set, CoLA's out-of-domain sentences),
            scored once at the end with the best epoch's model: results.json "eval_files" {file stem: metrics}.
    Returns:
        The content of results.json: {"epochs": [{"epoch", "step", metrics...}], "best": {...},
        "train_examples_per_s", "train_tokens_per_s", "wall_seconds", "config", ...}; a classifier's (glue,
        classify) also "confusion_matrix" {"labels", "dev", file stem: rows = gold, columns = predicted}, written
        to OUT/confusion_matrix.json too.
    """
    started = time.perf_counter()
    if kind not in KINDS:
        raise ValueError(f"unknown fine-tuning kind {kind!r}; choose one of {', '.join(KINDS)}")
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    _check_eval_files(eval_files)
    data = load_task_data(kind, model_dir, train_path, dev_path, config)
    config, family, tokenizer = data.config, data.family, data.tokenizer
    dist_info, device = setup_distributed(config.device)
    seed_everything(config.seed)  # the fresh head's initialisation comes from the seed
    model, cls, feature_facts, fit = _task_model(data, model_dir, new_heads)
    if feature_facts is None and tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{model_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size} embeddings")

    def banner(max_steps: int, steps_per_epoch: int) -> str:
        if fit is not None:
            return (f"fitting a logistic regression (C {config.logistic_c:g}, L-BFGS) on the frozen layers of "
                    f"{model_dir} for {len(data.train_examples):,} examples, on {device}")
        return (f"fine-tuning {kind}{' ' + config.task if config.task else ''} from {model_dir} "
                f"({model.num_parameters() / 1e6:.1f}M parameters) on {len(data.train_examples):,} examples "
                f"({len(data.train_features):,} inputs): {max_steps} steps of {config.batch_size}, {steps_per_epoch} "
                f"per epoch, on {device}")

    summary = {"kind": kind, "task": config.task, "model_dir": str(model_dir), "train": str(train_path),
               "dev": str(dev_path)}
    if feature_facts is not None:
        summary["features"] = feature_facts
    resolved = {"kind": kind, "model_dir": str(model_dir), "train": str(train_path), "dev": str(dev_path),
                "finetune": config.to_dict(), "model_config": model.config.to_dict()}
    objective = family.objective()
    if (kind in ("glue", "classify") and getattr(model.config, "causal", False) and config.lm_weight
            and feature_facts is None):  # a task model on the layers has no LM head to score with
        head = pretrained_lm_head(model_dir)  # L1 scored as pretraining scored it (see SequenceClassificationTask)
        objective = objective.with_language_model(config.lm_weight, head)  # GPT-1's L2 + 0.5 L1
        summary["lm_head"] = "pretrained" if head is not None else "tied embeddings"
    with writer_lock(out_dir, dist_info.is_main):  # one writer per run directory (a second one fails at once)
        results = run_task(data, model, objective, out_dir, dist_info=dist_info, device=device,
                           resume=resume, stop_after_steps=stop_after_steps, summary=summary, resolved=resolved,
                           banner=banner, fit=fit)
        if not dist_info.is_main or stop_after_steps is not None:
            return results
        return score_best(data, cls, out_dir, eval_files, results, time.perf_counter() - started, device,
                          feature_cache=model.cache if feature_facts is not None else None)


def _check_eval_files(eval_files: Sequence[str | os.PathLike]) -> None:
    """--eval-file: the files exist and their names differ from each other and from 'dev' (results.json's keys)."""
    names = [Path(p).stem for p in eval_files]
    if len(set(names)) < len(names) or "dev" in names:
        raise ValueError(f"--eval-file: the files' names must differ from each other and from 'dev' ({names})")
    for path in eval_files:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--eval-file {path}: no such file")


def _task_model(data, model_dir: Path, new_heads: bool):
    """(model, the class that reads the best epoch's directory back, the feature task model's facts or None, the
    fit at once or None) for a fine-tuning run: the architecture's task model with the family's head, or a task
    model on the encoder's layers (bertkit.features: frozen or trained with them; the only task models of an
    architecture without task heads of its own, ELMo)."""
    config, family, tokenizer, directory = data.config, data.family, data.tokenizer, data.model_dir
    if not (config.frozen or config.task_model == "bilstm" or not directory.has_task_heads):
        cls = directory.model_class(family.model_role, data.kind)  # the architecture's: BertFor..., ModernBertFor...
        model = load_task_model(cls, model_dir, new_heads=new_heads, dropout=config.dropout, **family.model_kwargs())
        return model, cls, None, None
    if not (config.frozen or config.task_model == "bilstm"):
        raise ValueError(f"{model_dir} holds a {directory.model_type} model, which has no task heads of its "
                         f"own; its layers feed a task model: add --frozen (and --task-model bilstm for the "
                         f"ELMo paper's task models)")
    kwargs = family.model_kwargs()
    model, feature_facts = build_task_model(model_dir, tokenizer, family.model_role, config,
                                            num_labels=kwargs.get("num_labels", 2), labels=kwargs.get("labels"),
                                            regression=kwargs.get("regression", False),
                                            train_inputs=[*data.train_features, *data.dev_features])
    if config.task_model != "logistic":
        return model, FeatureTaskModel, feature_facts, None

    def fit(m):  # --task-model logistic: fitted at once on the cached layers instead of trained
        return fit_logistic_head(m, data.train_features, tokenizer.pad_id, config.eval_batch_size, config.logistic_c)
    return model, FeatureTaskModel, feature_facts, fit


def pretrained_lm_head(model_dir: str | os.PathLike):
    """The LM head a causal model directory was pretrained with (`BertForCausalLM.mlm`: dense, activation,
    LayerNorm, bias; its decoder, the tied embeddings, left out), or None when the directory holds no LM head (a
    task model's directory): GPT-1's auxiliary loss then scores with the bare tied embeddings."""
    try:
        head = ModelDir.open(model_dir).load("causal").mlm
    except HeadMismatchError:
        return None
    head.word_embeddings = None  # the task model decodes with its own embeddings; drop the loaded copy
    return head


def score_best(data, cls, out_dir: Path, eval_files: Sequence[str | os.PathLike], results: dict[str, Any],
               wall_seconds: float, device, feature_cache=None) -> dict[str, Any]:
    """The finished run's results.json completed: the wall time, the best epoch's model scored on each extra
    evaluation file, and for a classifier the confusion matrices (dev and every file; also confusion_matrix.json).
    feature_cache: the run's frozen-encoder layers (`FeatureCache`), which the model read back uses as its own.
    """
    family, tokenizer, batch = data.family, data.tokenizer, data.config.eval_batch_size
    classifier = (data.kind in ("glue", "classify") and not getattr(family, "regression", True)
                  and not getattr(family, "generates", False))
    results = {**results, "wall_seconds": round(wall_seconds, 3)}
    if not (classifier or eval_files):
        atomic_write(out_dir / "results.json", json.dumps(results, indent=2, default=float) + "\n")
        return results
    model = cls.from_pretrained(out_dir / "model").to(device).eval()
    if feature_cache is not None:  # a frozen encoder's layers, as the run computed them: not computed again
        model.cache = feature_cache
    sets = [("dev", data.dev_examples, data.dev_features)]
    for path in eval_files:
        examples = family.read(path, training=False)
        sets.append((Path(path).stem, examples, family.features(examples, tokenizer, training=False)))
    matrices: dict[str, Any] = {"labels": list(family.labels)} if classifier else {}
    scored = {}
    for name, examples, features in sets:
        logits = model_outputs(family, model, features, tokenizer.pad_id, batch)
        if name != "dev":
            scored[name] = family.evaluate(examples, features, logits)[0]
        if classifier:
            matrices[name] = confusion_matrix(np.stack(logits).argmax(-1), [f["label"] for f in features],
                                              len(family.labels))
    if eval_files:
        results["eval_files"] = scored
    if classifier:
        results["confusion_matrix"] = matrices
        atomic_write(out_dir / "confusion_matrix.json", json.dumps(matrices, indent=2) + "\n")
    atomic_write(out_dir / "results.json", json.dumps(results, indent=2, default=float) + "\n")
    return results


def finetune_sweep(kind: str, model_dir: str | os.PathLike, train_path: str | os.PathLike,
                   dev_path: str | os.PathLike, out_dir: str | os.PathLike, config: FinetuneConfig | None = None, *,
                   seeds: Sequence[int], learning_rates: Sequence[float] | None = None, new_heads: bool = False,
                   eval_files: Sequence[str | os.PathLike] = (), name: str | None = None) -> dict[str, Any]:
    """One fine-tuning run per seed (and learning rate of a grid), each a full run directory of its own under
    out_dir (`bertkit.tasks.card.run_dir_name`: seedS, or lrX/seedS), then the card (out_dir/card.json, card.md; see
    bertkit.tasks.card). A run directory that already holds a finished run is kept as it is, so an interrupted sweep
    continues where it stopped when called again. Returns the card."""
    config = config or FinetuneConfig(kind=kind)
    if not seeds:
        raise ValueError("--seeds: give at least one seed")
    out_dir = Path(out_dir)
    runs = []
    for lr in (learning_rates or [None]):
        for seed in seeds:
            run_dir = out_dir / run_dir_name(seed, lr)
            runs.append(run_dir)
            setting = dataclasses.replace(config, seed=seed, learning_rate=config.learning_rate if lr is None else lr)
            try:
                done = read_results(run_dir)
            except (FileNotFoundError, ValueError):
                done = {}
            if "wall_seconds" in done:  # finished before: a resumed sweep, if it is this sweep's run
                _same_setting(run_dir, done.get("config") or {}, setting.to_dict())
                continue
            print(f"sweep: {run_dir}", flush=True)
            finetune(kind, model_dir, train_path, dev_path, run_dir, setting, resume=(run_dir / "checkpoints").is_dir(),
                     new_heads=new_heads, eval_files=eval_files)
    card = card_from_runs(runs, root=out_dir, name=name)
    if int(os.environ.get("RANK", "0")) == 0:  # one writer in a distributed sweep
        write_card(out_dir, card)
    return card


def _same_setting(run_dir: Path, done: dict[str, Any], wanted: dict[str, Any]) -> None:
    """ValueError naming the first setting in which a finished run differs from the one a sweep asks for (what
    only changes how a run is shown or checkpointed does not count)."""
    ignored = ("progress", "device", "log_every", "save_every", "eval_batch_size", "workers")
    if "combine" in done:  # compared resolved: an unset combine is its default
        done = {**done, "combine": resolved_combine(done["combine"], done.get("task_model", "linear"))}
        wanted = {**wanted, "combine": resolved_combine(wanted.get("combine"), wanted.get("task_model", "linear"))}
    for key, value in wanted.items():
        if key not in ignored and key in done and done[key] != value:
            raise ValueError(f"{run_dir} holds a finished run with {key} {done[key]!r}, not {value!r}; give the "
                             f"sweep another --out (or remove that run)")


# ------------------------------------------------------------------------------------------------------------------
# Prediction with a fine-tuned model directory
# ------------------------------------------------------------------------------------------------------------------
def _prediction_kinds() -> list[str]:
    return [k for k in KINDS if family_for(k).predicts_as is None]


@torch.no_grad()
def predict(model_dir: str | os.PathLike, kind: str | None, inputs: Sequence, *, batch_size: int = 32,
            max_seq_length: int | None = None, top_k: int | None = None, device: str = "cpu",
            words: str | None = None) -> list[dict[str, Any]]:
    """Predictions of a fine-tuned model directory, one dict per input; its tokenizer is whichever kind it holds.

    kind (None: from config.json's architecture) and inputs:
        classify (or glue): texts, or (text, pair) tuples -> {"label", "probability", "probabilities": {label: p}}
            (regression: {"score"}); top_k keeps that many labels in "probabilities".
        ner: texts (split into words and punctuation) or lists of words -> {"words", "tags", "entities":
            [{"type", "text", "start", "end" (characters; word indices for word lists), "score"}]}.
        squad: (question, context) tuples -> {"answer", "score" (n-best probability), "start_logit",
            "end_logit", "nbest"}; "" is the no-answer of a SQuAD 2.0 model (its dev-chosen null threshold).
        swag: (context, [choices]) tuples -> {"choice", "text", "probabilities"}.
    words: an ELMo's split of text into words, "whitespace" or "bert" (None: as its tokenizer was saved).
    """
    predictor = load_predictor(model_dir, kind, max_seq_length=max_seq_length, batch_size=batch_size, device=device,
                               words=words)
    inputs = list(inputs)
    if not inputs:
        return []
    family = predictor.family()
    features = family.prediction_features(inputs, predictor.tokenizer)
    logits = model_outputs(family, predictor.model, features, predictor.tokenizer.pad_id, batch_size)
    return family.predictions(inputs, features, logits, top_k=top_k)


@dataclass
class Predictor:
    """A fine-tuned model directory loaded for prediction: what `predict` and the server (`bertkit.serve`) share.

    `family()` is a fresh family object restored from the directory; families keep per-call state between
    `prediction_features` and `predictions`, so every independent call takes its own.
    """

    kind: str  # the prediction kind (classify, ner, squad, swag)
    model: Any  # the task model, in eval mode, on its device
    tokenizer: Any  # the directory's tokenizer, of whatever kind
    config: FinetuneConfig  # kind, max_seq_length and the SQuAD settings the model was fine-tuned with
    info: dict[str, Any]  # the directory's finetune.json
    family_class: type

    def family(self):
        family = self.family_class(self.config)
        family.restore(self.info, self.model)
        return family


def load_predictor(model_dir: str | os.PathLike | ModelDir, kind: str | None = None, *,
                   max_seq_length: int | None = None, batch_size: int = 32, device: str = "cpu",
                   words: str | None = None) -> Predictor:
    """Load a fine-tuned model directory for prediction (see `predict` for the kinds; None: from the directory).

    max_seq_length: tokens per input, default as fine-tuned (finetune.json), never more than the model's positions.
    Raises ValueError when the directory holds no head of the kind (a pretraining checkpoint, another task's).
    The loader is the one for what the directory holds (`ModelDir.form`): its own task head, a text-to-text
    encoder-decoder, or a task model on its encoder's layers.
    """
    model_dir = ModelDir.open(model_dir)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown prediction kind {kind!r}; choose one of {', '.join(_prediction_kinds())}")
    predictor = _LOADERS[model_dir.form](model_dir, kind, max_seq_length, batch_size, device)
    apply_words(predictor.tokenizer, words)  # an ELMo's split of text into words, when asked for
    return predictor


def _prediction_config(kind: str, info: dict[str, Any], positions: int, max_seq_length: int | None,
                       batch_size: int) -> FinetuneConfig:
    """The settings a loaded task model predicts with: its fine-tuning length (or `max_seq_length`) within the
    model's `positions`, and the SQuAD settings of its finetune.json."""
    length = min(max_seq_length or info.get("max_seq_length") or FinetuneConfig(kind=kind).seq_length, positions)
    return FinetuneConfig(kind=kind, max_seq_length=length, eval_batch_size=batch_size,
                          **{k: info[k] for k in ("doc_stride", "max_query_length", "max_answer_length",
                                                  "n_best_size") if k in info})


def _trained_kind(model_dir: ModelDir, kind: str | None) -> str:
    """The prediction kind of a directory by its finetune.json; ValueError when `kind` asks for another."""
    trained = model_dir.trained_kind
    if kind is not None and prediction_kind(kind) != prediction_kind(trained):
        raise ValueError(f"{model_dir} was fine-tuned for {trained}: it predicts as {prediction_kind(trained)}, "
                         f"not {kind}")
    return prediction_kind(trained)


def _head_predictor(model_dir: ModelDir, kind: str | None, max_seq_length: int | None, batch_size: int,
                    device: str) -> Predictor:
    """`load_predictor` for a task model with its own head (BertFor..., ModernBertFor..., XLNetFor...): the kind
    is the one asked for, or the head's."""
    if kind is None:
        kind = kind_of_architectures(model_dir.architectures)
        if kind is None:
            raise ValueError(f"{model_dir} is not a fine-tuned task model (architectures {model_dir.architectures}); "
                             f"say which kind to predict")
    kind = prediction_kind(kind)
    family_class = family_for(kind)
    if not any(family_class.matches_architecture(a) for a in model_dir.architectures):  # else a fresh head
        raise ValueError(f"{model_dir} holds a {' / '.join(model_dir.architectures) or 'model without a task head'}, "
                         f"not a {family_class.model_class_name}; fine-tune it for {kind} first (bertkit finetune "
                         f"{kind})")
    model = model_dir.load(family_class.model_role).to(device).eval()
    config = _prediction_config(kind, model_dir.info, model_dir.max_positions, max_seq_length, batch_size)
    return Predictor(kind, model, model_dir.tokenizer(), config, model_dir.info, family_class)


def _feature_task_predictor(model_dir: ModelDir, kind: str | None, max_seq_length: int | None, batch_size: int,
                            device: str) -> Predictor:
    """`load_predictor` for a task model on encoder layers (what a `--frozen` or `--task-model bilstm` run keeps:
    the encoder directory with task_model.json and task_model.safetensors beside it, `bertkit.features`); the kind
    it was fine-tuned for comes from its finetune.json, the labels from task_model.json."""
    if model_dir.trained_kind is None:
        raise ValueError(f"{model_dir}: a task model on encoder layers without its {TASK_FILE} (the kind it was "
                         f"fine-tuned for); use the model directory a bertkit finetune run wrote")
    kind = _trained_kind(model_dir, kind)
    model = FeatureTaskModel.from_pretrained(model_dir).to(device).eval()
    config = _prediction_config(kind, model_dir.info, model_dir.max_positions, max_seq_length, batch_size)
    # The model's own tokenizer: an ELMo model's open-vocabulary word ids are spelt out by the tokenizer that gave them
    return Predictor(kind, model, model.tokenizer, config, model_dir.info, family_for(kind))


def _text_to_text_predictor(model_dir: ModelDir, kind: str | None, max_seq_length: int | None, batch_size: int,
                            device: str) -> Predictor:
    """`load_predictor` for an encoder-decoder (T5) fine-tuned as text to text: the kind, the GLUE task, the
    columns and lengths it was fine-tuned with come from its finetune.json; it predicts as that kind (a GLUE model
    as classify), greedily."""
    if kind is not None:
        text_to_text_family(kind, model_dir.model_type, "predict")  # the kinds text to text refuses
    info = model_dir.info
    if not info.get("text_to_text"):
        raise ValueError(f"{model_dir} holds a {model_dir.model_type} model that was not fine-tuned for a task (no "
                         f"text-to-text finetune.json); fine-tune it first (bertkit finetune glue|classify|squad), or "
                         f"write free text with bertkit generate --model {model_dir}")
    kind = _trained_kind(model_dir, kind)
    config = FinetuneConfig(kind=model_dir.trained_kind, task=info.get("task"), eval_batch_size=batch_size,
                            max_seq_length=max_seq_length or info.get("max_seq_length"),
                            max_target_length=info.get("max_target_length"),
                            regression=bool(info.get("regression", False)),
                            **{k: info[k] for k in ("text_column", "pair_column") if info.get(k) is not None})
    model = model_dir.load(Text2TextFamily.model_role).to(device).eval()
    return Predictor(kind, model, model_dir.tokenizer(), config, info, Text2TextFamily)


# The predictor loader for what a model directory holds (`ModelDir.form`).
_LOADERS = {"head": _head_predictor, "feature-task": _feature_task_predictor, "text-to-text": _text_to_text_predictor}


# ------------------------------------------------------------------------------------------------------------------
# Evaluating predictions files
# ------------------------------------------------------------------------------------------------------------------
def evaluate_predictions(kind: str, data_path: str | os.PathLike, predictions_path: str | os.PathLike,
                         null_odds_path: str | os.PathLike | None = None, task: str | None = None, *,
                         text_column: str = "text", pair_column: str | None = None, label_column: str = "label",
                         regression: bool = False, column: int | None = None,
                         scheme: str = "auto", **table: Any) -> dict[str, Any]:
    """Metrics of a predictions file against a labelled data file (the family's `evaluate_file`).

    squad: predictions.json ({qid: answer}) and optionally null_odds.json; exactly the official scripts' output
        (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_*, NoAns_*, and with null odds best_exact,
        best_exact_thresh, best_f1, best_f1_thresh). v2.0 is chosen when the data has unanswerable questions.
    glue (task required) / classify (columns as for fine-tuning): one label per line, or a GLUE submission TSV
        (`index<TAB>prediction`); the task's GLUE metrics, or accuracy and macro-F1 (pearson, spearmanr, mse).
    ner: a CoNLL file whose last column is the predicted tag, words in the data file's order; entity-level
        precision, recall, F1 (conlleval rules) and per-type scores; with scheme "none" (plain tags such as POS,
        the data file's tags in `column`) token accuracy.
    swag: one chosen ending index (0-3) per line; accuracy.
    table: how the data file is read, as in fine-tuning (FinetuneConfig's format, records, tokens_column,
        tags_column and the kinds' other column fields).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown evaluation kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "glue" and task is None:
        raise ValueError("glue evaluation needs the task name (--task)")
    config = FinetuneConfig(kind=kind, task=task if kind == "glue" else None, text_column=text_column,
                            pair_column=pair_column, label_column=label_column, regression=regression,
                            column=column, scheme=scheme, **table)
    return family_for(kind)(config).evaluate_file(data_path, predictions_path, null_odds_path)
