"""Knowledge distillation: a frozen teacher -> a smaller student, trained by THE trainer as one more task.

    teacher   any model directory bertkit loads (bertkit's or transformers'); it runs in eval mode under
              torch.no_grad, is never optimised and never saved with the student
    student   a model directory (`student_dir`), or the teacher's config at another size (`student_preset`),
              optionally initialised from chosen teacher layers as DistilBERT does (`student_layers_from_teacher`)

The losses, each with its weight (a weight of 0 switches the term off); the trainer optimises their sum, each
averaged over the global batch (see `bertkit.training.trainer`):

    soft_loss    alpha_soft x T^2 x CE(softmax(teacher / T), log_softmax(student / T))       Hinton et al. 2015
                 (a regression head: alpha_soft x (student - teacher)^2; there is no distribution to soften)
    hard_loss    alpha_hard x the task's own loss on the gold labels (MLM targets, classes, tags)
    logits_loss  alpha_logits x mean squared error between the raw logits                      Ba & Caruana 2014
    hidden_loss  alpha_hidden x mean squared error between student and teacher hidden states, for a
                 student-layer -> teacher-layer map ("uniform": layer m -> m x L_t / L_s, embeddings 0 -> 0, as
                 TinyBERT), through a learned linear projection when the widths differ (trained with the
                 student, kept in resume checkpoints, not in the student's model directory)

Why T^2: the soft targets' gradient is (p_s - p_t) / T per logit, and p_s - p_t itself shrinks like 1/T, so
multiplying by T^2 keeps the soft term's weight against the hard one the same whatever the temperature.

Two drivers, both writing RUN_DIR/model (the student: a normal model directory transformers loads),
RUN_DIR/results.json, metrics.jsonl and resume checkpoints:

    distill_mlm    MLM distillation on the pretraining stream (`bertkit prepare` shards): teacher and student see
                   the same masked batch; the teacher's MLM logits at the masked positions (the sparse
                   `predict_at` path) are the soft targets, the masked tokens the hard ones
    distill_task   a fine-tuned teacher (sequence classification / regression on GLUE or your CSV/TSV/JSONL
                   files, or token classification on CoNLL files) -> a student with the same head, on the
                   training file plus an optional unlabelled transfer set (only the soft losses apply to it);
                   the dev file is evaluated every epoch with the task's metric and the best epoch kept (a
                   classifier's also with teacher_agreement, how often the student's class is the teacher's,
                   and teacher_kl, T^2 x KL from the teacher's dev distribution, 0 = the same). The
                   task side (reading, features, metric, the epoch loop, the best model) is fine-tuning's:
                   `bertkit.tasks` families run by `bertkit.tasks.run.run_task`

Every tokenizer kind works: the teacher's directory holds it (`bertkit.tokenizers.load_tokenizer`), the student is
saved with it, and a student directory must hold the same vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from bertkit.checkpoint import unwrap
from bertkit.config import PRESETS, BertConfig, check_finite, field_with_help, presets_for
from bertkit.data.instances import SpecialIds
from bertkit.data.loader import PretrainingStream, fixed_batches
from bertkit.data.shards import ShardedCorpus
from bertkit.errors import DataError
from bertkit.io import atomic_write, writer_lock
from bertkit.models import (IGNORE_INDEX, ROLE_CLASSES, BertForSequenceClassification, BertForTokenClassification,
                            ModelDir)
from bertkit.models.layouts import mark_host, positions
from bertkit.models.registry import OBJECTIVES
from bertkit.tasks.ner import encode_words, split_words
from bertkit.tasks.run import forward_all, load_task_data, load_task_model, run_task, with_dropout
from bertkit.training.objectives import MaskedLMObjective, evaluate_pretraining
from bertkit.training.pretrain import data_workers, random_token_ids, stream_options
from bertkit.training.trainer import end_distributed, seed_everything, setup_distributed, train

TASK_KINDS = ("glue", "classify", "ner")  # task kinds (bertkit.tasks) that distill_task supports
UNLABELLED = -1  # token label of a transfer-set word: distilled (soft losses), but no gold tag (no hard loss)


_f = field_with_help  # a dataclass field with its help text (the CLI options come from these)


@dataclass(frozen=True)
class DistillConfig:
    """What the student learns from the teacher, and how the student is made."""

    temperature: float = _f(2.0, "T: both logit vectors are divided by T before the softmax of the soft loss")
    alpha_soft: float = _f(1.0, "weight of the soft cross-entropy on the teacher's distribution (times T^2)")
    alpha_hard: float = _f(0.5, "weight of the loss on the gold labels (transfer-set examples have none)")
    alpha_logits: float = _f(0.0, "weight of the mean squared error between student and teacher logits")
    alpha_hidden: float = _f(0.0, "weight of the mean squared error between mapped hidden states")
    hidden_map: str = _f("uniform", "student layer -> teacher layer for the hidden-state loss: uniform, last, or "
                                    "pairs like 0:0,1:2,2:4 (0 = embeddings, k = output of layer k)")
    student_preset: str | None = _f(None, "build the student as the teacher's config at this size preset "
                                          f"({', '.join(PRESETS)})")
    student_layers_from_teacher: str | None = _f(None, "initialise the student from these teacher layers, e.g. "
                                                       "0,2,4 (0-based; embeddings, pooler and head are copied "
                                                       "too), as DistilBERT; needs the teacher's widths")

    def __post_init__(self) -> None:
        weights = {k: getattr(self, k) for k in ("alpha_soft", "alpha_hard", "alpha_logits", "alpha_hidden")}
        check_finite(self, ("temperature", *weights))  # NaN and infinity pass range checks; strings fail them oddly
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        for name, value in weights.items():
            if value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value}")
        if not any(weights.values()):
            raise ValueError("every loss weight is 0: set at least one of alpha_soft, alpha_hard, alpha_logits, "
                             "alpha_hidden")
        if self.student_preset is not None and self.student_preset not in PRESETS:
            raise ValueError(f"unknown student preset {self.student_preset!r}; choose one of {', '.join(PRESETS)}")
        self.teacher_layers  # parses, or raises
        if self.hidden_map not in ("uniform", "last"):
            parse_layer_pairs(self.hidden_map)

    @property
    def teacher_layers(self) -> list[int] | None:
        """student_layers_from_teacher as a list of ints (None when not set)."""
        if self.student_layers_from_teacher is None:
            return None
        try:
            layers = [int(x) for x in str(self.student_layers_from_teacher).split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"student_layers_from_teacher {self.student_layers_from_teacher!r}: give comma-separated "
                             f"layer indices, e.g. 0,2,4") from None
        if not layers or min(layers) < 0:
            raise ValueError(f"student_layers_from_teacher {self.student_layers_from_teacher!r}: give one or more "
                             f"0-based layer indices, e.g. 0,2,4")
        return layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, help) of every DistillConfig field, for the command line."""
    hints = typing.get_type_hints(DistillConfig)
    return [(f.name, hints[f.name], f.default, f.metadata.get("help", "")) for f in dataclasses.fields(DistillConfig)]


