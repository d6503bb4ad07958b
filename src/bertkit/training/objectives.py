"""Pretraining objectives as trainer tasks: they turn a masked batch into summed losses and metrics.

BERT = MLM + NSP, ALBERT = MLM + SOP (the same two-way head on the pooled output, other instances),
RoBERTa = MLM only, ELECTRA = generator MLM + 50 x replaced-token detection on every token, a causal LM =
next-token prediction, and T5 = span corruption (the decoder writes the dropped spans after their sentinels).
Each returns, per term, (sum over the micro-batch, count), so the trainer can average over the global batch exactly
(see `bertkit.training.trainer`). Which task, model, instances and stream an objective has is its row of the objective
table (`bertkit.models.registry.OBJECTIVES`); each task builds itself from its row and the recipe's settings
(`for_recipe`), and `build_pretraining` pairs it with its model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import bertkit.models as models
from bertkit.data.masking import row_uniforms
from bertkit.models import IGNORE_INDEX
from bertkit.models.layouts import mark_host, positions
from bertkit.models.registry import OBJECTIVE_MODEL_TYPES, OBJECTIVES, Objective, architecture, objective


def _count(n: int, like: torch.Tensor) -> torch.Tensor:
    """A host count as a float32 () tensor beside `like`, written by a fill kernel: `new_tensor(n)` would copy it
    from pageable host memory, which waits for the device's queue."""
    return torch.full((), float(n), dtype=torch.float32, device=like.device)


def _labelled(labels: torch.Tensor) -> torch.Tensor:
    return labels != IGNORE_INDEX


def _real(attention_mask: torch.Tensor) -> torch.Tensor:
    return attention_mask != 0


@dataclass
class MaskedLMObjective:
    """MLM (+ NSP or SOP) on a `BertForPreTraining`-like model.

    sparse_prediction: project to the vocabulary only at masked positions (same loss, far fewer FLOPs).
    """

    pair_task: str | None = "nsp"
    sparse_prediction: bool = True

    @classmethod
    def for_recipe(cls, row: Objective, settings: dict[str, Any]) -> "MaskedLMObjective":
        return cls(pair_task=row.pair_task, sparse_prediction=settings.get("sparse_prediction", True))

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        counts = {"mlm_loss": float((batch["labels"] != IGNORE_INDEX).sum())}
        if self.pair_task is not None:
            counts[f"{self.pair_task}_loss"] = float((batch["next_sentence_label"] != IGNORE_INDEX).sum())
        return counts

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        labels = batch["labels"]
        # The masks come from the batch: with the host copies the trainer's move attaches, their positions are
        # known on the host and the indexing below reads nothing from the device (`positions`)
        at = mark_host(labels != IGNORE_INDEX, labels, _labelled)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    predict_at=at if self.sparse_prediction else None)
        index = positions(at)  # (N,)
        logits = (out.prediction_logits if self.sparse_prediction
                  else out.prediction_logits.flatten(0, 1).index_select(0, index))  # (N, V)
        targets = labels.reshape(-1).index_select(0, index)
        n = _count(targets.numel(), targets)
        result = {
            "mlm_loss": (F.cross_entropy(logits.float(), targets, reduction="sum"), n),
            "mlm_accuracy": ((logits.argmax(-1) == targets).sum().float(), n),
        }
        if self.pair_task is not None:
            pair = batch["next_sentence_label"]
            keep = mark_host(pair != IGNORE_INDEX, pair, _labelled)
            kept = positions(keep)
            scores = out.seq_relationship_logits.index_select(0, kept)
            pair = pair.index_select(0, kept)
            m = keep.sum().float()
            result[f"{self.pair_task}_loss"] = (F.cross_entropy(scores.float(), pair, reduction="sum"), m)
            result[f"{self.pair_task}_accuracy"] = ((scores.argmax(-1) == pair).sum().float(), m)
        return result


