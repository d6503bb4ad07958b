"""Reranking: a cross-encoder scores (query, document) pairs; ranking metrics shared with the embedding family.

Files are CSV/TSV/JSONL tables with a query, a document and a relevance label per row: binary (0/1) or graded
(0, 1, 2, 3, ... or any non-negative number). Columns: `query`, `document`, `label` unless --text-column,
--pair-column, --label-column say otherwise. A table of `anchor`, `positive`, `negative_1` ... (`bertkit mine`'s
output) without a label column gives each anchor its positive (label 1) and its negatives (label 0).

`RerankFamily` (kind "rerank") fine-tunes BertForSequenceClassification with one output, as sentence-transformers'
CrossEncoder does: `[CLS] query [SEP] document [SEP]` -> one logit, binary cross-entropy against the label scaled
to [0, 1] (divided by the training file's largest label). Dev: the rows are grouped by query and ranked by the
logit: MRR@10 (the first relevant document's reciprocal rank, relevant = label > 0) and nDCG@10 (gain = the
label, as given, log2 discount; ideal = the query's own labels sorted), averaged over the queries with a relevant
document. A prediction is {"score": sigmoid(logit), "logit"}; `bertkit serve` answers /rerank with the same
scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import DataError
from bertkit.tasks.base import read_predictions, register
from bertkit.tasks.classify import ClassificationFamily, Example, read_table, records


def mrr_at_k(ranked_gains: Sequence[Sequence[float]], k: int = 10) -> float:
    """Mean over queries of 1 / rank of the first relevant (gain > 0) document within the top k (0 if none);
    `ranked_gains[q]`: query q's documents' gains in the order the model ranks them."""
    if not ranked_gains:
        return 0.0
    total = 0.0
    for gains in ranked_gains:
        for rank, gain in enumerate(list(gains)[:k], start=1):
            if gain > 0:
                total += 1.0 / rank
                break
    return total / len(ranked_gains)


def ndcg_at_k(ranked_gains: Sequence[Sequence[float]], k: int = 10) -> float:
    """Mean over queries of DCG@k / ideal DCG@k, DCG = sum gain_i / log2(i + 1) (i = 1-based rank); the ideal
    ranks the query's own gains in decreasing order; a query without a relevant document counts 0."""
    if not ranked_gains:
        return 0.0
    total = 0.0
    for gains in ranked_gains:
        gains = [float(g) for g in gains]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(gains, reverse=True)[:k]))
        total += dcg / ideal if ideal > 0 else 0.0
    return total / len(ranked_gains)


def ntuple_examples(path, format: str | None = None, json_records: str | None = None) -> list[Example]:
    """A table of anchor, positive, negative_1 ... negative_k (`bertkit mine`'s output, sentence-transformers'
    n-tuples) as (query, document, label) examples: the positive labelled 1, each negative 0, in row order (format,
    json_records: as `records`)."""
    header, rows = records(path, format, json_records)
    negatives = [name for name in header if name.startswith("negative_")]
    out = []
    for line, row in rows:
        for column, label in [("positive", 1.0)] + [(name, 0.0) for name in negatives]:
            if not isinstance(row.get("anchor"), str) or not isinstance(row.get(column), str):
                raise DataError.at(path, line, f"fields 'anchor' and {column!r} must be strings")
            out.append(Example(row["anchor"], row[column], label, line))
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class RerankLoss:
    """Trainer task: binary cross-entropy of the pair's logit against its label scaled to [0, 1]."""

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"rerank_loss": float(batch["labels"].shape[0])}

    def __call__(self, model, batch):
        import torch.nn.functional as F

        from bertkit.models.layouts import host_count  # torch-free module: only the loss needs torch

        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.float()
        labels = batch["labels"].float()
        loss = F.binary_cross_entropy_with_logits(logits[:, 0], labels, reduction="sum")
        return {"rerank_loss": (loss, host_count(labels.shape[0], loss.device))}


