"""SWAG (Situations With Adversarial Generations): reader and accuracy for four-way multiple choice.

As in the BERT paper (section 4.4): each of the four candidate inputs is the pair (sentence A = the given
sentence `sent1`, sentence B = `sent2` + " " + ending_k); a single score per pair is soft-maxed over the four
choices. The files are CSV with a header
`video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(the test file has no `label` column), with standard double-quote quoting.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bertkit.errors import DataError

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


def read_swag(path: str | os.PathLike[str]) -> list[MultipleChoiceExample]:
    """Read a SWAG CSV file (train, val or test).

    Raises:
        DataError "{path}:{line}: ..." for a missing column, a row of the wrong width, or a label that is not
        an integer in [0, 3].
    """
    examples: list[MultipleChoiceExample] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
        except csv.Error as e:
            raise DataError.at(path, reader.line_num, f"unreadable row: {e}") from e
        if header is None:
            return []
        missing = [name for name in _REQUIRED if name not in header]
        if missing:
            raise DataError.at(path, 1, f"missing column(s) {missing} in header {header}")
        col = {name: header.index(name) for name in header}
        previous_end = reader.line_num
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise DataError.at(path, reader.line_num, f"unreadable row: {e}") from e
            # A quoted field may span lines: the row starts just after the previous one ended.
            line, previous_end = previous_end + 1, reader.line_num
            if not row:
                continue
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
