"""Sentence (pair) classification and regression on the user's tables: reading, features, loss, metrics, predictions.

`read_table` reads CSV (header row, standard double-quote quoting), TSV (header row, no quoting, as GLUE), JSONL
(one object per line), and every other table `bertkit.data.readers` reads (JSON records, Parquet, Arrow, a
`datasets.save_to_disk` directory) into `Example(text, pair, label, line)`: one sentence or sentence pair, its label
as written (a string for classification, a float for regression, None without a label column), and the 1-based
line it came from (a `Row`, the 0-based row, for JSON records and columnar files) so that later errors point back
into the file. Columns are looked up by header name (or JSON key, or column; dotted names reach into objects).
Malformed rows (a field count different from the header's, a missing text or label) raise
`bertkit.errors.DataError` with a message starting `"{path}:{line}: "`; `skip_malformed=True` drops them with one
warning instead.

`ClassificationFamily` (kind "classify") fine-tunes BertForSequenceClassification on such files, as the BERT paper
does on GLUE (section 4.1): the pooled first token -> a linear layer, cross-entropy over the training file's labels
(sorted), or mean squared error with `regression`; accuracy and macro-F1 (Pearson, Spearman, MSE) on dev. GLUE's
tasks are the same family with fixed labels and GLUE's metrics (`bertkit.tasks.glue`).
"""

from __future__ import annotations

import csv
import itertools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from bertkit.data.readers import MISSING, Table, delimited_rows, field, text_cell
from bertkit.errors import DataError
from bertkit.tasks.base import TaskFamily, cut_at, read_predictions, register, softmax, texts_and_pairs
from bertkit.tasks.metrics import accuracy, pearson, spearman


@dataclass(frozen=True)
class Example:
    """One sentence (or sentence pair) with its label, as read from a task file."""

    text: str  # sentence A
    pair: str | None  # sentence B, None for single-sentence tasks
    label: str | float | None  # class name as written in the file, a float for regression, None if unlabelled
    line: int  # 1-based line of the row in its file, for error messages



# ---------------------------------------------------------------------------------------------------------------
# Turning rows into examples.


@dataclass(frozen=True)
class Columns:
    """Where the fields of an example are; indices into a row (TSV/CSV) or keys of a record (JSONL)."""

    text: int | str
    pair: int | str | None
    label: int | str | None


def _parse_label(path, line: int, raw, labels: Sequence[str] | None, regression: bool,
                 class_names: Sequence[str] | None = None) -> str | float:
    if regression:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise DataError.at(path, line, f"label {raw!r} is not a number")
        try:
            return float(raw)
        except ValueError:
            raise DataError.at(path, line, f"label {raw!r} is not a number") from None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise DataError.at(path, line, f"label {raw!r} must be a string or an integer")
    if class_names is not None and isinstance(raw, int):
        # A `datasets` ClassLabel column: the integer names a class (-1: no label, as datasets writes test splits).
        if not 0 <= raw < len(class_names):
            raise DataError.at(path, line, "missing label" if raw == -1 else
                               f"label {raw} is outside the column's {len(class_names)} ClassLabel names")
        raw = class_names[raw]
    label = str(raw)
    if label == "":
        raise DataError.at(path, line, "missing label")
    if labels is not None and label not in labels:
        raise DataError.at(path, line, f"unknown label {label!r}; expected one of {list(labels)}")
    return label


def _text_field(path, line: int, record, key, what: str, allow_empty: bool = True) -> str:
    if isinstance(record, dict):
        return text_cell(path, line, record, key, what, allow_empty)
    value = record[key]
    if not allow_empty and not value.strip():  # a missing sentence: the model would see only special tokens
        raise DataError.at(path, line, f"empty {what} field {key!r}")
    return value