# ------------------------------------------------------------------------------------------------------------------
# The losses, as pure functions of logits
# ------------------------------------------------------------------------------------------------------------------
def soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """(N, C), (N, C) logits -> (N,) T^2 x cross-entropy of softmax(student / T) against softmax(teacher / T).

    Its gradient with respect to the student's logits is T x (p_student - p_teacher): zero exactly when the two
    distributions agree. It differs from T^2 x KL(p_teacher || p_student) by the teacher's entropy, a constant.
    """
    target = (teacher.float() / temperature).softmax(-1)
    return -(target * (student.float() / temperature).log_softmax(-1)).sum(-1) * temperature ** 2


def soft_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """(N,) T^2 x KL(p_teacher || p_student) at temperature T: 0 when the student matches the teacher."""
    log_t = (teacher.float() / temperature).log_softmax(-1)
    log_s = (student.float() / temperature).log_softmax(-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1) * temperature ** 2


def parse_layer_pairs(spec: str) -> list[tuple[int, int]]:
    """"0:0,1:2" -> [(0, 0), (1, 2)]: (student hidden state, teacher hidden state), 0 = embeddings."""
    pairs = []
    for item in spec.split(","):
        s, sep, t = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(s), int(t)))
        except ValueError:
            raise ValueError(f"hidden_map {spec!r}: expected uniform, last, or student:teacher pairs such as "
                             f"0:0,1:2,2:4") from None
    return pairs


