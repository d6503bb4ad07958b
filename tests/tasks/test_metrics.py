"""Sentence-level metrics on small vectors whose values were computed by hand."""

import math
import warnings

import numpy as np
import pytest

from bertkit.tasks.metrics import (GLUE_METRICS, accuracy, canonical_task, f1, glue_metrics, matthews_corrcoef,
                                   pearson, spearman)

# predictions vs labels: TP = 2 (positions 0, 4), FP = 1 (1), FN = 1 (3), TN = 1 (2).
PRED = [1, 1, 0, 0, 1]
GOLD = [1, 0, 0, 1, 1]


def test_accuracy():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(PRED, GOLD) == pytest.approx(3 / 5)


def test_binary_f1_of_positive_class():
    # P = 2/3, R = 2/3 → F1 = 2/3
    assert f1(PRED, GOLD) == pytest.approx(2 / 3)
    # Positive class is 1, not 0: swapping the roles changes the value (TP 1, FP 1, FN 1 → 1/2).
    assert f1([1 - p for p in PRED], [1 - y for y in GOLD]) == pytest.approx(1 / 2)


def test_mcc():
    # (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 − 1) / sqrt(3·3·2·2) = 1/6
    assert matthews_corrcoef(PRED, GOLD) == pytest.approx(1 / 6)
    assert matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)


def test_degenerate_inputs_give_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0
        assert matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0
        assert f1([0, 0, 0], [0, 0, 0]) == 0.0
        assert pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
        assert spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0


def test_pearson_hand_computed():
    # dx = (-1, 0, 1), dy = (-4/3, -1/3, 5/3): cov = 3, |dx|² = 2, |dy|² = 42/9 → r = 9 / sqrt(84)
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))


def test_spearman_hand_computed():
    # ranks of y: 1, 3, 2, 4 → Σd² = 2 → ρ = 1 − 6·2 / (4·15) = 0.8
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)


def test_input_checks():
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="zero examples"):
        accuracy([], [])


def test_glue_metrics_report_exactly_the_glue_set():
    assert set(glue_metrics("CoLA", PRED, GOLD)) == {"mcc"}
    assert glue_metrics("cola", PRED, GOLD)["mcc"] == pytest.approx(1 / 6)
    assert glue_metrics("MRPC", PRED, GOLD) == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})
    assert set(glue_metrics("QQP", PRED, GOLD)) == {"accuracy", "f1"}
    for task in ("SST-2", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI"):
        assert set(glue_metrics(task, PRED, GOLD)) == {"accuracy"}
    stsb = glue_metrics("STS-B", [1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0])
    assert set(stsb) == {"pearson", "spearmanr"} and stsb["spearmanr"] == pytest.approx(0.8)


def test_glue_metrics_accepts_logits():
    logits = np.array([[0.1, 0.9], [0.2, 0.8], [0.7, 0.3], [0.6, 0.4], [0.0, 1.0]])  # argmax = PRED
    assert glue_metrics("sst2", logits, GOLD) == {"accuracy": pytest.approx(0.6)}
    scores = np.array([[1.0], [2.0], [3.0]])  # regression head output (N, 1)
    assert glue_metrics("stsb", scores, [1.0, 2.0, 4.0])["pearson"] == pytest.approx(9 / math.sqrt(84))


def test_canonical_task_names():
    assert canonical_task("SST-2") == "sst2" and canonical_task("sts_b") == "stsb"
    assert canonical_task("mnli_mismatched") == "mnli"
    assert len(GLUE_METRICS) == 9
    with pytest.raises(ValueError, match="unknown GLUE task"):
        canonical_task("squad")