def rows_to_examples(path, rows: Iterator[tuple[int, object]], columns: Columns, width: int | None,
                     labels: Sequence[str] | None, regression: bool, skip_malformed: bool,
                     allow_empty: bool = True, class_names: Sequence[str] | None = None) -> list[Example]:
    """Convert rows to examples; `width` is the required field count of a delimited row (None for records).
    allow_empty=False: an empty (or blank) text or pair is a malformed row (GLUE's files have none).
    class_names: the label column's ClassLabel names (a `datasets` table), which its integers stand for."""
    examples: list[Example] = []
    skipped: list[DataError] = []
    for line, row in rows:
        try:
            if width is not None and len(row) != width:
                raise DataError.at(path, line, f"expected {width} fields, found {len(row)}")
            text = _text_field(path, line, row, columns.text, "text", allow_empty)
            pair = None if columns.pair is None else _text_field(path, line, row, columns.pair, "pair", allow_empty)
            label = None
            if columns.label is not None:
                raw = field(row, columns.label) if isinstance(row, dict) else row[columns.label]
                if raw is MISSING:
                    raise DataError.at(path, line, f"no label column {columns.label!r}; the record has "
                                                   f"{sorted(row)}")
                if raw is None:
                    raise DataError.at(path, line, f"the label column {columns.label!r} is null")
                label = _parse_label(path, line, raw, labels, regression, class_names)
        except DataError as e:
            if not skip_malformed:
                raise
            skipped.append(e)
            continue
        examples.append(Example(text=text, pair=pair, label=label, line=line))
    if skipped:
        # Skipping is opt-in and never silent: say how many rows went and where the first one was.
        warnings.warn(f"skipped {len(skipped)} malformed row(s) of {os.fspath(path)}; first: {skipped[0]}",
                      stacklevel=3)
    return examples


def header_columns(path, header_line: int, header: list[str], text_column: str, pair_column: str | None,
                   label_column: str | None, label_optional: bool) -> Columns:
    """Where the named columns are in `header`; DataError at the header's line for a missing one."""
    def index(name: str | None, optional: bool = False) -> int | None:
        if name is None:
            return None
        if name in header:
            return header.index(name)
        if optional:
            return None
        raise DataError.at(path, header_line, f"no column {name!r} in header {header}")

    return Columns(text=index(text_column), pair=index(pair_column),
                   label=index(label_column, optional=label_optional))


def records(path: str | os.PathLike, format: str | None = None,
            json_records: str | None = None) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """(column names, rows as {name: value}) of any table `bertkit.data.readers` reads (format, json_records: its
    format and JSON records key); the column names of JSON records are the first record's keys. DataError for a
    TSV/CSV row of the wrong width."""
    table = Table(path, format, json_records)
    rows = table.rows()
    columns = table.columns
    if columns is not None:
        return [c.strip() for c in columns], ((line, {k.strip(): v for k, v in row.items()}) for line, row in rows)
    first = next(rows, None)
    if first is None:
        return [], iter(())
    return list(first[1]), itertools.chain([first], rows)


def read_table(path: str | os.PathLike[str], text_column: str, pair_column: str | None = None,
               label_column: str | None = None, format: str | None = None, *,
               labels: Sequence[str] | None = None, regression: bool = False,
               skip_malformed: bool = False, records: str | None = None) -> list[Example]:
    """Read a user's classification or regression file into examples.

    Args:
        path: any table `bertkit.data.readers` reads: CSV (header row, standard double-quote quoting), TSV (header
            row, no quoting, like GLUE), JSONL, JSON records, Parquet, Arrow, a `datasets.save_to_disk` directory.
        text_column, pair_column, label_column: column names (header names, JSON keys; a dotted name reaches into
            nested objects: "labels.label") of sentence A, the optional sentence B, and the optional label. With
            `label_column=None` every label is None.
        format: one of `bertkit.data.readers.TABLE_FORMATS`; by default from the path.
        labels: the allowed class names; a label outside them raises DataError. None accepts any label.
        regression: parse labels as floats instead of class names.
        skip_malformed: drop bad rows with one warning instead of raising on the first.
        records: JSON only: the key under which the records are.
    Returns:
        Examples in file order; classification labels are strings (integers become their decimal string, or their
        ClassLabel name in a `datasets` table), regression labels floats.
    Raises:
        DataError "{path}:{line}: ..." (``{path}:row N:`` for a record of a JSON list or a columnar table) for a
        missing column (naming the columns there are), a row of the wrong width, a null or non-string text, a
        missing label, an unknown label or a non-numeric regression label.
    """
    table = Table(path, format, records)
    if table.format in ("csv", "tsv"):
        delimiter, quoting = (",", csv.QUOTE_MINIMAL) if table.format == "csv" else ("\t", csv.QUOTE_NONE)
        rows = delimited_rows(path, delimiter, quoting)
        first = next(rows, None)
        if first is None:
            return []
        header_line, header = first
        columns = header_columns(path, header_line, header, text_column, pair_column, label_column,
                                 label_optional=False)
        return rows_to_examples(path, rows, columns, len(header), labels, regression, skip_malformed)
    table.require(text_column, pair_column, label_column)
    names = table.class_names(label_column) if label_column is not None else None
    rows = table.rows([c for c in (text_column, pair_column, label_column) if c is not None])
    return rows_to_examples(path, rows, Columns(text_column, pair_column, label_column), None, labels, regression,
                            skip_malformed, class_names=names)