def layer_map(spec: str, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """The (student, teacher) hidden-state pairs of the hidden-state loss; index 0 is the embedding output.

    uniform: embeddings to embeddings and student layer m to teacher layer floor(m x L_t / L_s) (TinyBERT's
    g(m) = m x N / M), so the last layers always meet; last: the last layers only; or explicit pairs.
    """
    if spec == "uniform":
        pairs = [(m, m * teacher_layers // student_layers) for m in range(student_layers + 1)]
    elif spec == "last":
        pairs = [(student_layers, teacher_layers)]
    else:
        pairs = parse_layer_pairs(spec)
    for s, t in pairs:
        if not 0 <= s <= student_layers or not 0 <= t <= teacher_layers:
            raise ValueError(f"hidden_map pair {s}:{t} is out of range: the student has hidden states "
                             f"0..{student_layers} and the teacher 0..{teacher_layers} (0 = embeddings)")
    return pairs


# ------------------------------------------------------------------------------------------------------------------
# Forward passes: logits and, when asked, hidden states
# ------------------------------------------------------------------------------------------------------------------
def logits_and_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor, predict_at: torch.Tensor | None = None,
                      hidden: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """(logits, hidden states or None) of a bertkit model, of any architecture with these heads.

    MLM models (BertForPreTraining, BertForMaskedLM, ModernBertForMaskedLM): the sparse path, logits (N, V) at the
    `predict_at` positions only. Task models: their forward's logits, (B, C) or (B, T, C). hidden=True adds the
    L + 1 hidden states (B, T, H) (embeddings, then every layer); task models' forward has no switch for them, so
    the encoder runs on its own and the head is applied as the model's forward applies it (ModernBERT's task
    models: their `scores`; a test checks they agree).
    """
    if getattr(model, "head_family", None) in ("mlm", "pretraining"):
        out = model(input_ids, attention_mask, token_type_ids, output_hidden_states=hidden, predict_at=predict_at)
        return out.prediction_logits, out.hidden_states
    if not hidden:
        return model(input_ids, attention_mask, token_type_ids).logits, None
    if hasattr(model, "scores"):  # ModernBERT: the encoder's output in its own layout, then the head
        encoded = model.encoder.encode(input_ids, attention_mask, output_hidden_states=True)
        return model.scores(encoded, attention_mask), encoded.hidden_states
    out = model.bert(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
    if isinstance(model, BertForSequenceClassification):
        logits = model.sentence_logits(out, attention_mask)  # (B, C): the family's own sentence head
    elif isinstance(model, BertForTokenClassification):
        logits = model.classifier(model.dropout(out.last_hidden_state))  # (B, T, C)
    else:
        raise TypeError(f"hidden-state distillation of a {type(model).__name__} is not implemented")
    return logits, out.hidden_states


class DistillationStudent(nn.Module):
    """What the trainer optimises: the student, plus one projection per hidden-state pair when widths differ.

    Its state dict (in resume checkpoints) holds both; the student's model directory holds the student only.
    forward runs the student (inside DistributedDataParallel when there are several processes) and returns its
    logits and its mapped hidden states, projected to the teacher's width.
    """

    def __init__(self, student: nn.Module, pairs: list[tuple[int, int]] = (), teacher_width: int | None = None):
        super().__init__()
        self.student = student
        self.pairs = list(pairs)
        width = student.config.hidden_size
        self.projections = None
        if self.pairs and teacher_width is not None and teacher_width != width:
            self.projections = nn.ModuleList(nn.Linear(width, teacher_width) for _ in self.pairs)
            for proj in self.projections:  # BERT's initialisation, as the student's own layers
                nn.init.normal_(proj.weight, std=student.config.initializer_range)
                nn.init.zeros_(proj.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                predict_at: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits, hidden = logits_and_hidden(self.student, input_ids, attention_mask, token_type_ids, predict_at,
                                       hidden=bool(self.pairs))
        mapped = [hidden[s] for s, _ in self.pairs] if self.pairs else []
        if self.projections is not None:
            mapped = [proj(h) for proj, h in zip(self.projections, mapped)]  # (B, T, H_s) -> (B, T, H_t)
        return logits, mapped


# ------------------------------------------------------------------------------------------------------------------
# The trainer task
# ------------------------------------------------------------------------------------------------------------------
class DistillationTask:
    """Teacher -> student losses of one micro-batch on the trainer's task protocol (see `bertkit.training.trainer`).

    head: "mlm" (batch labels: the masked tokens, IGNORE_INDEX elsewhere), "classification" (labels (B,), IGNORE_INDEX
    for transfer-set rows), "regression" (labels (B,) floats, NaN for transfer-set rows) or "tokens" (labels (B, T):
    tag ids on first sub-words, UNLABELLED on transfer-set words, IGNORE_INDEX elsewhere).

    Loss terms (weighted; see the module docstring): soft_loss, hard_loss, logits_loss, hidden_loss, those with a
    weight above 0. Metrics (unweighted): kl (T^2 x KL to the teacher; 0 = same distribution), agreement (the
    student's top class is the teacher's), accuracy (against the gold labels).
    """

    def __init__(self, teacher: nn.Module, config: DistillConfig, head: str,
                 pairs: list[tuple[int, int]] = ()) -> None:
        if head not in ("mlm", "classification", "regression", "tokens"):
            raise ValueError(f"unknown distillation head {head!r}")
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.config, self.head, self.pairs = config, head, list(pairs)

    # Which outputs are compared, and which of them have gold labels. The masks come from the batch: with the host
    # copies the trainer's move attaches (`mark_host`), the positions they select are known on the host and
    # indexing with them reads nothing from the device (a boolean-mask index would wait for it every step).
    def _positions(self, labels: torch.Tensor) -> torch.Tensor | None:
        """The (B, T) bool mask of the positions compared (MLM: the masked tokens; tokens: the distilled words),
        or None where every row is compared once (classification, regression)."""
        if self.head in ("mlm", "tokens"):
            return mark_host(labels != IGNORE_INDEX, labels, _compared)
        return None

    def _labelled(self, gold: torch.Tensor) -> torch.Tensor:
        """Which compared outputs have a gold label: (N,) bool (transfer-set rows and words have none)."""
        if self.head == "tokens":
            return gold >= 0  # UNLABELLED (-1) marks a transfer-set word
        if self.head == "regression":
            return ~torch.isnan(gold)
        return gold != IGNORE_INDEX

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        c = self.config
        labels = batch["labels"]
        at = self._positions(labels)
        gold = labels[at] if at is not None else labels  # host arrays: the batch before it moves
        n = float(gold.shape[0])
        counts = {}
        if c.alpha_soft > 0:
            counts["soft_loss"] = n
        if c.alpha_hard > 0:
            counts["hard_loss"] = float(self._labelled(gold).sum())
        if c.alpha_logits > 0:
            counts["logits_loss"] = n
        if c.alpha_hidden > 0 and self.pairs:
            counts["hidden_loss"] = float((batch["attention_mask"] == 1).sum()) * len(self.pairs)
        return counts

    def __call__(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        ids, mask, types, labels = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"]
        at = self._positions(labels)
        sparse = at if self.head == "mlm" else None  # MLM: both models project to the vocabulary at `at` only
        hidden = c.alpha_hidden > 0 and bool(self.pairs)
        device = ids.device
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        with torch.no_grad():
            t_logits, t_hidden = logits_and_hidden(self.teacher, ids, mask, types, sparse, hidden)
        s_logits, s_mapped = model(ids, mask, types, sparse)
        if at is not None:
            index = positions(at)  # (N,) flat positions, from the host copy of the labels
            gold = labels.reshape(-1).index_select(0, index)
            if self.head == "tokens":  # (B, T, C) -> (N, C) at the distilled words
                s_logits = s_logits.flatten(0, 1).index_select(0, index)
                t_logits = t_logits.flatten(0, 1).index_select(0, index)
        else:
            gold = labels
        s, t = s_logits.float(), t_logits.float()  # (N, C)
        labelled = self._labelled(gold)  # (N,) bool, on the device: weights, never an index
        weight = labelled.to(s.dtype)
        # Counts as device values (a fill, a sum): a host read here would wait for the device every step
        n = torch.full((), float(s.shape[0]), dtype=s.dtype, device=s.device)
        m = weight.sum()
        out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.head == "regression":
            if c.alpha_soft > 0:
                out["soft_loss"] = (c.alpha_soft * ((s[:, 0] - t[:, 0]) ** 2).sum(), n)
            if c.alpha_hard > 0:
                # A transfer row's NaN target becomes 0 before the product, so neither it nor its gradient is NaN
                diff = (s[:, 0] - torch.nan_to_num(gold.float(), nan=0.0)) * weight
                out["hard_loss"] = (c.alpha_hard * (diff ** 2).sum(), m)
        else:
            target = torch.where(labelled, gold, torch.full_like(gold, IGNORE_INDEX))  # the ignored index elsewhere
            if c.alpha_soft > 0:
                out["soft_loss"] = (c.alpha_soft * soft_cross_entropy(s, t, c.temperature).sum(), n)
            if c.alpha_hard > 0:
                hard = F.cross_entropy(s, target, ignore_index=IGNORE_INDEX, reduction="sum")
                out["hard_loss"] = (c.alpha_hard * hard, m)
            with torch.no_grad():
                top = s.argmax(-1)
                out["kl"] = (soft_kl(s, t, c.temperature).sum(), n)
                out["agreement"] = ((top == t.argmax(-1)).sum().float(), n)
                out["accuracy"] = (((top == gold) & labelled).sum().float(), m)
        if c.alpha_logits > 0:
            out["logits_loss"] = (c.alpha_logits * ((s - t) ** 2).mean(-1).sum(), n)
        if hidden:
            real = positions(mark_host(mask == 1, mask, _real_token))  # (M,): padding is not distilled
            total = s.new_zeros(())
            for (_, j), h in zip(self.pairs, s_mapped):
                diff = (h.float().flatten(0, 1).index_select(0, real)
                        - t_hidden[j].float().flatten(0, 1).index_select(0, real))  # (M, H_t)
                total = total + (diff ** 2).mean(-1).sum()
            out["hidden_loss"] = (c.alpha_hidden * total, n.new_full((), float(real.numel() * len(self.pairs))))
        return out


def _compared(labels: torch.Tensor) -> torch.Tensor:
    return labels != IGNORE_INDEX


def _real_token(attention_mask: torch.Tensor) -> torch.Tensor:
    return attention_mask == 1


# ------------------------------------------------------------------------------------------------------------------
# Teacher and student
# ------------------------------------------------------------------------------------------------------------------
def _vocabulary_file(directory: Path) -> Path | None:
    for name in ("vocab.txt", "vocab.json"):
        if (directory / name).is_file():
            return directory / name
    return None


def check_same_vocabulary(teacher_dir: str | os.PathLike, student_dir: str | os.PathLike) -> None:
    """Refuse a teacher and a student whose tokenizers differ (their logits would index different tokens).

    When both directories have vocabulary files (vocab.txt, or vocab.json and merges.txt), compares them token by
    token and the casing in tokenizer_config.json, the error naming both files and the first difference; otherwise
    (a tokenizer.json, say) compares the loaded tokenizers' vocabularies and how they encode a probe text.
    """
    teacher_dir, student_dir = Path(teacher_dir), Path(student_dir)
    a, b = _vocabulary_file(teacher_dir), _vocabulary_file(student_dir)
    if a is None or b is None:
        _check_same_tokenizer(teacher_dir, student_dir)
        return
    files = [(a, b)]
    if a.name == "vocab.json" and (teacher_dir / "merges.txt").is_file():
        files.append((teacher_dir / "merges.txt", student_dir / "merges.txt"))
    for x, y in files:
        if x.name != y.name or not y.is_file():
            raise ValueError(f"the teacher's and the student's vocabularies differ: {x} vs {student_dir} (which has "
                             f"no {x.name}); distillation compares predictions token by token, so both models need "
                             f"one tokenizer")
        if x.name == "vocab.json":
            ta, tb = json.loads(x.read_text(encoding="utf-8")), json.loads(y.read_text(encoding="utf-8"))
            ta, tb = sorted(ta, key=ta.get), sorted(tb, key=tb.get)
        else:
            ta, tb = x.read_text(encoding="utf-8").splitlines(), y.read_text(encoding="utf-8").splitlines()
        if ta != tb:
            raise ValueError(f"the teacher's and the student's vocabularies differ: {x} has {len(ta)} entries, {y} "
                             f"has {len(tb)}; {_first_difference(ta, tb, 'entry', 1)}. Distillation compares "
                             f"predictions token by token, so both models need one tokenizer")
    casing = []
    for d in (teacher_dir, student_dir):
        path = d / "tokenizer_config.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        casing.append((bool(data.get("do_lower_case", True)), path))
    if casing[0][0] != casing[1][0]:
        raise ValueError(f"the teacher's and the student's tokenizers differ in casing: do_lower_case is "
                         f"{casing[0][0]} in {casing[0][1]} and {casing[1][0]} in {casing[1][1]}")


def _first_difference(a: list[str], b: list[str], unit: str, first: int) -> str:
    """Where two token lists part: "first difference at {unit} N: 'x' vs 'y'" (N counted from `first`), or that
    one is a prefix of the other."""
    common = min(len(a), len(b))
    i = next((i for i, (p, q) in enumerate(zip(a, b)) if p != q), common)
    if i == common:
        return "one is a prefix of the other"
    return f"first difference at {unit} {i + first}: {a[i]!r} vs {b[i]!r}"


def _check_same_tokenizer(teacher_dir: Path, student_dir: Path) -> None:
    """check_same_vocabulary through the tokenizer interface, for kinds without vocab.txt / vocab.json."""
    teacher, student = ModelDir.open(teacher_dir).tokenizer("teacher"), ModelDir.open(student_dir).tokenizer("student")
    ta, tb = (sorted(t.get_vocab(), key=t.get_vocab().get) for t in (teacher, student))
    if ta != tb:
        raise ValueError(f"the teacher's and the student's vocabularies differ: {teacher_dir} has {len(ta)} tokens, "
                         f"{student_dir} has {len(tb)}; {_first_difference(ta, tb, 'id', 0)}. Distillation "
                         f"compares predictions token by token, so both models need one tokenizer")
    probe = "Hello Wörld, ÉCOLE of naïve Tokens 123"  # casing and accents: the same vocabulary, normalised alike?
    if teacher.encode(probe).input_ids != student.encode(probe).input_ids:
        raise ValueError(f"the teacher's and the student's tokenizers differ in normalisation (casing, accents): "
                         f"{teacher_dir} and {student_dir} encode {probe!r} differently")


def copy_teacher_layers(student: nn.Module, teacher: nn.Module, layers: list[int]) -> None:
    """Initialise `student` from `teacher`: student layer i <- teacher layer layers[i]; embeddings, projection,
    pooler and head <- the teacher's where the teacher has them (DistilBERT's initialisation).

    Raises ValueError naming the tensor and both shapes when a shape differs, or a layer the teacher lacks.
    """
    # ALBERT shares weights between layers: its sets of layer weights are what can be copied.
    available = getattr(teacher.config, "num_layer_weights", teacher.config.num_hidden_layers)
    wanted = getattr(student.config, "num_layer_weights", student.config.num_hidden_layers)
    if len(layers) != wanted:
        raise ValueError(f"{len(layers)} teacher layers ({','.join(map(str, layers))}) for a student with "
                         f"{wanted} layers")
    bad = [i for i in layers if not 0 <= i < available]
    if bad:
        raise ValueError(f"the teacher has layers 0..{available - 1}; cannot initialise the student from layer "
                         f"{bad[0]}")
    prefix = student.encoder_prefix + "layers."
    theirs = teacher.state_dict()
    state = {}
    for name, tensor in student.state_dict().items():
        source = name
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            source = f"{prefix}{layers[int(index)]}.{rest}"
        if source not in theirs:
            continue  # a head the teacher does not have starts fresh
        if theirs[source].shape != tensor.shape:
            raise ValueError(f"cannot initialise the student from teacher layers {','.join(map(str, layers))}: "
                             f"tensor {source!r} is {tuple(theirs[source].shape)} in the teacher but "
                             f"{tuple(tensor.shape)} in the student (the teacher's hidden size is "
                             f"{teacher.config.hidden_size}, the student's {student.config.hidden_size})")
        state[name] = theirs[source].detach().clone()
    student.load_state_dict(state, strict=False)


def student_config(teacher_config, preset: str | None = None, layers: list[int] | None = None,
                   dropout: float | None = None, **overrides: Any):
    """The teacher's config (vocabulary, positions, family, activation) at the size of `preset` and/or with
    len(layers) layers; A = H/64 heads and 4H intermediate for a BERT preset, as `BertConfig.preset`; a ModernBERT
    teacher's student takes MODERNBERT_PRESETS' shapes (its rotary, window and attention pattern stay the
    teacher's). overrides: config fields of the student (a `model_type` among them must be the teacher's)."""
    model_type = overrides.pop("model_type", teacher_config.model_type)
    if model_type != teacher_config.model_type:
        raise ValueError(f"the recipe's model section is a {model_type!r} model but the teacher is a "
                         f"{teacher_config.model_type!r} one; a student of another architecture is a model directory "
                         f"of its own: write one (bertkit init --model-type {model_type} --tokenizer TEACHER_DIR) and "
                         f"give it as --student")
    # Kept as a branch: BERT's presets are (L, H) with heads and width derived, the other architectures' whole
    # shapes (MODERNBERT_PRESETS'), so the two resize differently.
    if not isinstance(teacher_config, BertConfig):
        presets = presets_for(teacher_config.model_type)
        if not hasattr(teacher_config, "num_hidden_layers"):
            raise ValueError(f"distillation builds students of the BERT family and ModernBERT, not of model_type "
                             f"{teacher_config.model_type!r}")
        fields = {}
        if preset is not None:
            if preset not in presets:
                raise ValueError(f"unknown student preset {preset!r} for a {teacher_config.model_type} teacher; "
                                 f"choose one of {', '.join(presets)}")
            L, H, A, intermediate = presets[preset]
            fields.update(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=intermediate)
        if layers is not None:
            fields["num_hidden_layers"] = len(layers)
        config = dataclasses.replace(teacher_config, **fields, **overrides)
        return with_dropout(config, dropout) if dropout is not None else config
    fields: dict[str, Any] = {}
    if preset is not None:
        L, H = PRESETS[preset]
        fields.update(num_hidden_layers=L, hidden_size=H, num_attention_heads=max(1, H // 64),
                      intermediate_size=4 * H)
    if layers is not None:
        fields["num_hidden_layers"] = len(layers)
    if teacher_config.num_hidden_groups is not None:
        fields["num_hidden_groups"] = None  # a student of its own size shares nothing
    if dropout is not None:
        fields.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    fields.update(overrides)
    return dataclasses.replace(teacher_config, **fields)


def _load_student(cls, student_dir: Path, dropout: float | None, model_kwargs: dict[str, Any]):
    student = ModelDir.open(student_dir)
    # The student directory may hold another architecture than the teacher (a ModernBERT student of a BERT teacher,
    # say): the class for the same use, of the student's architecture.
    # (ModernBertForMaskedLM is ModernBERT's "pretraining" and "mlm" model alike: MLM distillation means "mlm".)
    roles = [r for row in ROLE_CLASSES.values() for r, c in row.items() if c is cls]
    if roles:
        cls = student.model_class("mlm" if "mlm" in roles else roles[0])
    # An MLM student may start from an encoder-only directory: its MLM head then starts fresh.
    new_heads = cls.requires_pretrained_heads and student.head_role not in ("mlm", "pretraining")
    return load_task_model(cls, student_dir, new_heads=new_heads, dropout=dropout, **model_kwargs)


def build_student(cls, teacher: nn.Module, config: DistillConfig, student_dir: str | os.PathLike | None = None,
                  teacher_dir: str | os.PathLike | None = None, dropout: float | None = None,
                  overrides: dict[str, Any] | None = None, **model_kwargs: Any) -> nn.Module:
    """The student, a `cls` (the teacher's class): from `student_dir`, or from the teacher's config resized by
    config.student_preset / student_layers_from_teacher (fresh BERT initialisation from the current torch seed,
    then the chosen teacher layers copied in). With a directory the vocabularies are checked against
    `teacher_dir`'s, and the student is that directory's architecture (the teacher's or another, its class for the
    same use). overrides: config fields of a student built from the teacher's config.
    """
    layers = config.teacher_layers
    if student_dir is not None:
        if config.student_preset is not None or layers is not None:
            raise ValueError("give either a student model directory (--student) or a student built from the "
                             "teacher (--student-preset / --student-layers-from-teacher), not both")
        student_dir = Path(student_dir)
        if teacher_dir is not None:
            check_same_vocabulary(teacher_dir, student_dir)
        student = _load_student(cls, student_dir, dropout, model_kwargs)
        if student.config.vocab_size != teacher.config.vocab_size:
            raise ValueError(f"the teacher's and the student's vocabularies differ: vocab_size "
                             f"{teacher.config.vocab_size} in {teacher_dir}/config.json, {student.config.vocab_size} "
                             f"in {student_dir}/config.json")
        return student
    if config.student_preset is None and layers is None and not overrides:
        raise ValueError("say which student to train: a student model directory (--student), or the teacher's "
                         "config at a size preset (--student-preset) and/or with fewer of its layers "
                         "(--student-layers-from-teacher, e.g. 0,2,4)")
    student = cls(student_config(teacher.config, config.student_preset, layers, dropout, **(overrides or {})),
                  **model_kwargs)
    if layers is not None:
        copy_teacher_layers(student, teacher, layers)
    return student


def init_student(source_dir: str | os.PathLike, out_dir: str | os.PathLike, *, layers: str | None = None,
                 preset: str | None = None, seed: int = 0) -> Path:
    """Write a student model directory cut from `source_dir`: its config at `preset` size and/or with the given
    layers (e.g. "0,2,4") copied from it, with its tokenizer and heads. Use it as `--student` of several runs
    (e.g. a baseline fine-tuned without the teacher and a distilled one) so they start from the same weights.
    """
    source = ModelDir.open(source_dir)
    tokenizer = source.tokenizer("source")  # whichever kind it holds; the student keeps it
    config = DistillConfig(student_preset=preset, student_layers_from_teacher=layers)
    # The class of the head it holds, among those a student is cut with (else its bare encoder)
    role = source.head_role if source.head_role in ("sequence", "token", "mlm", "pretraining") else "encoder"
    cls = source.model_class(role)
    source = source.load(role)
    kwargs = {k: getattr(source, k) for k in ("num_labels", "labels", "regression") if hasattr(source, k)}
    if cls.__name__ == "BertModel":
        kwargs["add_pooler"] = source.pooler is not None
    torch.manual_seed(seed)
    student = build_student(cls, source, config, **kwargs)
    student.save_pretrained(out_dir, tokenizer=tokenizer)
    return Path(out_dir)


def _load_teacher(cls, teacher_dir: Path, role: str, what: str):
    """The fine-tuned teacher for `role` (its class `cls`), in eval mode; ValueError when the directory holds no
    fine-tuned head of that class."""
    directory = ModelDir.open(teacher_dir)
    architectures = directory.architectures
    needs = next((s for s in ("ForSequenceClassification", "ForTokenClassification") if cls.__name__.endswith(s)),
                 None)
    if needs and not any(a.endswith(needs) for a in architectures):
        raise ValueError(f"{teacher_dir} holds a {' / '.join(architectures) or 'model without a task head'}, not a "
                         f"fine-tuned {cls.__name__}; fine-tune the teacher for {what} first (bertkit finetune)")
    return directory.load(role).eval()


def _pairs_for(config: DistillConfig, student: nn.Module, teacher: nn.Module) -> list[tuple[int, int]]:
    if config.alpha_hidden <= 0:
        return []
    return layer_map(config.hidden_map, student.config.num_hidden_layers, teacher.config.num_hidden_layers)


def _check_positions(model: nn.Module, length: int, who: str, directory) -> None:
    if length > model.config.max_length:
        raise ValueError(f"max_seq_length {length} is longer than the {who}'s max_position_embeddings "
                         f"({model.config.max_length}, {directory})")


# ------------------------------------------------------------------------------------------------------------------
# MLM distillation on the pretraining stream
# ------------------------------------------------------------------------------------------------------------------
def distill_mlm(teacher_dir: str | os.PathLike, data_dir: str | os.PathLike, run_dir: str | os.PathLike,
                config, distill: DistillConfig, student_dir: str | os.PathLike | None = None,
                resume: bool = False, eval_at_start: bool = True):
    """`_distill_mlm` with run_dir locked by rank 0 (`bertkit.io.lock_directory`: a second writer fails at once)."""
    with writer_lock(run_dir, int(os.environ.get("RANK", "0")) == 0):
        return _distill_mlm(teacher_dir, data_dir, run_dir, config, distill, student_dir, resume, eval_at_start)


def _mlm_teacher(teacher_dir: Path, corpus, data_dir: Path, max_seq_length: int, device: torch.device):
    """(the masked-LM class, the teacher on `device` in eval mode) for MLM distillation; ValueError when the shards
    were prepared with another tokenizer or the teacher has fewer positions than the inputs."""
    directory = ModelDir.open(teacher_dir)
    if directory.tokenizer("teacher").vocab_hash() != corpus.manifest.vocab_hash:
        raise ValueError(f"{data_dir} was prepared with another tokenizer ({corpus.manifest.tokenizer_dir}) than the "
                         f"teacher's ({teacher_dir}); prepare the data with the teacher's tokenizer")
    teacher = directory.load("mlm").eval().to(device)
    _check_positions(teacher, max_seq_length, "teacher", teacher_dir)
    return directory.model_class("mlm"), teacher  # BertForMaskedLM, ModernBertForMaskedLM, ...


def _mlm_batches(corpus, data_dir: Path, tokenizer, config, dist_info, device: torch.device):
    """(this rank's training stream, the fixed held-out batches or None) of MLM distillation: the recipe's data
    section read exactly as pretraining reads it; held-out batches on rank 0 when the shards have an eval split
    and eval_instances > 0."""
    d = config.data
    options = stream_options(d)
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    random_ids = random_token_ids(tokenizer)
    stream = PretrainingStream(corpus, options, special, tokenizer.vocab_size, d.batch_size, seed=config.train.seed,
                               rank=dist_info.rank, world_size=dist_info.world_size, random_ids=random_ids,
                               workers=data_workers(d.workers, device, dist_info))
    if "eval" not in corpus.manifest.splits or not dist_info.is_main or d.eval_instances <= 0:
        return stream, None
    eval_stream = PretrainingStream(ShardedCorpus(data_dir, "eval").require_documents(),
                                    dataclasses.replace(options, dupe_factor=None), special,
                                    tokenizer.vocab_size, d.batch_size, seed=12345, random_ids=random_ids)
    return stream, fixed_batches(eval_stream, d.eval_instances, min(d.batch_size, 64))


def _distill_mlm(teacher_dir: str | os.PathLike, data_dir: str | os.PathLike, run_dir: str | os.PathLike,
                 config, distill: DistillConfig, student_dir: str | os.PathLike | None = None,
                 resume: bool = False, eval_at_start: bool = True):
    """Distil the MLM teacher in `teacher_dir` into a student on `bertkit prepare` shards.

    config: a `bertkit.training.pretrain.PretrainConfig` (data: objective for the instances, batch, length, masking;
        train: the optimiser and budget; model: BertConfig fields of a student built from the teacher's config;
        its preset is not used: the student is `student_dir` or distill.student_preset / layers).
    Teacher and student get the same masked batches; the pair task (NSP/SOP) of the instances is not distilled.
    Writes RUN_DIR/model (a BertForMaskedLM directory), metrics.jsonl, checkpoints/, config.yaml, results.json
    (held-out MLM metrics of the student, and of the teacher for reference). Returns the TrainResult.
    """
    teacher_dir, data_dir, run_dir = Path(teacher_dir), Path(data_dir), Path(run_dir)
    d = config.data
    if not OBJECTIVES[d.objective].masked_lm:
        raise ValueError(f"MLM distillation reads masked-LM batches: use one of the objectives "
                         f"{', '.join(o.name for o in OBJECTIVES.values() if o.masked_lm)} for the instances "
                         f"(got {d.objective!r})")
    dist_info, device = setup_distributed(config.train.device)
    corpus = ShardedCorpus(data_dir, "train").require_documents()
    tokenizer = corpus.manifest.load_tokenizer()  # WordPiece or byte-level BPE, as the shards were made with
    mlm_class, teacher = _mlm_teacher(teacher_dir, corpus, data_dir, d.max_seq_length, device)
    seed_everything(config.train.seed)
    student = build_student(mlm_class, teacher, distill, student_dir, teacher_dir, overrides=dict(config.model))
    _check_positions(student, d.max_seq_length, "student", student_dir or "its config")
    pairs = _pairs_for(distill, student, teacher)
    model = DistillationStudent(student, pairs, teacher.config.hidden_size)
    task = DistillationTask(teacher, distill, "mlm", pairs)

    stream, eval_batches = _mlm_batches(corpus, data_dir, tokenizer, config, dist_info, device)
    teacher_eval = {}
    objective = MaskedLMObjective(pair_task=None)
    if eval_batches is not None:
        with torch.no_grad():
            teacher_eval = evaluate_pretraining(teacher, objective, eval_batches)

    def evaluate(m):  # the student on the fixed held-out batches
        return evaluate_pretraining(unwrap(m).student, objective, eval_batches)

    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {"teacher": str(teacher_dir), "student": str(student_dir) if student_dir else None,
                    "data_dir": str(data_dir), "distill": distill.to_dict(), **config.to_dict(),
                    "world_size": dist_info.world_size, "student_config": student.config.to_dict(),
                    "teacher_config": teacher.config.to_dict()}
        resolved.pop("preset", None)
        atomic_write(run_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        print(f"distilling {teacher_dir} ({teacher.num_parameters() / 1e6:.1f}M parameters) into a "
              f"{student.config.num_hidden_layers}-layer, {student.config.hidden_size}-wide student "
              f"({student.num_parameters() / 1e6:.1f}M) by MLM on {corpus.num_tokens:,} tokens, on {device}",
              flush=True)

    def save_model(m, step):  # the student's model directory tracks the latest checkpoint
        unwrap(m).student.save_pretrained(run_dir / "model", tokenizer=tokenizer)

    result = train(model, task, stream, config.train, run_dir, evaluate=evaluate if eval_batches is not None else None,
                   resume=resume, on_save=save_model, dist_info=dist_info, device=device, eval_at_start=eval_at_start)
    if dist_info.is_main:
        summary = {**dataclasses.asdict(result), "teacher_eval": teacher_eval,
                   "teacher_parameters": teacher.num_parameters(), "student_parameters": student.num_parameters(),
                   "model": str(run_dir / "model")}
        atomic_write(run_dir / "results.json", json.dumps(summary, indent=2, default=float) + "\n")
    end_distributed()
    return result


# ------------------------------------------------------------------------------------------------------------------
# Task distillation: fine-tuned teacher -> student with the same head
# ------------------------------------------------------------------------------------------------------------------
def read_transfer(path: str | os.PathLike, family, tokenizer, finetune_config) -> list[dict[str, Any]]:
    """Features of an unlabelled transfer set: only the soft losses apply to them.

    classify / glue: a .txt file (one text per line; a tab separates a pair), or a file the task reads (GLUE TSV,
        your CSV/TSV/JSONL with the text and pair columns) whose labels, if any, are ignored.
    ner: a .txt file of sentences, one per line, split into words and punctuation like `bertkit predict ner`.
    """
    path = Path(path)
    c = finetune_config
    lines = None
    if path.suffix.lower() == ".txt":
        lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                 if line.strip()]
    if c.kind == "ner":
        if lines is None:
            raise ValueError(f"{path}: an NER transfer set is a .txt file of sentences, one per line")
        sentences = [[w for w, _, _ in split_words(text)] for _, text in lines]
        features = encode_words(tokenizer, sentences, c.seq_length)
        for f in features:  # each word's first sub-word is distilled, as training labels sit there
            f["labels"] = [UNLABELLED if w is not None and w != prev else IGNORE_INDEX
                           for w, prev in zip(f["word_ids"], [None] + f["word_ids"][:-1])]
    else:
        paired = family.paired
        if lines is not None:
            texts = [line.split("\t") for _, line in lines]
            for (number, _), fields in zip(lines, texts):
                if paired and len(fields) < 2:
                    raise DataError.at(path, number, "this task takes sentence pairs: give text<TAB>pair")
            pairs = [f[1] for f in texts] if paired else None
            texts = [f[0] if paired else "\t".join(f) for f in texts]
        else:
            examples = family.read_texts(path)
            texts, pairs = [e.text for e in examples], [e.pair for e in examples] if paired else None
        features = family.encode(texts, pairs, tokenizer)
        blank = float("nan") if family.regression else IGNORE_INDEX
        for f in features:
            f["label"] = blank
    if not features:
        raise DataError.at(path, None, "the transfer set is empty")
    return features


def _task_teacher(data, teacher_dir: Path, train_path, device: torch.device):
    """(the task model class, the fine-tuned teacher on `device`), checked against the task: its positions cover
    the inputs, its head is the task's (labels, or regression)."""
    config, family, kind = data.config, data.family, data.kind
    cls = data.model_dir.model_class(family.model_role, kind)
    teacher = _load_teacher(cls, teacher_dir, family.model_role,
                            kind if kind != "glue" else f"glue {config.task}").to(device)
    _check_positions(teacher, config.seq_length, "teacher", teacher_dir)
    regression = getattr(family, "regression", False)
    if teacher.regression != regression or (not regression and teacher.labels != family.labels):
        have = "a regression head" if teacher.regression else f"labels {teacher.labels}"
        want = "a regression head" if regression else f"labels {family.labels}"
        raise ValueError(f"the teacher {teacher_dir}/config.json has {have}, but {train_path} needs {want}; "
                         f"distil a teacher fine-tuned on this task")
    return cls, teacher


def _teacher_reference(teacher, data, head: str, temperature: float):
    """The teacher's dev metrics, the reference the student is measured against, and for a classifier the
    student's extra dev metrics: how often its class is the teacher's, and how close (None for other heads)."""
    logits = forward_all(teacher, data.dev_features, data.tokenizer.pad_id, data.config.eval_batch_size)
    metrics, output = data.family.evaluate(data.dev_examples, data.dev_features, logits)
    if head != "classification":
        return metrics, None
    teacher_top = np.asarray(output).argmax(-1)
    teacher_dev = torch.as_tensor(output, dtype=torch.float32)

    def agreement(output) -> dict[str, float]:
        output = np.asarray(output)
        return {"teacher_agreement": float(np.mean(output.argmax(-1) == teacher_top)),
                "teacher_kl": float(soft_kl(torch.as_tensor(output, dtype=torch.float32), teacher_dev,
                                            temperature).mean())}
    return metrics, agreement


def distill_task(kind: str, teacher_dir: str | os.PathLike, train_path: str | os.PathLike,
                 dev_path: str | os.PathLike, run_dir: str | os.PathLike, config=None,
                 distill: DistillConfig | None = None, *, student_dir: str | os.PathLike | None = None,
                 transfer_path: str | os.PathLike | None = None, resume: bool = False,
                 stop_after_steps: int | None = None) -> dict[str, Any]:
    """Distil a fine-tuned teacher into a student with the same head, on a task's training file (hard + soft
    losses) and an optional unlabelled transfer set (soft losses only), evaluating on dev every epoch.

    Args:
        kind: glue, classify or ner (the families of `bertkit.tasks`: readers, features, metrics).
        teacher_dir: a fine-tuned model directory for the task (BertForSequenceClassification / ...ForToken...,
            any family), with its tokenizer (any kind).
        train_path, dev_path: task files as for `bertkit finetune`; the labels must be the teacher's.
        run_dir: metrics.jsonl, eval.jsonl, checkpoints/, model/ (the best epoch's student), results.json.
        config: a FinetuneConfig (epochs, learning rate, batch, lengths, seed, ...), as for fine-tuning.
        distill: the losses and how the student is made (DistillConfig).
        student_dir: the student's starting point (a model directory with the teacher's vocabulary); else the
            student is built from the teacher's config (distill.student_preset / student_layers_from_teacher).
        transfer_path: unlabelled examples (see `read_transfer`), mixed into the training examples.
        resume: continue from the newest checkpoint in run_dir; stop_after_steps: stop early as if interrupted.
    Returns:
        The content of results.json: the teacher's dev metrics, every epoch's student metrics, the best, sizes.
    """
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown distillation kind {kind!r}; choose one of mlm, {', '.join(TASK_KINDS)}")
    distill = distill or DistillConfig()
    teacher_dir, run_dir = Path(teacher_dir), Path(run_dir)
    data = load_task_data(kind, teacher_dir, train_path, dev_path, config, who="teacher")
    config, family, tokenizer = data.config, data.family, data.tokenizer

    dist_info, device = setup_distributed(config.device)
    cls, teacher = _task_teacher(data, teacher_dir, train_path, device)
    regression = getattr(family, "regression", False)
    transfer = read_transfer(transfer_path, family, tokenizer, config) if transfer_path is not None else []

    seed_everything(config.seed)  # the student's fresh weights (its head, or all of it) come from the seed
    student = build_student(cls, teacher, distill, student_dir, teacher_dir, dropout=config.dropout,
                            **family.model_kwargs())
    _check_positions(student, config.seq_length, "student", student_dir or "its config")
    pairs = _pairs_for(distill, student, teacher)
    model = DistillationStudent(student, pairs, teacher.config.hidden_size)
    head = "tokens" if kind == "ner" else ("regression" if regression else "classification")
    task = DistillationTask(teacher, distill, head, pairs)

    teacher_metrics, agreement = _teacher_reference(teacher, data, head, distill.temperature)
    summary = {"kind": kind, "task": config.task, "teacher_dir": str(teacher_dir),
               "student_dir": str(student_dir) if student_dir is not None else None, "train": str(train_path),
               "dev": str(dev_path), "transfer": str(transfer_path) if transfer_path is not None else None,
               "transfer_examples": len(transfer),
               "teacher": {"parameters": teacher.num_parameters(), "layers": teacher.config.num_hidden_layers,
                           "hidden_size": teacher.config.hidden_size, **teacher_metrics},
               "student": {"parameters": student.num_parameters(), "layers": student.config.num_hidden_layers,
                           "hidden_size": student.config.hidden_size},
               "distill": distill.to_dict()}
    resolved = {"kind": kind, "teacher": str(teacher_dir), "student": str(student_dir) if student_dir else None,
                "train": str(train_path), "dev": str(dev_path),
                "transfer": str(transfer_path) if transfer_path is not None else None,
                "distill": distill.to_dict(), "finetune": config.to_dict(),
                "student_config": student.config.to_dict(), "teacher_config": teacher.config.to_dict()}

    def banner(max_steps: int, steps_per_epoch: int) -> str:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in teacher_metrics.items() if k in family.metric_names)
        return (f"distilling {kind}{' ' + config.task if config.task else ''}: teacher {teacher_dir} "
                f"({teacher.num_parameters() / 1e6:.1f}M parameters, {teacher.config.num_hidden_layers} layers; dev "
                f"{shown}) -> student ({student.num_parameters() / 1e6:.1f}M, {student.config.num_hidden_layers} "
                f"layers) on {len(data.train_features):,} labelled + {len(transfer):,} transfer inputs: "
                f"{max_steps} steps of {config.batch_size}, on {device}")

    with writer_lock(run_dir, dist_info.is_main):  # one writer per run directory (a second one fails at once)
        return run_task(data, model, task, run_dir, dist_info=dist_info, device=device, resume=resume,
                        stop_after_steps=stop_after_steps, extra_features=transfer, evaluated=lambda m: m.student,
                        extra_metrics=agreement,
                        summary=summary, resolved=resolved, banner=banner)
