"""The nine GLUE tasks: their files, labels and metrics, and `GlueFamily`, the fine-tuning kind "glue".

`read_glue` returns a list of `bertkit.tasks.classify.Example(text, pair, label, line)`: one sentence or sentence
pair, its label as written in the file (a string for classification, a float for STS-B, None in test files), and
the 1-based line it came from so that later errors can point back into the file. `GlueFamily` is the
classification family (`bertkit.tasks.classify`) with the task's fixed labels (in Google's `run_classifier.py`
order, so label ids match checkpoints fine-tuned there) and GLUE's metrics; the first listed picks the best epoch.

File formats, as distributed by the GLUE download script (and read by Google's BERT `run_classifier.py`):

    task   header?  text column   pair column   label column   labels
    CoLA   no       4th field     -             2nd field      0 1      (source, label, original mark, sentence)
    SST-2  yes      sentence      -             label          0 1
    MRPC   yes      #1 String     #2 String     Quality        0 1
    STS-B  yes      sentence1     sentence2     score          float in [0, 5]
    QQP    yes      question1     question2     is_duplicate   0 1
    MNLI   yes      sentence1     sentence2     gold_label     contradiction entailment neutral
    QNLI   yes      question      sentence      label          entailment not_entailment
    RTE    yes      sentence1     sentence2     label          entailment not_entailment
    WNLI   yes      sentence1     sentence2     label          0 1

Columns are looked up by header name, not position, because the same task's files differ in layout (MNLI's
dev files carry five annotator labels that train lacks; test files have an `index` column and no label). A test
file is recognised by its label column being absent from the header; its examples get `label=None`. CoLA's test
file is the one CoLA file with a header (`index sentence`).

Files are read with `csv.QUOTE_NONE`: GLUE text contains unbalanced quotes (`"` as inch marks, quoted titles
split across fields) and the files never quote fields, so a quoting-aware parser would swallow tabs and
newlines. A UTF-8 byte-order mark (MRPC's header carries one) is dropped. Wholly blank lines are skipped.

Malformed rows (a field count different from the header's, a missing or empty text or label) and labels outside the
task's label set raise `bertkit.errors.DataError` with a message starting `"{path}:{line}: "`. The original QQP
release has a handful of truncated rows; pass `skip_malformed=True` to drop such rows with a warning that names
how many were dropped and where the first one was. (`read_table`, the reader of the user's own tables, lives in
`bertkit.tasks.classify` and is importable from here too.)
"""

from __future__ import annotations

import csv
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.data.readers import Table, table_format
from bertkit.tasks.base import TaskFamily, register
from bertkit.tasks.classify import (ClassificationFamily, Columns, Example, delimited_rows, header_columns, read_table,
                                    rows_to_examples)
from bertkit.tasks.metrics import GLUE_METRICS, canonical_task, glue_metrics

__all__ = ["TASKS", "Example", "GlueFamily", "GlueTask", "get_task", "glue_path", "read_glue", "read_table"]


@dataclass(frozen=True)
class GlueTask:
    """How to read one GLUE task and how to score it: the row of `TASKS` for that task."""

    name: str  # canonical key, e.g. "sst2" (see `bertkit.tasks.metrics.canonical_task`)
    dirname: str  # folder of the task in the GLUE download, e.g. "SST-2"
    text_column: str  # header name of sentence A
    pair_column: str | None  # header name of sentence B, None for single-sentence tasks
    label_column: str  # header name of the label
    labels: tuple[str, ...] | None  # class names in label-id order; None for regression (STS-B)
    metrics: tuple[str, ...]  # keys `glue_metrics` returns for this task
    num_labels: int  # width of the classifier output: len(labels), or 1 for regression
    splits: dict[str, str] = field(default_factory=dict)  # split name → file name inside `dirname`
    columns: tuple[str, ...] | None = None  # names of the fields when the files have no header (CoLA)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def label_to_id(self) -> dict[str, int]:
        """Class name → integer id in `labels` order (empty for regression)."""
        return {label: i for i, label in enumerate(self.labels or ())}