# ---------------------------------------------------------------------------------------------------------------
# The loss and the metrics


class SequenceClassificationTask:
    """Trainer task: cross-entropy over labels (or squared error for regression) on the first token's pooled
    vector; also multiple choice, whose logits are (B, C) scores of the C choices. See `bertkit.training.trainer`.

    lm_weight > 0 (a causal model, `with_language_model`): GPT-1's fine-tuning objective L2 + lm_weight x L1,
    L1 the language-modelling loss on the task's own inputs (every real token after the first predicted from
    those before it, scored by the model's `language_model_logits`); logged as `lm_aux_loss` (already weighted,
    mean per predicted token) beside the task's loss (mean per example), which the trainer adds up.

    L1 is the pretrained LM's own loss only when it is scored with the head the LM was pretrained with
    (`lm_head`: BertForCausalLM's dense + activation + LayerNorm + bias before the tied embeddings). Scored with
    the bare embeddings instead, L1 starts above log(V) (an untrained head) and its gradient, an order of
    magnitude above the task's on every encoder layer, reshapes the encoder for that new head: with Adam the
    classifier's share of each update shrinks to nothing and a pretrained model stays at the majority class.
    The head is kept as pretraining left it (not trained, not saved); decoding uses the task model's own
    embeddings, which train as GPT-1's head does.
    """

    def __init__(self, name: str = "cls", regression: bool = False, lm_weight: float = 0.0,
                 lm_head: Any = None) -> None:
        self.name, self.regression, self.lm_weight, self.lm_head = name, regression, lm_weight, lm_head

    def with_language_model(self, weight: float, head: Any = None) -> SequenceClassificationTask:
        """This task plus GPT-1's auxiliary language-modelling loss at `weight` (0: the task alone), scored with
        `head` (the pretrained LM head, see the class docstring; None: the bare tied embeddings)."""
        if head is not None:
            head.requires_grad_(False)
        return type(self)(self.name, self.regression, weight, head)

    def counts(self, batch: dict[str, Any]) -> dict[str, float]:
        counts = {f"{self.name}_loss": float(batch["labels"].shape[0])}
        if self.lm_weight:  # the predicted tokens: every real one but each row's first
            mask = batch["attention_mask"].ne(0)
            counts["lm_aux_loss"] = float((mask[:, 1:] & mask[:, :-1]).sum())
        return counts

    def __call__(self, model, batch):
        import torch.nn.functional as F  # torch only when a model trains: reading needs none

        from bertkit.models.layouts import host_count  # torch-free module: only the loss needs torch

        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        logits = out.logits.float()
        labels = batch["labels"]
        n = host_count(labels.shape[0], logits.device)
        if self.regression:
            terms = {f"{self.name}_loss": (F.mse_loss(logits.squeeze(-1), labels.float(), reduction="sum"), n)}
        else:
            terms = {f"{self.name}_loss": (F.cross_entropy(logits, labels, reduction="sum"), n),
                     f"{self.name}_accuracy": ((logits.argmax(-1) == labels).sum().float(), n)}
        if self.lm_weight:
            terms["lm_aux_loss"] = self.language_model_loss(model, out.hidden_states[-1], batch)
        return terms

    def language_model_loss(self, model, hidden, batch):
        """(lm_weight x summed next-token cross-entropy, number of predicted tokens) over the real positions."""
        import torch.nn.functional as F

        from bertkit.checkpoint import unwrap  # torch-free module: only the loss needs torch
        from bertkit.models.layouts import host_count, mark_host, positions  # (as above)

        ids, mask = batch["input_ids"], batch["attention_mask"]
        # (B, T-1): position t predicts the real token t + 1; its positions from the host copy of the mask
        at = positions(mark_host(mask[:, 1:].ne(0) & mask[:, :-1].ne(0), mask,
                                 lambda m: m[:, 1:].ne(0) & m[:, :-1].ne(0)))
        head = self.lm_head
        if head is not None and head.bias.device != hidden.device:
            head.to(hidden.device)  # not part of the model, so the trainer does not move it
        scored = hidden[:, :-1].reshape(-1, hidden.shape[-1]).index_select(0, at)  # (N, H) only where scored
        lm_logits = unwrap(model).language_model_logits(scored, head)  # (N, V)
        loss = F.cross_entropy(lm_logits.float(), ids[:, 1:].reshape(-1).index_select(0, at), reduction="sum")
        return self.lm_weight * loss, host_count(at.numel(), loss.device)


