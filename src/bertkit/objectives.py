"""Pretraining objectives as trainer tasks: they turn a masked batch into summed losses and metrics.

BERT = MLM + NSP, ALBERT = MLM + SOP (the same two-way head on the pooled output, other instances),
RoBERTa = MLM only. Each returns, per term, (sum over the micro-batch, count), so the trainer can average over the
global batch exactly (see `bertkit.trainer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bertkit.modeling import IGNORE_INDEX

# objective name -> (instance kind of bertkit.data.loader, pair task or None)
OBJECTIVES = {
    "bert": ("nsp", "nsp"),
    "albert": ("sop", "sop"),
    "roberta": ("full-sentences", None),
    "roberta-doc": ("doc-sentences", None),
}


@dataclass
class MaskedLMObjective:
    """MLM (+ NSP or SOP) on a `BertForPreTraining`-like model.

    sparse_prediction: project to the vocabulary only at masked positions (same loss, far fewer FLOPs).
    """

    pair_task: str | None = "nsp"
    sparse_prediction: bool = True

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        counts = {"mlm_loss": float((batch["labels"] != IGNORE_INDEX).sum())}
        if self.pair_task is not None:
            counts[f"{self.pair_task}_loss"] = float((batch["next_sentence_label"] != IGNORE_INDEX).sum())
        return counts

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        labels = batch["labels"]
        at = labels != IGNORE_INDEX
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    predict_at=at if self.sparse_prediction else None)
        logits = out.prediction_logits if self.sparse_prediction else out.prediction_logits[at]  # (N, V)
        targets = labels[at]
        n = targets.new_tensor(targets.numel(), dtype=torch.float32)
        result = {
            "mlm_loss": (F.cross_entropy(logits.float(), targets, reduction="sum"), n),
            "mlm_accuracy": ((logits.argmax(-1) == targets).sum().float(), n),
        }
        if self.pair_task is not None:
            pair = batch["next_sentence_label"]
            keep = pair != IGNORE_INDEX
            scores = out.seq_relationship_logits[keep]
            m = pair.new_tensor(int(keep.sum()), dtype=torch.float32)
            result[f"{self.pair_task}_loss"] = (F.cross_entropy(scores.float(), pair[keep], reduction="sum"), m)
            result[f"{self.pair_task}_accuracy"] = ((scores.argmax(-1) == pair[keep]).sum().float(), m)
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
    return metrics