def evaluate_pretraining(model: torch.nn.Module, objective: MaskedLMObjective, batches) -> dict[str, float]:
    """MLM accuracy, loss and perplexity (and pair-task accuracy) over fixed held-out batches."""
    device = next(model.parameters()).device
    sums: dict[str, list[float]] = {}
    for batch in batches:
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for k, (value, count) in objective(model, batch).items():
            acc = sums.setdefault(k, [0.0, 0.0])
            acc[0] += float(value)
            acc[1] += float(count)
    metrics = {k: v / max(c, 1.0) for k, (v, c) in sums.items()}
    if "mlm_loss" in metrics:
        metrics["perplexity"] = float(torch.tensor(metrics["mlm_loss"]).exp())
    elif "lm_loss" in metrics:  # the causal LM's next-token perplexity
        metrics["perplexity"] = float(torch.tensor(metrics["lm_loss"]).exp())
    elif "plm_loss" in metrics:  # XLNet: the perplexity of the predicted tokens
        metrics["perplexity"] = float(torch.tensor(metrics["plm_loss"]).exp())
    elif "span_loss" in metrics:  # T5: the perplexity of the targets (sentinels, dropped spans, EOS)
        metrics["perplexity"] = float(torch.tensor(metrics["span_loss"]).exp())
    elif "forward_loss" in metrics:  # ELMo: each direction's word perplexity, and their geometric mean
        for side in ("forward", "backward"):
            metrics[f"{side}_perplexity"] = float(torch.tensor(metrics[f"{side}_loss"]).exp())
        metrics["perplexity"] = float(torch.tensor((metrics["forward_loss"] + metrics["backward_loss"]) / 2).exp())
    return metrics


# ------------------------------------------------------------------------------------------------------------------
# ELECTRA and the causal LM: objectives on other models than BertForPreTraining
# ------------------------------------------------------------------------------------------------------------------
def original_ids(batch: dict[str, Any]) -> torch.Tensor:
    """(B, T) the ids before masking: the labels where a position was picked, the input elsewhere."""
    labels = batch["labels"]
    return torch.where(labels != IGNORE_INDEX, labels, batch["input_ids"])


@dataclass
class ElectraObjective:
    """Replaced-token detection (ELECTRA, section 2) on a `bertkit.models.GeneratorDiscriminator`.

    The generator is trained by MLM on the masked positions; its samples replace those positions, and the
    discriminator is trained by binary cross-entropy on every real token (padding excluded, special tokens
    included, as in the paper's code) to say whether it was replaced. A sample equal to the original counts as
    original. Loss = mlm_loss + rtd_weight x rtd_bce (50 in the paper); `rtd_loss` is the weighted term, so the
    trainer's sum of `_loss` terms is the paper's loss, and `rtd_bce` reports the unweighted one.

    The samples are drawn by inversion from uniforms that depend on the batch's "_draw" key (seed, step,
    micro-batch, first global row; the trainer sets it) and the row and position only (`row_uniforms`): a run on
    N processes replaces the same tokens as one process with the same global batch, and a resumed run the same
    as the uninterrupted one. A batch without the key draws from torch's global generator.
    """

    rtd_weight: float = 50.0

    @classmethod
    def for_recipe(cls, row: Objective, settings: dict[str, Any]) -> "ElectraObjective":
        return cls(rtd_weight=settings.get("rtd_weight", 50.0))

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"mlm_loss": float((batch["labels"] != IGNORE_INDEX).sum()),
                "rtd_loss": float(batch["attention_mask"].ne(0).sum())}

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        uniforms = None
        if "_draw" in batch:  # (seed, step, micro-batch, first global row): the trainer's key for this batch's draws
            ids = batch["input_ids"]
            host = torch.from_numpy(row_uniforms(*batch["_draw"], rows=ids.shape[0], width=ids.shape[1]))
            uniforms = host.to(ids.device, non_blocking=True)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels=batch["labels"],
                    uniforms=uniforms)
        targets = out.mlm_labels  # (N,)
        n = _count(targets.numel(), targets)
        mask = batch["attention_mask"]
        real = mark_host(_real(mask), mask, _real)  # (B, T); packed rows number their documents 1, 2, ...
        m = real.sum().float()
        index = positions(real)  # (M,) from the mask's host copy where it has one: no device read
        scores = out.rtd_logits.flatten(0, 1).index_select(0, index).float()
        replaced = out.rtd_labels.flatten(0, 1).index_select(0, index)
        bce = F.binary_cross_entropy_with_logits(scores, replaced, reduction="sum")
        return {
            "mlm_loss": (F.cross_entropy(out.mlm_logits.float(), targets, reduction="sum"), n),
            "mlm_accuracy": ((out.mlm_logits.argmax(-1) == targets).sum().float(), n),
            "rtd_loss": (self.rtd_weight * bce, m),
            "rtd_bce": (bce.detach(), m),
            "rtd_accuracy": (((scores > 0).float() == replaced).sum().float(), m),
            "replaced_fraction": (replaced.sum(), m),
        }