_STANDARD_SPLITS = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_BINARY = ("0", "1")


def _task(name: str, dirname: str, text: str, pair: str | None, label: str, labels: tuple[str, ...] | None,
          splits: dict[str, str] = _STANDARD_SPLITS, columns: tuple[str, ...] | None = None) -> GlueTask:
    return GlueTask(name=name, dirname=dirname, text_column=text, pair_column=pair, label_column=label,
                    labels=labels, metrics=GLUE_METRICS[name], num_labels=1 if labels is None else len(labels),
                    splits=dict(splits), columns=columns)


# Label orders follow Google's run_classifier.py processors (so label ids match checkpoints fine-tuned there).
TASKS: dict[str, GlueTask] = {
    "cola": _task("cola", "CoLA", "sentence", None, "label", _BINARY,
                  columns=("source", "label", "original_mark", "sentence")),
    "sst2": _task("sst2", "SST-2", "sentence", None, "label", _BINARY),
    "mrpc": _task("mrpc", "MRPC", "#1 String", "#2 String", "Quality", _BINARY),
    "stsb": _task("stsb", "STS-B", "sentence1", "sentence2", "score", None),
    "qqp": _task("qqp", "QQP", "question1", "question2", "is_duplicate", _BINARY),
    "mnli": _task("mnli", "MNLI", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
                  splits={"train": "train.tsv", "dev_matched": "dev_matched.tsv",
                          "dev_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
                          "test_mismatched": "test_mismatched.tsv"}),
    "qnli": _task("qnli", "QNLI", "question", "sentence", "label", ("entailment", "not_entailment")),
    "rte": _task("rte", "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
    "wnli": _task("wnli", "WNLI", "sentence1", "sentence2", "label", _BINARY),
}

# The header of GLUE's unlabelled test files for headerless tasks (CoLA's test.tsv).
_TEST_HEADER = ["index", "sentence"]


def get_task(name: str) -> GlueTask:
    """The `TASKS` row for a GLUE task named in any spelling `canonical_task` accepts ("SST-2", "MNLI-mm")."""
    return TASKS[canonical_task(name)]


def glue_path(data_dir: str | os.PathLike[str], task: str, split: str) -> Path:
    """Path of `split` ("train", "dev", "test"; MNLI: "dev_matched", ...) of `task` under a GLUE download."""
    spec = get_task(task)
    if split not in spec.splits:
        raise ValueError(f"task {spec.name!r} has no split {split!r}; it has {sorted(spec.splits)}")
    return Path(data_dir) / spec.dirname / spec.splits[split]


# The Hub's GLUE (nyu-mll/glue, Parquet) names the texts so; its labels are ClassLabel integers.
HUB_COLUMNS = {"cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
               "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"),
               "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"),
               "wnli": ("sentence1", "sentence2")}


def read_glue_table(task: str, path: str | os.PathLike[str], format: str | None = None, records: str | None = None,
                    *, skip_malformed: bool = False) -> list[Example]:
    """A GLUE task's split from another table (Parquet, Arrow, a `datasets` directory, JSON): the GLUE TSV's
    column names when the table has them, else the Hub's (`HUB_COLUMNS`, label "label"). An integer label is its
    ClassLabel name where that is one of the task's labels (MNLI's entailment, ...), else its decimal string (the
    binary tasks' 0 / 1, as the TSV files write them)."""
    spec = get_task(task)
    table = Table(path, format, records)
    text, pair, label = spec.text_column, spec.pair_column, spec.label_column
    columns = table.columns
    if columns is not None and text not in columns:
        (text, pair), label = HUB_COLUMNS[spec.name], "label"
    table.require(text, pair)
    if columns is not None and label not in columns:
        label = None  # an unlabelled (test) split
    names = table.class_names(label) if label is not None else None
    if names is not None:
        names = [name if name in (spec.labels or ()) else str(i) for i, name in enumerate(names)]
    rows = table.rows([c for c in (text, pair, label) if c is not None])
    return rows_to_examples(path, rows, Columns(text, pair, label), None, spec.labels, spec.is_regression,
                            skip_malformed, allow_empty=False, class_names=names)


