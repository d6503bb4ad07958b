"""bertkit.pipeline.curve: the label ladder, the label sets, the seeds' quartiles and the verdict, the run order."""

from __future__ import annotations

import json

import pytest

from bertkit.pipeline.curve import (curve_schedule, curve_verdict, label_ladder, passes_for, quartiles,
                                    seed_draw_share, stratified_order, write_label_set)


def test_label_ladder_and_label_sets(tmp_path):
    assert label_ladder(2770, 8) == [64, 128, 256, 512, 2770]  # 2,048 is more than half of 2,770
    assert label_ladder(5749, 3) == [64, 128, 256, 512, 2048, 5749]
    assert label_ladder(100, 40) == [100]  # 64 labels would give fewer than two per class
    assert label_ladder(100, 2, (8, 32, 64)) == [8, 32, 100]
    labels = ["a"] * 10 + ["b"] * 3 + ["c"] * 7
    order = stratified_order(labels, seed=1)
    assert sorted(order) == list(range(20))
    assert [labels[i] for i in order[:9]] == ["a", "b", "c"] * 3  # one of each class in turn
    assert [labels[i] for i in order[9:13]] == ["a", "c", "a", "c"]  # b ran out
    assert stratified_order(labels, seed=1) == order and stratified_order(labels, seed=2) != order
    assert (passes_for(32, 2000, 3), passes_for(512, 2000, 3), passes_for(2770, 2000, 3)) == (63, 4, 3)

    class E:
        def __init__(self, text, pair, label):
            self.text, self.pair, self.label = text, pair, label

    rows = [E("x", "y", "a"), E("z", None, "b")]
    path = write_label_set(rows, [1, 0], 2, tmp_path / "set.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"text": "z", "label": "b"}, {"text": "x", "label": "a", "pair": "y"}] * 2


def test_quartiles_and_the_verdict():
    q = quartiles([0.1, 0.5, 0.2, 0.4, 0.3])
    assert (q["median"], q["q1"], q["q3"], q["min"], q["max"]) == pytest.approx((0.3, 0.2, 0.4, 0.1, 0.5))
    assert q["iqr"] == pytest.approx(0.2)
    point = {"pretrained": quartiles([0.50, 0.52, 0.55]), "scratch": quartiles([0.30, 0.31, 0.35])}
    verdict = curve_verdict(point)
    assert verdict["gap"] == pytest.approx(0.21) and verdict["beyond_spread"] and verdict["wins"] == 3
    close = {"pretrained": quartiles([0.30, 0.40, 0.50]), "scratch": quartiles([0.30, 0.35, 0.36])}
    assert not curve_verdict(close)["beyond_spread"]  # a gap of 0.05 inside the pretrained IQR of 0.10
    one = {"pretrained": quartiles([0.5]), "scratch": quartiles([0.3])}
    assert curve_verdict(one)["gap"] == pytest.approx(0.2) and not curve_verdict(one)["beyond_spread"]  # no spread
    assert "finetuned_gap" not in verdict  # no baseline at this point
    # Against the fine-tuned baseline: its own gap, spread and wins, over the seeds both ran (the first three).
    tuned = curve_verdict({**point, "scratch_finetuned": quartiles([0.40, 0.53, 0.45])})
    assert tuned["finetuned_gap"] == pytest.approx(0.52 - 0.45) and tuned["finetuned_wins"] == 2
    assert tuned["finetuned_seeds"] == 3 and tuned["finetuned_beyond_spread"]  # 0.07 beyond its IQR of 0.065
    inside = curve_verdict({**point, "scratch_finetuned": quartiles([0.40, 0.56, 0.45])})
    assert inside["finetuned_gap"] == pytest.approx(0.07) and not inside["finetuned_beyond_spread"]  # IQR 0.08
    wide = curve_verdict({"pretrained": quartiles([0.50, 0.52, 0.55, 0.56]), "scratch": quartiles([0.3] * 4),
                          "scratch_finetuned": quartiles([0.45, 0.47])})
    assert wide["finetuned_seeds"] == 2 and not wide["finetuned_beyond_spread"] and wide["finetuned_wins"] == 2


def test_seed_draw_share_counts_the_draws_beyond_both_spreads():
    # Four seeds at 0.6 and one at 0.4 against 0.5 everywhere: a draw of three is beyond both spreads only without
    # the 0.4 seed (its IQR 0.1 then equals the gap): 4 of the 10 subsets.
    pre, scr = [0.6, 0.6, 0.6, 0.6, 0.4], [0.5] * 5
    assert seed_draw_share(pre, scr, 3) == pytest.approx(0.4)
    # Sampled: 4,000 draws, within 4 binomial standard deviations (0.0077 each) of the exact share.
    assert abs(seed_draw_share(pre, scr, 3, draws=4000) - 0.4) < 0.031
    assert seed_draw_share(pre, scr, 3, draws=500, seed=1) == seed_draw_share(pre, scr, 3, draws=500, seed=1)
    assert seed_draw_share(pre, scr, 4) == 1.0  # with four, the 0.4 seed moves the first quartile only (IQR 0.05)
    assert seed_draw_share([0.6] * 5, scr, 5) == 1.0 and seed_draw_share([0.6] * 5, scr, 2) == 0.0  # 2: no spread
    with pytest.raises(ValueError):
        seed_draw_share(pre, scr, 6)


def test_curve_schedule_runs_the_fewest_labels_first_then_the_curve_then_what_time_allows():
    # Planned: 3 seeds at the fewest labels, one at the others; room allowing, up to 5, 3 and 1.
    assert curve_schedule([3, 1, 1], [5, 3, 1]) == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0),  # the planned runs
                                                    (0, 3), (0, 4), (1, 1), (1, 2)]  # the extra ones
    assert curve_schedule([2, 2, 2], [2, 2, 2]) == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1), (2, 1)]
    assert curve_schedule([1], [1]) == [(0, 0)]
    # With the baseline's entries after the curve's (here entry 3, the fewest labels fine-tuned from random
    # initialisation, and entry 4): the fewest labels' seeds of both first, before the expensive all-labels run.
    assert curve_schedule([3, 1, 1, 2, 0], [3, 3, 1, 3, 3], (0, 3)) == [
        (0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (1, 0), (2, 0),  # planned
        (3, 2), (1, 1), (1, 2), (4, 0), (4, 1), (4, 2)]  # with time left: the leading entries' first