@dataclass
class CausalLMObjective:
    """Next-token prediction on a `bertkit.models.BertForCausalLM`: position t is scored on token t + 1.

    It reads the same batches as the MLM objectives and undoes their masking (`original_ids`), so the pretraining
    stream needs no causal variant; use instances without a pair task (FULL-SENTENCES).
    """

    @classmethod
    def for_recipe(cls, row: Objective, settings: dict[str, Any]) -> "CausalLMObjective":
        return cls()

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"lm_loss": float(next_token_targets(batch["attention_mask"]).sum())}

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        ids, mask = original_ids(batch), batch["attention_mask"]
        logits = model(ids, mask, batch.get("token_type_ids")).logits[:, :-1]  # (B, T-1, V)
        # a next token of the same document to predict; its positions from the mask's host copy (no device read)
        keep = mark_host(next_token_targets(mask), mask, next_token_targets)
        index = positions(keep)  # (N,)
        scores = logits.flatten(0, 1).index_select(0, index).float()  # (N, V)
        targets = ids[:, 1:].reshape(-1).index_select(0, index)  # (N,)
        n = _count(targets.numel(), targets)
        return {"lm_loss": (F.cross_entropy(scores, targets, reduction="sum"), n),
                "lm_accuracy": ((scores.argmax(-1) == targets).sum().float(), n)}


