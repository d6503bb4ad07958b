"""Sentence-level metrics and the exact metric set GLUE reports for each task.

Every function takes plain sequences or numpy arrays and returns a Python float in the metric's natural range
(accuracy and F1 in [0, 1], correlations in [-1, 1]); multiply by 100 for the paper's tables. The numbers come
from scikit-learn and scipy, which are well tested; what this module adds is input checking and a defined value
on degenerate inputs (a constant prediction vector has no correlation with anything: MCC, Pearson and Spearman
are 0.0 there instead of NaN plus a warning, so a collapsed model logs a number rather than breaking a sweep).

Token-level NER metrics live in `bertkit.tasks.ner`, SQuAD's in `bertkit.tasks.squad`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# scikit-learn and scipy are imported inside the functions that use them, so that the task readers (which import
# this module for the GLUE metric table) work in environments without them.

# What the GLUE leaderboard reports for each task (https://gluebenchmark.com/tasks), in its order.
# Keys are canonical task names (see `canonical_task`); MNLI-m and MNLI-mm share "mnli".
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "qqp": ("accuracy", "f1"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

# Spellings people use for the same task ("SST-2", "sst_2", "MNLI-mm", "mnli_mismatched", "STS-B", ...).
_ALIASES = {"mnlim": "mnli", "mnlimm": "mnli", "mnlimatched": "mnli", "mnlimismatched": "mnli"}


def canonical_task(name: str) -> str:
    """Map a GLUE task name in any common spelling to its canonical key in `GLUE_METRICS`.

    Case, "-" and "_" are ignored ("SST-2" → "sst2", "STS-B" → "stsb"); "MNLI-m"/"MNLI-mm" → "mnli".
    Raises ValueError for a name that is not a GLUE task.
    """
    key = name.lower().replace("-", "").replace("_", "")
    key = _ALIASES.get(key, key)
    if key not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {name!r}; expected one of {sorted(GLUE_METRICS)}")
    return key


def _pair(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D arrays of equal, non-zero length (ValueError otherwise)."""
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.ndim != 1 or y.ndim != 1:
        raise ValueError(f"expected 1-D predictions and labels, got shapes {p.shape} and {y.shape}")
    if len(p) != len(y):
        raise ValueError(f"{len(p)} predictions for {len(y)} labels")
    if len(p) == 0:
        raise ValueError("cannot compute a metric on zero examples")
    return p, y


def _constant(x: np.ndarray) -> bool:
    return bool(np.all(x == x[0]))


def accuracy(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Fraction of positions where prediction equals label; inputs 1-D, same length, any comparable dtype."""
    import sklearn.metrics

    p, y = _pair(predictions, labels)
    return float(sklearn.metrics.accuracy_score(y, p))


def f1(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Binary F1 of the positive class 1 (labels in {0, 1}); 0.0 when there are no true or predicted positives."""
    import sklearn.metrics

    p, y = _pair(predictions, labels)
    # zero_division=0.0: no positives anywhere means no positive was found, which scores 0, quietly.
    return float(sklearn.metrics.f1_score(y, p, pos_label=1, average="binary", zero_division=0.0))


def matthews_corrcoef(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Matthews correlation coefficient in [-1, 1]; 0.0 when predictions or labels are constant."""
    p, y = _pair(predictions, labels)
    if _constant(p) or _constant(y):
        return 0.0  # the denominator is 0: a constant classifier carries no information
    import sklearn.metrics

    return float(sklearn.metrics.matthews_corrcoef(y, p))


def pearson(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Pearson correlation of two real vectors; 0.0 when either is constant (scipy would give NaN)."""
    return _correlation(predictions, labels, "pearsonr")


def spearman(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> float:
    """Spearman rank correlation (ties get average ranks); 0.0 when either vector is constant."""
    return _correlation(predictions, labels, "spearmanr")


def _correlation(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray, statistic: str) -> float:
    """scipy.stats' `statistic` ("pearsonr", "spearmanr") of two real vectors; 0.0 for fewer than two values or
    a constant vector."""
    p, y = _pair(predictions, labels)
    p, y = p.astype(np.float64), y.astype(np.float64)
    if len(p) < 2 or _constant(p) or _constant(y):
        return 0.0
    import scipy.stats

    return float(getattr(scipy.stats, statistic)(p, y)[0])


def confusion_matrix(predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray,
                     num_labels: int) -> list[list[int]]:
    """Counts of (gold, predicted) class-id pairs as a num_labels x num_labels list of lists: row = gold class,
    column = predicted class (scikit-learn's layout, the textbooks' too); ids outside [0, num_labels) raise."""
    p, y = _pair(predictions, labels)
    p, y = p.astype(np.int64), y.astype(np.int64)
    if min(p.min(), y.min()) < 0 or max(p.max(), y.max()) >= num_labels:
        raise ValueError(f"class ids outside [0, {num_labels})")
    counts = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(counts, (y, p), 1)
    return counts.tolist()


_METRIC_FUNCTIONS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson,
                     "spearmanr": spearman}


def glue_metrics(task: str, predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> dict[str, float]:
    """The metrics GLUE reports for `task`, as {name: value} with values in [0, 1] / [-1, 1] (not percent).

    Args:
        task: a GLUE task name in any spelling `canonical_task` accepts.
        predictions: class ids, shape (N,), or logits, shape (N, C), which are arg-maxed; for STS-B real
            scores, shape (N,) or (N, 1).
        labels: gold class ids (N,), or gold scores for STS-B.
    Returns:
        CoLA {"mcc"}; SST-2, MNLI, QNLI, RTE, WNLI {"accuracy"}; MRPC, QQP {"accuracy", "f1"};
        STS-B {"pearson", "spearmanr"}.
    """
    key = canonical_task(task)
    p = np.asarray(predictions)
    if p.ndim == 2:
        # Regression heads emit (N, 1); classification heads emit (N, C) logits whose arg-max is the prediction.
        p = p[:, 0] if key == "stsb" else p.argmax(axis=-1)
    return {name: _METRIC_FUNCTIONS[name](p, labels) for name in GLUE_METRICS[key]}