def read_glue(task: str, path: str | os.PathLike[str], *, skip_malformed: bool = False, format: str | None = None,
              records: str | None = None) -> list[Example]:
    """Read any split of a GLUE task (train, dev, or an unlabelled test file) into examples.

    Args:
        task: GLUE task name in any common spelling ("CoLA", "sst2", "MNLI-mm", "STS-B", ...).
        path: the task's .tsv file as distributed by GLUE, or another table (`read_glue_table`).
        format, records: the table's format (default: from the path) and JSON records key.
        skip_malformed: drop malformed rows with a warning instead of raising (for the original QQP release).
    Returns:
        Examples in file order. Labels are class-name strings checked against `TASKS[task].labels`, floats for
        STS-B, or None when the file has no label column (test files).
    Raises:
        DataError naming file:line for a wrong field count, a missing field or a label outside the task's set.
    """
    try:
        fmt = table_format(path, format)
    except ValueError:
        if format is not None:
            raise
        fmt = "tsv"  # GLUE's own files are TSV, whatever their name
    if fmt != "tsv":
        return read_glue_table(task, path, format, records, skip_malformed=skip_malformed)
    spec = get_task(task)
    rows = delimited_rows(path, "\t", csv.QUOTE_NONE)
    first = next(rows, None)
    if first is None:
        return []
    first_line, first_fields = first
    if spec.columns is not None and first_fields != _TEST_HEADER:
        # Headerless train/dev file (CoLA): the first row is data, the column names come from the spec.
        header = list(spec.columns)
        data, header_line = itertools.chain([first], rows), 0
    else:
        header, data, header_line = first_fields, rows, first_line
    columns = header_columns(path, header_line, header, spec.text_column, spec.pair_column, spec.label_column,
                             label_optional=True)
    return rows_to_examples(path, data, columns, len(header), spec.labels, spec.is_regression, skip_malformed,
                            allow_empty=False)


@register("glue")
class GlueFamily(ClassificationFamily):
    """A GLUE task (config.task): the classification family with the task's labels, files and metrics.

    A GLUE model predicts as any classification model (kind "classify"), with the labels its config.json holds.
    """

    predicts_as = "classify"

    def __init__(self, config) -> None:
        TaskFamily.__init__(self, config)
        self.spec = get_task(config.task)
        self.regression = self.spec.is_regression
        self.labels = None if self.regression else list(self.spec.labels)
        self.metric_names = self.spec.metrics
        self.main_metric = self.metric_names[0]

    @property
    def paired(self) -> bool:
        return self.spec.pair_column is not None

    def _read_labelled(self, path, training: bool) -> list[Example]:
        return read_glue(self.spec.name, path, **self.table_options())

    def read_texts(self, path) -> list[Example]:
        return read_glue(self.spec.name, path, **self.table_options())

    def metrics(self, logits: np.ndarray, gold) -> dict[str, float]:
        return glue_metrics(self.spec.name, logits, np.asarray(gold))

    def gold_labels(self, data_path) -> list:
        return [e.label for e in read_glue(self.spec.name, data_path, **self.table_options())]

    def score(self, rows, predicted, gold, predictions_path) -> dict[str, Any]:
        if self.regression:
            return glue_metrics(self.spec.name, np.asarray(predicted), np.asarray(gold, dtype=np.float64))
        to_id = self.spec.label_to_id
        gold_ids = np.array([to_id[v] for v in gold])
        # A prediction that is no label of the task (a text-to-text model's generated text, say) counts as wrong, as
        # T5 scores it: the label after the gold one (the other label of a binary task, so F1 and MCC see a wrong
        # answer too); how many there were is reported.
        unknown = np.array([v not in to_id for v in predicted], dtype=bool)
        ids = np.array([to_id.get(v, 0) for v in predicted])
        metrics = glue_metrics(self.spec.name, np.where(unknown, (gold_ids + 1) % len(to_id), ids), gold_ids)
        if unknown.any():
            metrics["unrecognized"] = int(unknown.sum())
        return metrics