def next_token_targets(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B, T-1) bool: position t has a next token to predict (real, and of t's document)."""
    nxt = attention_mask[:, 1:]
    return (nxt != 0) & (nxt == attention_mask[:, :-1])


class _LabelCounted:
    """An objective that takes no recipe settings and has one loss term, `loss_name`, over the labelled positions
    (labels other than IGNORE_INDEX)."""

    loss_name = ""

    @classmethod
    def for_recipe(cls, row: Objective, settings: dict[str, Any]) -> "_LabelCounted":
        return cls()

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {self.loss_name: float((batch["labels"] != IGNORE_INDEX).sum())}


@dataclass
class SpanCorruptionObjective(_LabelCounted):
    """T5's span corruption on a `bertkit.models.T5ForConditionalGeneration`: the encoder reads the corrupted
    input (each dropped span replaced by a sentinel), the decoder is trained by cross-entropy to write the target
    (each sentinel followed by its span, then EOS) token by token. The batches are the "spans" instances of
    `bertkit.data.loader` (labels (B, T), padding IGNORE_INDEX)."""

    loss_name = "span_loss"

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        labels = batch["labels"]
        # The logits at the real labels only (packed on the fast path); the loss here is a sum, so that the trainer
        # averages over the global batch.
        scores = model(batch["input_ids"], batch["attention_mask"], labels=labels, at_labels=True).logits.float()
        at = positions(mark_host(labels != IGNORE_INDEX, labels, _labelled))  # (N,) from the host copy
        targets = labels.reshape(-1).index_select(0, at)  # (N,), scores (N, V)
        n = _count(targets.numel(), targets)
        return {"span_loss": (F.cross_entropy(scores, targets, reduction="sum"), n),
                "span_accuracy": ((scores.argmax(-1) == targets).sum().float(), n)}


@dataclass
class BiLMObjective:
    """ELMo's biLM on a `bertkit.models.ElmoLanguageModel`: the forward LSTMs predict each next word, the backward
    LSTMs each previous word, both through the shared softmax; the two losses are logged apart
    (`forward_loss`, `backward_loss`) and their sum is optimised.

    The batches are word windows (`bertkit.data.lmstream.WordWindowStream`: input_ids (B, T + 1)); `char_table`
    (V, W) spells every word id in characters (`WordTokenizer.char_table`). lstm_state "carry": the forward LSTMs
    start each batch from the state the previous batch left (the lanes continue), as bilm-tf trains; the state
    goes into the batch's data position, so a resumed run continues with it. "reset": every batch starts from
    zeros. The backward LSTMs always start from zeros at the window's right end: a state carried from the previous
    window would come from the text before, which the backward direction must never see. Evaluation resets.
    """

    char_table: torch.Tensor
    lstm_state: str = "carry"

    def __post_init__(self) -> None:
        if self.lstm_state not in ("carry", "reset"):
            raise ValueError(f"lstm_state must be carry or reset, got {self.lstm_state!r}")
        self.carried = None

    @classmethod
    def for_recipe(cls, row: Objective, settings: dict[str, Any]) -> "BiLMObjective":
        """settings["char_table"]: (V, W) the word tokenizer's spellings (zeros without a tokenizer)."""
        return cls(settings["char_table"], settings.get("lstm_state", "carry"))

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        real = batch["attention_mask"].ne(0)
        n = float((real[:, 1:] & real[:, :-1]).sum())
        return {"forward_loss": n, "backward_loss": n}

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        ids = batch["input_ids"]
        self.char_table = self.char_table.to(ids.device)
        chars = self.char_table[ids]  # (B, T+1, W)
        training = model.training
        state = None
        if training and self.lstm_state == "carry":
            if "_carried" in batch:  # a resumed run: the state the checkpoint kept
                carried = batch["_carried"]
                self.carried = [(h.to(ids.device), c.to(ids.device)) for h, c in zip(carried["h"], carried["c"])]
            if self.carried is not None and self.carried[0][0].shape[0] == ids.shape[0]:
                state = self.carried
        out = model(chars, ids, batch["attention_mask"], state)
        if training and self.lstm_state == "carry":
            self.carried = out.state
            if isinstance(batch.get("_state"), dict):  # checkpointed with the data position (copied to the host
                # by the trainer at a save only: no copy, and so no wait for the device, every step)
                batch["_state"]["carried"] = {"h": [h for h, _ in out.state], "c": [c for _, c in out.state]}
        return {"forward_loss": (out.forward_loss, out.forward_count),
                "backward_loss": (out.backward_loss, out.backward_count)}


class PermutationLMObjective(_LabelCounted):
    """XLNet's permutation LM on a `bertkit.models.XLNetLMHeadModel`: the query stream predicts each target token
    from the tokens before it in the factorisation order (the "xlnet" batches of `bertkit.data.loader`: perm_mask,
    target_mapping, labels (B, P)), with the memory the previous segment of each row left.

    The memory lives here between micro-batches, and a copy rides in the batch's data position, which the trainer
    saves with every checkpoint: a resumed run starts with the memory the uninterrupted run had (this rank's; under
    DDP the other ranks start theirs afresh at a resume). Rows that start afresh (`first_segment`) have none.
    Held-out batches (without a data position) use and leave no memory.
    """

    def __init__(self) -> None:
        self.mems: list[torch.Tensor] | None = None

    loss_name = "plm_loss"

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        training = "_state" in batch
        mems = None
        if training and not batch.get("first_segment", False):
            mems = batch.get("mems", self.mems)
            device = batch["input_ids"].device
            mems = None if mems is None or mems[0].shape[0] != batch["input_ids"].shape[0] else \
                [m.to(device) for m in mems]
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], mems=mems,
                    perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"], use_mems=training)
        if training:
            self.mems = out.mems
            batch["_state"]["mems"] = out.mems  # saved with the data position at a checkpoint
        labels = batch["labels"].reshape(-1)  # (B * P,), IGNORE_INDEX past each row's targets
        scores = out.logits.reshape(labels.numel(), -1).float()  # (B * P, V): no copy of the labelled rows
        n = (labels != IGNORE_INDEX).sum().float()
        return {"plm_loss": (F.cross_entropy(scores, labels, ignore_index=IGNORE_INDEX, reduction="sum"), n),
                "plm_accuracy": ((scores.argmax(-1) == labels).sum().float(), n)}


