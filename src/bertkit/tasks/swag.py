"""SWAG (Situations With Adversarial Generations): reader, accuracy, and `SwagFamily`, the fine-tuning kind "swag".

As in the BERT paper (section 4.4): each of the four candidate inputs is the pair (sentence A = the given
sentence `sent1`, sentence B = `sent2` + " " + ending_k); a single score per pair is soft-maxed over the four
choices. The files are CSV with a header
`video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(the test file has no `label` column), with standard double-quote quoting. Each pair is framed by the tokenizer
as any pair (`[CLS] A [SEP] B [SEP]`, RoBERTa's `<s> A </s></s> B </s>`) and cut longest-first.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertkit.data.readers import MISSING, Table, delimited_rows, field, table_format, text_cell
from bertkit.errors import DataError
from bertkit.tasks.base import TaskFamily, cut_at, json_text, read_predictions, register, softmax
from bertkit.tasks.classify import SequenceClassificationTask

NUM_CHOICES = 4
_REQUIRED = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3")


@dataclass(frozen=True)
class MultipleChoiceExample:
    """One SWAG question: a context sentence and four continuations, one of them right."""

    id: str  # "fold-ind" of the row (unique per split); the row's line if the column is absent
    context: str  # sentence A, shared by all choices (sent1)
    choices: list[str]  # NUM_CHOICES sentence Bs: sent2 + " " + ending_k
    label: int | None  # index of the right choice in [0, 3]; None in the unlabelled test file
    line: int  # 1-based line where the row starts


def read_swag_table(path: str | os.PathLike[str], format: str | None = None,
                    records: str | None = None) -> list[MultipleChoiceExample]:
    """SWAG's columns (sent1, sent2, ending0-3, optional label and fold-ind) from any table `bertkit.data.readers`
    reads: the Hub's swag in Parquet, a `datasets` directory, JSON records. A label of -1 (datasets' unlabelled test
    split) is no label. DataError naming the file, the row and the column for a missing column (with those the
    file has), a null or non-string text, or a label that is not an integer in [0, 3]."""
    table = Table(path, format, records)
    table.require(*_REQUIRED)
    examples = []
    for where, record in table.rows():
        sent1, sent2, *endings = (text_cell(path, where, record, name, name) for name in _REQUIRED)
        label = field(record, "label")
        if label is MISSING or label is None or label == -1:
            label = None
        elif isinstance(label, bool) or not isinstance(label, (int, str)) or str(label) not in ("0", "1", "2", "3"):
            raise DataError.at(path, where, f"label {label!r} is not one of 0, 1, 2, 3")
        else:
            label = int(label)
        ident = field(record, "fold-ind")
        examples.append(MultipleChoiceExample(id=str(where if ident is MISSING or ident is None else ident),
                                              context=sent1, choices=[f"{sent2} {e}" for e in endings],
                                              label=label, line=where))
    return examples


def read_swag(path: str | os.PathLike[str], format: str | None = None,
              records: str | None = None) -> list[MultipleChoiceExample]:
    """Read a SWAG CSV file (train, val or test), or SWAG's columns from another table (`read_swag_table`: any
    path that is not .csv, or a `format` other than "csv" / "swag").

    Raises:
        DataError "{path}:{line}: ..." for a missing column, a row of the wrong width, or a label that is not
        an integer in [0, 3].
    """
    fmt = format if format not in (None, "swag") else ("csv" if format == "swag" else _format_or_csv(path))
    if fmt != "csv":
        return read_swag_table(path, fmt, records)
    examples: list[MultipleChoiceExample] = []
    rows = delimited_rows(path, ",", csv.QUOTE_MINIMAL)  # (line where the row starts, fields); blank rows skipped
    first = next(rows, None)
    if first is None:
        return []
    header = first[1]
    missing = [name for name in _REQUIRED if name not in header]
    if missing:
        raise DataError.at(path, 1, f"missing column(s) {missing} in header {header}")
    col = {name: header.index(name) for name in header}
    for line, row in rows:
        if len(row) != len(header):
            raise DataError.at(path, line, f"expected {len(header)} fields, found {len(row)}")
        label = None
        if "label" in col:
            raw = row[col["label"]]
            if raw not in ("0", "1", "2", "3"):
                raise DataError.at(path, line, f"label {raw!r} is not one of 0, 1, 2, 3")
            label = int(raw)
        sent2 = row[col["sent2"]]
        examples.append(MultipleChoiceExample(
            id=row[col["fold-ind"]] if "fold-ind" in col else str(line),
            context=row[col["sent1"]],
            choices=[f"{sent2} {row[col[f'ending{k}']]}" for k in range(NUM_CHOICES)],
            label=label,
            line=line,
        ))
    return examples


def _format_or_csv(path) -> str:
    try:
        return table_format(path)
    except ValueError:
        return "csv"  # SWAG's own files are CSV


def multiple_choice_accuracy(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Fraction of questions whose chosen answer is right.

    Args:
        predictions: chosen indices, shape (N,), or per-choice scores/logits, shape (N, C), which are arg-maxed
            (ties go to the lowest index).
        labels: right indices, shape (N,).
    """
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.ndim == 2:
        p = p.argmax(axis=-1)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"predictions of shape {np.asarray(predictions).shape} do not match labels {y.shape}")
    if len(y) == 0:
        raise ValueError("cannot compute accuracy on zero examples")
    return float(np.mean(p == y))


