"""Readers for the nine GLUE tasks and for user classification/regression tables (CSV, TSV, JSONL).

Every reader returns a list of `Example(text, pair, label, line)`: one sentence or sentence pair, its label as
written in the file (a string for classification, a float for regression, None in test files), and the 1-based
line it came from so that later errors can point back into the file.

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

Malformed rows (a field count different from the header's, a missing text or label) and labels outside the
task's label set raise `bertkit.errors.DataError` with a message starting `"{path}:{line}: "`. The original QQP
release has a handful of truncated rows; pass `skip_malformed=True` to drop such rows with a warning that names
how many were dropped and where the first one was.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from bertkit.errors import DataError
from bertkit.tasks.metrics import GLUE_METRICS, canonical_task


@dataclass(frozen=True)
class Example:
    """One sentence (or sentence pair) with its label, as read from a task file."""

    text: str  # sentence A
    pair: str | None  # sentence B, None for single-sentence tasks
    label: str | float | None  # class name as written in the file, a float for regression, None if unlabelled
    line: int  # 1-based line of the row in its file, for error messages


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


# ---------------------------------------------------------------------------------------------------------------
# Row sources: each yields (line, fields) with `line` the 1-based line where the record starts.


def _delimited_rows(path: str | os.PathLike[str], delimiter: str, quoting: int) -> Iterator[tuple[int, list[str]]]:
    # newline="" hands line endings to the csv module (required for quoted newlines in CSV, harmless in TSV);
    # utf-8-sig strips a byte-order mark that would otherwise stick to the first column name.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        previous_end = 0
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise DataError.at(path, reader.line_num, f"unreadable row: {e}") from e
            start, previous_end = previous_end + 1, reader.line_num
            if fields:  # csv gives [] for a blank line
                yield start, fields


def _jsonl_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError.at(path, line_no, f"invalid JSON: {e.msg}") from e
            if not isinstance(record, dict):
                raise DataError.at(path, line_no, f"expected a JSON object, got {type(record).__name__}")
            yield line_no, record


# ---------------------------------------------------------------------------------------------------------------
# Turning rows into examples.


@dataclass(frozen=True)
class _Columns:
    """Where the fields of an example are; indices into a row (TSV/CSV) or keys of a record (JSONL)."""

    text: int | str
    pair: int | str | None
    label: int | str | None


def _parse_label(path, line: int, raw, labels: Sequence[str] | None, regression: bool) -> str | float:
    if regression:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise DataError.at(path, line, f"label {raw!r} is not a number")
        try:
            return float(raw)
        except ValueError:
            raise DataError.at(path, line, f"label {raw!r} is not a number") from None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise DataError.at(path, line, f"label {raw!r} must be a string or an integer")
    label = str(raw)
    if label == "":
        raise DataError.at(path, line, "missing label")
    if labels is not None and label not in labels:
        raise DataError.at(path, line, f"unknown label {label!r}; expected one of {list(labels)}")
    return label


def _text_field(path, line: int, record, key, what: str) -> str:
    value = record.get(key) if isinstance(record, dict) else record[key]
    if value is None:
        raise DataError.at(path, line, f"missing {what} field {key!r}")
    if not isinstance(value, str):
        raise DataError.at(path, line, f"{what} field {key!r} must be a string, got {type(value).__name__}")
    return value


def _to_examples(path, rows: Iterator[tuple[int, object]], columns: _Columns, width: int | None,
                 labels: Sequence[str] | None, regression: bool, skip_malformed: bool) -> list[Example]:
    """Convert rows to examples; `width` is the required field count of a delimited row (None for JSONL)."""
    examples: list[Example] = []
    skipped: list[DataError] = []
    for line, row in rows:
        try:
            if width is not None and len(row) != width:
                raise DataError.at(path, line, f"expected {width} fields, found {len(row)}")
            text = _text_field(path, line, row, columns.text, "text")
            pair = None if columns.pair is None else _text_field(path, line, row, columns.pair, "pair")
            label = None
            if columns.label is not None:
                raw = row.get(columns.label) if isinstance(row, dict) else row[columns.label]
                if raw is None:
                    raise DataError.at(path, line, f"missing label field {columns.label!r}")
                label = _parse_label(path, line, raw, labels, regression)
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


def _header_columns(path, header_line: int, header: list[str], text_column: str, pair_column: str | None,
                    label_column: str | None, label_optional: bool) -> _Columns:
    def index(name: str | None, optional: bool = False) -> int | None:
        if name is None:
            return None
        if name in header:
            return header.index(name)
        if optional:
            return None
        raise DataError.at(path, header_line, f"no column {name!r} in header {header}")

    return _Columns(text=index(text_column), pair=index(pair_column),
                    label=index(label_column, optional=label_optional))


def _guess_format(path: str | os.PathLike[str]) -> str:
    suffix = Path(path).suffix.lower()
    formats = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
    if suffix not in formats:
        raise ValueError(f"cannot tell the format of {os.fspath(path)!r} from its suffix; pass format=")
    return formats[suffix]


def read_table(path: str | os.PathLike[str], text_column: str, pair_column: str | None = None,
               label_column: str | None = None, format: str | None = None, *,
               labels: Sequence[str] | None = None, regression: bool = False,
               skip_malformed: bool = False) -> list[Example]:
    """Read a user's classification or regression file into examples.

    Args:
        path: a CSV (header row, standard double-quote quoting), TSV (header row, no quoting, like GLUE) or
            JSONL (one JSON object per line) file.
        text_column, pair_column, label_column: header names (CSV/TSV) or keys (JSONL) of sentence A, the
            optional sentence B, and the optional label. With `label_column=None` every label is None.
        format: "csv", "tsv" or "jsonl"; by default from the suffix (.csv; .tsv/.txt; .jsonl/.json/.ndjson).
        labels: the allowed class names; a label outside them raises DataError. None accepts any label.
        regression: parse labels as floats instead of class names.
        skip_malformed: drop bad rows with one warning instead of raising on the first.
    Returns:
        Examples in file order; classification labels are strings (JSON integers become their decimal string),
        regression labels floats.
    Raises:
        DataError "{path}:{line}: ..." for a missing column, a row of the wrong width, a missing or non-string
        text, a missing label, an unknown label or a non-numeric regression label.
    """
    format = format or _guess_format(path)
    if format == "jsonl":
        columns = _Columns(text=text_column, pair=pair_column, label=label_column)
        return _to_examples(path, _jsonl_rows(path), columns, None, labels, regression, skip_malformed)
    if format not in ("csv", "tsv"):
        raise ValueError(f"unknown format {format!r}; expected 'csv', 'tsv' or 'jsonl'")
    delimiter, quoting = (",", csv.QUOTE_MINIMAL) if format == "csv" else ("\t", csv.QUOTE_NONE)
    rows = _delimited_rows(path, delimiter, quoting)
    first = next(rows, None)
    if first is None:
        return []
    header_line, header = first
    columns = _header_columns(path, header_line, header, text_column, pair_column, label_column,
                              label_optional=False)
    return _to_examples(path, rows, columns, len(header), labels, regression, skip_malformed)


def read_glue(task: str, path: str | os.PathLike[str], *, skip_malformed: bool = False) -> list[Example]:
    """Read any split of a GLUE task (train, dev, or an unlabelled test file) into examples.

    Args:
        task: GLUE task name in any common spelling ("CoLA", "sst2", "MNLI-mm", "STS-B", ...).
        path: the task's .tsv file as distributed by GLUE.
        skip_malformed: drop malformed rows with a warning instead of raising (for the original QQP release).
    Returns:
        Examples in file order. Labels are class-name strings checked against `TASKS[task].labels`, floats for
        STS-B, or None when the file has no label column (test files).
    Raises:
        DataError naming file:line for a wrong field count, a missing field or a label outside the task's set.
    """
    spec = get_task(task)
    rows = _delimited_rows(path, "\t", csv.QUOTE_NONE)
    first = next(rows, None)
    if first is None:
        return []
    first_line, first_fields = first
    if spec.columns is not None and first_fields != _TEST_HEADER:
        # Headerless train/dev file (CoLA): the first row is data, the column names come from the spec.
        header = list(spec.columns)

        def all_rows() -> Iterator[tuple[int, list[str]]]:
            yield first
            yield from rows

        data, header_line = all_rows(), 0
    else:
        header, data, header_line = first_fields, rows, first_line
    columns = _header_columns(path, header_line, header, spec.text_column, spec.pair_column, spec.label_column,
                              label_optional=True)
    return _to_examples(path, data, columns, len(header), spec.labels, spec.is_regression, skip_malformed)