@register("rerank")
class RerankFamily(ClassificationFamily):
    """Cross-encoder reranking on (query, document, label) tables; see the module docstring."""

    metric_names = ("ndcg_at_10", "mrr_at_10")
    main_metric = "ndcg_at_10"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.regression = True  # one output
        self.metric_names, self.main_metric = RerankFamily.metric_names, RerankFamily.main_metric
        self.label_scale = 1.0

    @property
    def columns(self) -> tuple[str, str, str]:
        c = self.config
        return (c.text_column if c.text_column != "text" else "query", c.pair_column or "document",
                c.label_column)

    @property
    def paired(self) -> bool:
        return True

    def _read_labelled(self, path, training: bool) -> list[Example]:
        query, document, label = self.columns
        options = self.table_options()
        header, _ = records(path, options["format"], options["records"])
        if label not in header and {"anchor", "positive", "negative_1"} <= set(header):
            examples = ntuple_examples(path, options["format"], options["records"])
        else:
            examples = read_table(path, query, document, label, regression=True, **options)
        for e in examples:
            if not math.isfinite(e.label) or e.label < 0:
                raise DataError.at(path, e.line, f"label {e.label!r} must be a non-negative number (relevance)")
        if training:
            top = max((e.label for e in examples), default=0.0)
            if top <= 0:
                raise DataError.at(path, None, "no row has a positive label; reranking needs relevant documents")
            self.label_scale = float(top)
        return examples

    def read_texts(self, path) -> list[Example]:
        query, document, _ = self.columns
        return read_table(path, query, document, None, **self.table_options())

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        features = self.encode([e.text for e in examples], [e.pair for e in examples], tokenizer)
        for feature, e in zip(features, examples):
            feature["label"] = float(e.label) / self.label_scale
        return features

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": 1, "regression": True}

    def objective(self):
        return RerankLoss()

    # ---- evaluation ------------------------------------------------------------------------------------------
    @staticmethod
    def ranked(examples: Sequence[Example], scores: np.ndarray) -> list[list[float]]:
        """Per query (in order of first appearance), its documents' labels in decreasing score order (stable)."""
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(examples):
            groups.setdefault(e.text, []).append(i)
        out = []
        for rows in groups.values():
            order = sorted(rows, key=lambda i: -float(scores[i]))
            out.append([float(examples[i].label) for i in order])
        return out

    def evaluate(self, examples, features, logits) -> tuple[dict[str, float], Any]:
        scores = np.stack(logits)[:, 0]
        ranked = [g for g in self.ranked(examples, scores) if any(x > 0 for x in g)]
        return {"ndcg_at_10": ndcg_at_k(ranked), "mrr_at_10": mrr_at_k(ranked)}, scores

    def write_predictions(self, out_dir: Path, examples, scores) -> None:
        lines = "".join(f"{v:.6g}\n" for v in sigmoid(np.asarray(scores, dtype=np.float64)))
        (Path(out_dir) / "dev_predictions.txt").write_text(lines, encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        return {**super().task_info(), "label_scale": self.label_scale}

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        if getattr(model, "num_labels", 1) != 1:
            raise ValueError(f"a reranker has one output; this model has {model.num_labels} labels "
                             f"({', '.join(model.labels)}): predict it as classify")
        self.labels, self.label_scale = None, float(info.get("label_scale", 1.0))

    input_fields = (("text", "pair"), ())  # (query, document)
    input_notes = {"text": "the query", "pair": "the document"}
    sample_input = {"text": "warm up", "pair": "warm up"}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return f"{result['score']:.6f}"

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: (query, document) pairs."""
        for x in inputs:
            if isinstance(x, str) or len(x) != 2:
                raise ValueError("a rerank input is a (query, document) pair")
        return self.encode([x[0] for x in inputs], [x[1] for x in inputs], tokenizer)

    def predictions(self, inputs, features, logits, top_k: int | None = None) -> list[dict[str, Any]]:
        """{"score": sigmoid(logit), "logit"} per pair."""
        return [{"score": float(sigmoid(float(x[0]))), "logit": float(x[0])} for x in logits]

    def gold_labels(self, data_path) -> list:
        query, document, label = self.columns
        return [e.label for e in read_table(data_path, query, document, label, regression=True,
                                            **self.table_options())]

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """nDCG@10 and MRR@10 of a file of one score per line (the data file's rows, in order)."""
        query, document, label = self.columns
        examples = read_table(data_path, query, document, label, regression=True,
                                            **self.table_options())
        _, scores = read_predictions(predictions_path, examples, data_path, numbers=True)
        ranked = [g for g in self.ranked(examples, np.asarray(scores)) if any(x > 0 for x in g)]
        return {"ndcg_at_10": ndcg_at_k(ranked), "mrr_at_10": mrr_at_k(ranked)}