def choice_features(tokenizer, context: str, choices: Sequence[str], max_length: int,
                    label: int | None = None) -> dict[str, Any]:
    """One multiple-choice input: (context, choice_k) pairs framed by the tokenizer, longest-first truncated to
    max_length each; "input_ids" and "token_type_ids" are C lists, one per choice."""
    encoded = tokenizer.encode_batch([context] * len(choices), list(choices), max_length=max_length)
    return {"input_ids": [e.input_ids for e in encoded], "token_type_ids": [e.token_type_ids for e in encoded],
            "label": label}


@register("swag")
class SwagFamily(TaskFamily):
    """SWAG four-way multiple choice: one first-token score per (context, ending) pair, softmax over the four."""

    model_class_name = "BertForMultipleChoice"
    model_role = "choice"
    metric_names = ("accuracy",)
    main_metric = "accuracy"

    def read(self, path, training: bool) -> list[MultipleChoiceExample]:
        examples = read_swag(path, **self.table_options())
        if not examples:
            raise DataError.at(path, None, "no examples")
        if examples[0].label is None:
            raise DataError.at(path, None, "the file has no label column (the test file?)")
        return examples

    def features(self, examples, tokenizer, training: bool) -> list[dict[str, Any]]:
        return [choice_features(tokenizer, e.context, e.choices, self.config.seq_length, e.label) for e in examples]

    def objective(self):
        return SequenceClassificationTask("swag")  # cross-entropy over the (B, C) choice scores

    def evaluate(self, examples, features, logits):
        logits = np.stack(logits)
        return {"accuracy": multiple_choice_accuracy(logits, [e.label for e in examples])}, logits

    def write_predictions(self, out_dir: Path, examples, logits) -> None:
        (Path(out_dir) / "dev_predictions.txt").write_text("".join(f"{i}\n" for i in logits.argmax(-1)),
                                                          encoding="utf-8")

    # ---- a fine-tuned model ----------------------------------------------------------------------------------
    input_fields = (("context", "choices"), ())  # choices: a list of strings
    sample_input = {"context": "warm", "choices": ["up", "down"]}

    @classmethod
    def input_from_json(cls, item: dict[str, Any]) -> tuple[str, list[str]]:
        context, choices = json_text(item, "context"), item.get("choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("field 'choices' must be a non-empty list of strings")
        return context, list(choices)

    def truncated(self, x, features, tokenizer) -> bool:
        if not cut_at(features[0]["input_ids"], self.config.seq_length):  # one row per choice
            return False
        context, choices = x
        return any(len(e) > self.config.seq_length for e in tokenizer.encode_batch([context] * len(choices), choices))

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return f"{result['choice']}: {result['text']} ({max(result['probabilities']):.3f})"

    def prediction_features(self, inputs: Sequence, tokenizer) -> list[dict[str, Any]]:
        """inputs: (context, [choices]) tuples; any number of choices each."""
        return [choice_features(tokenizer, context, choices, self.config.seq_length) for context, choices in inputs]

    def predictions(self, inputs, features, logits, top_k: int | None = None) -> list[dict[str, Any]]:
        """{"choice", "text", "probabilities"} per input."""
        out = []
        for (_, choices), scores in zip(inputs, logits):
            p = softmax(scores)
            out.append({"choice": int(p.argmax()), "text": choices[int(p.argmax())],
                        "probabilities": [float(x) for x in p]})
        return out

    def evaluate_file(self, data_path, predictions_path, null_odds_path=None) -> dict[str, Any]:
        """Accuracy of one chosen ending index (0-3) per line."""
        gold = [e.label for e in read_swag(data_path, **self.table_options())]
        rows, _ = read_predictions(predictions_path, gold, data_path)
        predicted = []
        for number, value in rows:
            if value not in ("0", "1", "2", "3"):
                raise DataError.at(predictions_path, number, f"prediction {value!r} is not one of 0, 1, 2, 3")
            predicted.append(int(value))
        return {"accuracy": multiple_choice_accuracy(predicted, gold)}
