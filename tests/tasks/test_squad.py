"""SQuAD: reader checks and the official evaluation, by hand (the windows: test_squad_windows.py)."""

import json
import re

import pytest

from bertkit.errors import DataError
from bertkit.tasks.squad import (SquadExample, compute_exact, compute_f1, evaluate_v1, evaluate_v2,
                                 find_best_threshold, normalize_answer, read_squad, read_squad_with_stats,
                                 squad_evaluate, write_null_odds, write_predictions)


# ---------------------------------------------------------------------------------------------------------------
# Official evaluation


def test_normalize_exact_and_f1():
    assert normalize_answer("The Cat sat!") == "cat sat"
    assert normalize_answer("  An   apple, a day.") == "apple day"
    assert compute_exact("cat sat", "The Cat sat!") == 1
    # gold "cat sat on mat" (4 tokens), prediction "cat on mat" (3): 3 shared → P 1, R 3/4, F1 6/7.
    assert compute_f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    assert compute_f1("", "") == 1.0 and compute_f1("", "cat") == 0.0 and compute_f1("the", "") == 1.0
    assert compute_f1("dog", "cat") == 0.0


def ex(qid, answers, impossible=False):
    return SquadExample(id=qid, question="?", context="", answers=[(a, 0) for a in answers],
                        is_impossible=impossible)


def test_evaluate_v1():
    examples = [ex("a", ["Denver Broncos", "Broncos"]), ex("b", ["1990"]), ex("c", ["red dog"])]
    # a: EM 1 via "Broncos"; b: EM 0, F1 0; c: missing → 0 but counted.
    with pytest.warns(UserWarning, match="1 unanswered question"):
        result = evaluate_v1(examples, {"a": "the Broncos", "b": "in 1991"})
    assert result == pytest.approx({"exact_match": 100 / 3, "f1": 100 / 3})
    result = squad_evaluate(examples[:1], {"a": "Denver"})
    assert result == pytest.approx({"exact_match": 0.0, "f1": 100 * 2 / 3})  # vs "Denver Broncos": P 1, R 1/2


V2_EXAMPLES = [ex("a", ["Paris"]), ex("b", [], True), ex("c", ["big red dog", "red dog"]), ex("d", [], True)]
V2_PREDICTIONS = {"a": "paris", "b": "y", "c": "the red dog", "d": ""}
V2_ODDS = {"a": -2.0, "c": -1.5, "b": -1.0, "d": 3.0}


def test_find_best_threshold_hand_computed():
    has_ans = {"a": True, "b": False, "c": True, "d": False}
    scores = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0}
    # Start at 2 (two unanswerable); by increasing odds: a +1 → 3 (thresh −2), c +1 → 4 (thresh −1.5),
    # b −1 (non-empty prediction on unanswerable) → 3, d +0 → 3. Best 4/4 at −1.5.
    assert find_best_threshold(V2_PREDICTIONS, scores, V2_ODDS, has_ans) == (100.0, -1.5)
    # If answering hurts everywhere, the best is to answer nothing: threshold 0.0 (the script's start value).
    assert find_best_threshold({"b": "y"}, {"b": 0.0}, {"b": -1.0}, {"b": False}) == (100.0, 0.0)


def test_evaluate_v2_official_fields():
    result = evaluate_v2(V2_EXAMPLES, V2_PREDICTIONS, V2_ODDS)
    assert result == pytest.approx({
        "exact": 75.0, "f1": 75.0, "total": 4,
        "HasAns_exact": 100.0, "HasAns_f1": 100.0, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        "best_exact": 100.0, "best_exact_thresh": -1.5, "best_f1": 100.0, "best_f1_thresh": -1.5,
    })
    # Without null odds there are no best_* fields; na_prob_thresh flips high-odds questions to "".
    assert "best_f1" not in squad_evaluate(V2_EXAMPLES, V2_PREDICTIONS, version_2=True)
    flipped = evaluate_v2(V2_EXAMPLES, V2_PREDICTIONS, V2_ODDS, na_prob_thresh=-1.1)  # b (odds −1) → "" → right
    assert flipped["exact"] == 100.0


# ---------------------------------------------------------------------------------------------------------------
# Files


SQUAD_V2 = {"version": "v2.0", "data": [{"title": "France", "paragraphs": [{
    "context": "Paris is in France.",
    "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}],
         "is_impossible": False},
        {"id": "q2", "question": "What is in France?", "answers": [{"text": "Paris", "answer_start": 1}],
         "is_impossible": False},
        {"id": "q3", "question": "Who?", "answers": [], "plausible_answers": [{"text": "Paris", "answer_start": 0}],
         "is_impossible": True},
    ]}]}]}


def test_read_squad_counts_and_reports_mismatches(tmp_path):
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(SQUAD_V2), encoding="utf-8")
    examples, stats = read_squad_with_stats(path)
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    assert examples[0] == SquadExample("q1", "Where is Paris?", "Paris is in France.", [("France", 12)], False,
                                       "France")
    assert examples[2].answers == [] and examples[2].is_impossible
    assert (stats.examples, stats.answers, stats.impossible) == (3, 2, 1)
    assert [(m.qid, m.text, m.found) for m in stats.mismatches] == [("q2", "Paris", "aris ")]
    with pytest.warns(UserWarning, match=re.escape(f"{path}: 1 of 2 answers do not match") + ".*q2"):
        assert len(read_squad(path)) == 3  # kept, not dropped


def test_read_squad_missing_key(tmp_path):
    bad = {"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q9", "answers": []}]}]}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}: question q9: missing key 'question'")):
        read_squad(path)


def test_prediction_files_round_trip(tmp_path):
    write_predictions(tmp_path / "predictions.json", {"q1": "France", "q3": ""})
    write_null_odds(tmp_path / "null_odds.json", {"q1": -3.5, "q3": 2.0})
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"q1": "France", "q3": ""}
    assert json.loads((tmp_path / "null_odds.json").read_text()) == {"q1": -3.5, "q3": 2.0}