def classification_metrics(predictions: Sequence, gold: Sequence, regression: bool) -> dict[str, float]:
    """accuracy and macro-F1 of class ids (or names), or pearson, spearmanr and mse of numbers."""
    if regression:
        p, y = np.asarray(predictions, dtype=np.float64), np.asarray(gold, dtype=np.float64)
        return {"pearson": pearson(p, y), "spearmanr": spearman(p, y), "mse": float(np.mean((p - y) ** 2))}
    import sklearn.metrics

    p, y = np.asarray(predictions), np.asarray(gold)
    classes = sorted(set(y.tolist()) | set(p.tolist()))
    return {"accuracy": accuracy(p, y),
            "macro_f1": float(sklearn.metrics.f1_score(y, p, labels=classes, average="macro", zero_division=0.0))}


# ---------------------------------------------------------------------------------------------------------------
# The family


@register("classify")
class ClassificationFamily(TaskFamily):
    """The user's classification or regression tables, any format `bertkit.data.readers` reads (config:
    text_column, pair_column, label_column, regression, format, records). The labels are the training file's,
    sorted; the dev file may use no others."""

    model_class_name = "BertForSequenceClassification"
    model_role = "sequence"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.regression = bool(getattr(config, "regression", False))
        self.metric_names = ("pearson", "spearmanr", "mse") if self.regression else ("accuracy", "macro_f1")
        self.main_metric = self.metric_names[0]

    @property
    def paired(self) -> bool:
        """Whether an input is a pair of texts."""
        return self.config.pair_column is not None

    # ---- reading ---------------------------------------------------------------------------------------------
    def _read_labelled(self, path, training: bool) -> list[Example]:
        c = self.config
        examples = read_table(path, c.text_column, c.pair_column, c.label_column, regression=self.regression,
                              labels=None if training else self.labels, **self.table_options())
        if training and not self.regression:
            self.labels = sorted({e.label for e in examples})
            if len(self.labels) < 2:
                raise DataError.at(path, None, f"the training file has {len(self.labels)} distinct label(s) "
                                               f"{self.labels}; classification needs at least 2")
        return examples

    def read(self, path, training: bool) -> list[Example]:
        examples = self._read_labelled(path, training)
        if examples and examples[0].label is None:
            raise DataError.at(path, None, "the file has no labels (a test file?); training and dev files need them")
        if not examples:
            raise DataError.at(path, None, "no examples")
        return examples

    def read_texts(self, path) -> list[Example]:
        """The examples of a file in the task's format with any labels ignored (an unlabelled transfer set)."""
        c = self.config
        return read_table(path, c.text_column, c.pair_column, None, **self.table_options())

    # ---- features, model, loss -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None, tokenizer) -> list[dict[str, Any]]:
        """Model inputs of texts (and pairs), framed by the tokenizer (`[CLS] A [SEP] B [SEP]`, RoBERTa's
        `<s> A </s></s> B </s>`) and cut longest-first to the sequence length."""
        encoded = tokenizer.encode_batch(list(texts), None if pairs is None else list(pairs),
                                         max_length=self.config.seq_length)
        return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids} for e in encoded]

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        pairs = [e.pair for e in examples] if examples[0].pair is not None else None
        features = self.encode([e.text for e in examples], pairs, tokenizer)
        to_id = {name: i for i, name in enumerate(self.labels or [])}
        for feature, e in zip(features, examples):
            feature["label"] = float(e.label) if self.regression else to_id[e.label]
        return features

    def model_kwargs(self) -> dict[str, Any]:
        if self.regression:
            return {"num_labels": 1, "regression": True}
        return {"num_labels": len(self.labels), "labels": list(self.labels)}

    def objective(self):
        return SequenceClassificationTask("cls", self.regression)

    # ---- evaluation ------------------------------------------------------------------------------------------
    def metrics(self, logits: np.ndarray, gold: Sequence) -> dict[str, float]:
        """Dev metrics of (N, num_labels) logits against gold label ids (or numbers)."""
        return classification_metrics(logits[:, 0] if self.regression else logits.argmax(-1), gold,
                                      self.regression)

    def evaluate(self, examples, features, logits) -> tuple[dict[str, float], Any]:
        logits = np.stack(logits)
        return self.metrics(logits, [f["label"] for f in features]), logits

    def write_predictions(self, out_dir: Path, examples, logits) -> None:
        lines = ([f"{v:.6g}" for v in logits[:, 0]] if self.regression
                 else [self.labels[i] for i in logits.argmax(-1)])
        (Path(out_dir) / "dev_predictions.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")

    def task_info(self) -> dict[str, Any]:
        return {**super().task_info(), "regression": self.regression}

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    def restore(self, info: dict[str, Any], model) -> None:
        self.labels, self.regression = list(model.labels), bool(model.regression)

    input_fields = (("text",), ("pair",))
    sample_input = {"text": "warm up"}

    def truncated(self, x, features, tokenizer) -> bool:
        if not cut_at([features[0]["input_ids"]], self.config.seq_length):  # nothing cut: no second encoding
            return False
        text, pair = (x, None) if isinstance(x, str) else x
        return len(tokenizer.encode_batch([text], None if pair is None else [pair])[0]) > self.config.seq_length

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        shown = result.get("label", result.get("score"))
        if shown is None:  # a text-to-text model wrote no label (or no number): show what it wrote
            shown = f"(unrecognised: {result.get('text')!r})"
        return f"{shown}" + (f" ({result['probability']:.3f})" if "probability" in result else "")

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: texts, or (text, pair) tuples (all of one kind)."""
        texts, pairs = texts_and_pairs(inputs)
        return self.encode(texts, pairs if pairs[0] is not None else None, tokenizer)

    def predictions(self, inputs, features, logits, top_k: int | None = None) -> list[dict[str, Any]]:
        """{"label", "probability", "probabilities": {label: p}} per input (top_k labels), or {"score"}."""
        logits = np.stack(logits)
        if self.regression:
            return [{"score": float(x[0])} for x in logits]
        out = []
        for p in softmax(logits):
            order = np.argsort(-p, kind="stable")[:top_k]
            out.append({"label": self.labels[order[0]], "probability": float(p[order[0]]),
                        "probabilities": {self.labels[i]: float(p[i]) for i in order}})
        return out

    def gold_labels(self, data_path) -> list:
        """The labels of a data file, for scoring a predictions file against it."""
        c = self.config
        return [e.label for e in read_table(data_path, c.text_column, c.pair_column, c.label_column,
                                            regression=self.regression, **self.table_options())]

    def score(self, rows: list[tuple[int, str]], predicted: list, gold: list, predictions_path) -> dict[str, float]:
        """Metrics of the predictions (labels as written, or numbers) against the gold labels."""
        return classification_metrics(predicted, gold, self.regression)

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """Metrics of a file of one prediction per line (or a GLUE submission TSV) against a labelled file."""
        gold = self.gold_labels(data_path)
        if gold and gold[0] is None:
            raise DataError.at(data_path, None, "the data file has no labels")
        rows, predicted = read_predictions(predictions_path, gold, data_path, numbers=self.regression)
        return self.score(rows, predicted, gold, predictions_path)