def check_objective(objective: str, model_type: str | None) -> None:
    """ValueError in one line where the architecture's row (bertkit.models.registry) does not take the objective,
    or the objective trains another architecture only (t5, xlnet, elmo)."""
    row = architecture(model_type)
    owner = OBJECTIVE_MODEL_TYPES.get(objective)
    own = row.implied_by is not None and row.objectives == (row.implied_by,)  # an architecture of one objective
    if (owner is not None and owner != row.name) or (own and objective not in row.objectives):
        trained = architecture(owner) if owner is not None else row
        raise ValueError(f"the {trained.implied_by} objective trains {trained.label} models, and {trained.label} "
                         f"models pretrain with it only: objective {objective!r} with model_type {model_type!r}")
    if objective not in row.objectives:
        why = (f"a sentence-pair head (NSP / SOP), which {row.label} does not have"
               if objective in OBJECTIVES and OBJECTIVES[objective].pair_task is not None else "another architecture")
        raise ValueError(f"the {objective} objective trains {why}; a {row.label} model (model_type {row.name}) "
                         f"pretrains with the objectives {', '.join(row.objectives)}")


def build_pretraining(name: str, config, **settings: Any):
    """(model, objective) that pretrain with objective `name` (a row of the objective table) on a model of `config`.

    The model is the row's `model` class (ELECTRA's GeneratorDiscriminator, the causal LM), else the class of the
    architecture's `model_role` (BertForPreTraining, ModernBERT's masked LM, T5's encoder-decoder, XLNet's LM head
    model, ELMo's biLM); the objective is the row's class built by its `for_recipe` from `settings` (the recipe's
    data fields: sparse_prediction, rtd_weight, generator_fraction, lstm_state; ELMo's char_table).
    """
    row = objective(name)
    if row.requires is not None:
        field_name, value, why = row.requires
        if getattr(config, field_name, None) != value:
            raise ValueError(why + ("" if hasattr(config, field_name) else
                                    f" (model_type {config.model_type!r} has no {field_name} variant)"))
    check_objective(name, config.model_type)  # the architecture's row takes the objective
    task = globals()[row.task_class].for_recipe(row, settings)
    if row.model is not None:
        cls = getattr(models, row.model)
        return cls(config, **{k: settings[k] for k in row.model_settings if k in settings}), task
    model = models.class_for(config, row.model_role)(config)
    if row.pair_task is not None and getattr(model, "nsp", None) is None:
        raise ValueError(f"the {name} objective trains a sentence-pair head, which model_type {config.model_type!r} "
                         f"does not have")
    if row.masked_lm and row.pair_task is None and getattr(model, "nsp", None) is not None:
        # MLM alone on a model with a pair head (RoBERTa's rows on a BERT config): the head and the pooler get no
        # gradient, which DistributedDataParallel refuses; frozen, they train (not at all) the same on any world size
        model.nsp.requires_grad_(False)
        if model.bert.pooler is not None:
            model.bert.pooler.requires_grad_(False)
    return model, task
