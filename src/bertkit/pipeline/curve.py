"""The main job's label-efficiency curve (stage 6): its recipe, label sets, seeds, run order and verdict.

Why the fine-tuning recipe is what it is. Pretraining here is masked LM only: no loss ever reaches the [CLS]
position, whose vector attends to the sentence through weights trained for the other positions, and the pooler
above it stays at its random initialisation. A randomly initialised model, by contrast, attends about evenly, so
its [CLS] vector is close to the mean of the sentence's embeddings, a bag of words a classifier can read at once.
So both starting points classify from the mean of the last layer's token vectors (`classifier_pooling` "mean"),
which the masked-LM training did shape, at a learning rate (3e-4) that moves a pretrained encoder without erasing
it in the hundred-odd steps of a small label set; each run sees at least `FINETUNE_MIN_EXAMPLES` examples (many
passes over a small label set), and the dev set is scored once, at the end (no epoch picked on dev). Label sets of
at most `FROZEN_MAX_LABELS` fit only a logistic regression on the frozen encoder's features instead, for both
starting points: a few hundred sentences cannot say which of the encoder's weights to move. On a frozen random
encoder that regression reads a random network's features, at chance by construction on a task that a bag of words
cannot solve, so the same label sets are also fine-tuned from random initialisation: the baseline a reader expects.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np

# Fine-tuning, the same for both starting points: learning rate 3e-4 moves a small pretrained encoder without
# erasing it in the hundred-odd steps of a small label set (1e-3 moved it far in the first steps).
FINETUNE = {"learning_rate": 3e-4, "batch_size": 16, "dropout": 0.1}
# Label sets of at most FROZEN_MAX_LABELS examples fit only a logistic regression on the standardised mean and
# maximum over the tokens of the frozen encoder's last layer (`--frozen --task-model logistic`, L-BFGS to
# convergence, C 1; the same for both starting points): a few hundred sentences cannot say which of the encoder's
# weights to move, and fitting them all to those sentences is what spread the pretrained runs. On the word-salad
# task with a model pretrained at half this machine's speed (1,257 steps), 30 label sets each: at 128 labels the
# regression gave 0.564 (IQR 0.019) against 0.514 (0.015) from random initialisation, where fine-tuning gave 0.523
# against 0.500; at 512, 0.598 against 0.515 (fine-tuned: 0.548 against 0.502). With all 2,870 labels fine-tuning
# is ahead (0.760 against the regression's 0.681), so the larger label counts are fine-tuned.
FROZEN_MAX_LABELS = 512
FROZEN = {"frozen": True, "layers": "-1", "task_model": "logistic"}
FINETUNE_SEEDS = 7  # seeds at the fewest labels, each the same for both starting points
FROZEN_SEEDS = 3  # at the other label counts of the frozen encoder (each run takes a few seconds)
# At the fine-tuned label counts: one seed is planned (the minutes go to pretraining, which the whole curve stands
# on), up to three run while the budget has room at the end.
FINETUNED_SEEDS = 1
FINETUNED_MORE_SEEDS = 3
# The baseline a reader expects beside the frozen points: random initialisation fine-tuned (`FINETUNE`, at least
# `FINETUNE_MIN_EXAMPLES` examples a run) on the same label sets at every label count of the frozen encoder. A
# regression on a frozen random encoder reads a random network's features, at chance by construction on a task
# that a bag of words cannot solve; training the whole model on the labels is what "without pretraining" usually
# means. Seeds planned: this many at the fewest labels, `FINETUNED_SEEDS` at the others (up to
# `FINETUNED_MORE_SEEDS` while the budget has room); when the budget is short they are the first cut.
BASELINE_SEEDS = 3

# The label-efficiency curve: fine-tuning on nested, class-balanced label sets of these sizes (and on all labels).
# It starts at 64, not 32: at 32 labels the regression on a model pretrained at half this machine's speed was
# ahead by less than the seeds' spread (0.528, IQR 0.016, against 0.504, 0.017), so that 5 seeds drawn from 30 put
# it beyond both interquartile ranges in 64% of the draws; at 64 labels in 95% (7 seeds: 98%), at 128 in 99%
# (scikit-learn's fit on models no longer kept; bench/experiments/seed_draws.py computes such shares from a job's
# output directory with the job's own fit, docs/getting-started/main-job.md has its figures).
LABEL_LADDER = (64, 128, 256, 512, 2048, 8192, 32768)
# Training examples each fine-tuning run sees at least (small label sets: many passes). 1,000, not 2,000: on the
# word-order task at 32 labels, 2,000 let random initialisation creep above chance (median 0.510 against 0.501)
# and narrowed the pretrained model's lead from 0.022 to 0.012 (docs/getting-started/main-job.md). A logistic
# regression on the frozen encoder sees each example once.
FINETUNE_MIN_EXAMPLES = 1000
FINETUNE_MIN_PASSES = 3  # passes over a large label set


def label_ladder(train_examples: int, classes: int, rungs: tuple[int, ...] = LABEL_LADDER) -> list[int]:
    """The label counts of the curve: the rungs of `rungs` with at least two labels per class and at most half the
    training set, then the whole training set."""
    return [n for n in rungs if 2 * classes <= n <= train_examples // 2] + [train_examples]


def stratified_order(labels: list[str], seed: int) -> list[int]:
    """Indices of the training examples in the order the ladder takes them: each class's examples shuffled with
    `seed`, then one of each class in turn (classes in sorted order; a class that runs out drops out). Every
    prefix is as balanced as the classes allow and holds every class once it is as long as the number of classes,
    and the smaller label sets of one seed are subsets of the larger ones."""
    rng = random.Random(seed)
    by_class: dict[str, list[int]] = collections.defaultdict(list)
    for i, label in enumerate(labels):
        by_class[label].append(i)
    queues = []
    for label in sorted(by_class):
        members = by_class[label][:]
        rng.shuffle(members)
        queues.append(members)
    order, depth = [], 0
    while len(order) < len(labels):
        order.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return order


def passes_for(labels: int, min_examples: int = FINETUNE_MIN_EXAMPLES, min_passes: int = FINETUNE_MIN_PASSES) -> int:
    """Passes over a label set of this size: `min_passes` (a few epochs, as usual when labels are plenty), more
    for a small set so that every run takes at least `min_examples` training examples in all (32 labels get
    ~100 passes)."""
    return max(min_passes, math.ceil(min_examples / labels))


def write_label_set(examples: list, indices: list[int], passes: int, path: Path) -> Path:
    """Write `examples[i]` for i in `indices`, `passes` times over, as JSON Lines {"text", "pair"?, "label"}: one
    fine-tuning epoch over this file is `passes` epochs over the label set, so each run evaluates on dev once, at
    its end (no best epoch picked on dev)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in indices:
        e = examples[i]
        row = {"text": e.text, "label": e.label}
        if e.pair is not None:
            row["pair"] = e.pair
        rows.append(json.dumps(row, ensure_ascii=False) + "\n")
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(passes):
            handle.writelines(rows)
    return path


def curve_schedule(planned: list[int], more: list[int], leading: tuple[int, ...] = (0,)) -> list[tuple[int, int]]:
    """The order of the curve's runs, (entry's index, seed's index): the `leading` entries' `planned` seeds first
    (the fewest labels, and the baseline there: cheap, and their spread is the claim), then one seed at every other
    entry (the whole curve), then their other planned seeds, in index order (the smallest label count first); the
    first sum(planned) entries. After them, run only while the budget has room (the machine was busier when the
    plan measured it, or the runs were cheaper than planned), the seeds up to `more` that the plan did not keep,
    the leading entries' first, then in index order."""
    rest = [i for i in range(len(planned)) if i not in leading]
    order = ([(i, k) for i in leading for k in range(planned[i])] + [(i, 0) for i in rest if planned[i]]
             + [(i, k) for i in rest for k in range(1, planned[i])])
    return order + [(i, k) for i in list(leading) + rest for k in range(planned[i], more[i])]


def quartiles(values: list[float]) -> dict[str, Any]:
    """{"median", "q1", "q3", "iqr", "min", "max", "values"} of the seeds' figures (quartiles by linear
    interpolation, numpy's default)."""
    q1, median, q3 = (float(x) for x in np.percentile(values, [25, 50, 75]))
    return {"median": median, "q1": q1, "q3": q3, "iqr": q3 - q1, "min": min(values), "max": max(values),
            "values": list(values)}


def curve_verdict(point: dict[str, Any]) -> dict[str, Any]:
    """At one label count: the gap between the pretrained and the random-initialisation medians, and whether it
    is larger than both interquartile ranges (the test of the curve's claim; with fewer than three seeds there is
    no spread to speak of, so never); the pretrained run ahead on how many of the seeds.

    Where the point has the fine-tuned baseline (`scratch_finetuned`, random initialisation fine-tuned on the same
    label sets), the same against it: `finetuned_gap`, `finetuned_beyond_spread` (three seeds or more on both
    sides), `finetuned_wins` of `finetuned_seeds` (the seeds both ran: each side's values are in seed order, from
    the same first seed)."""
    pre, scr = point["pretrained"], point["scratch"]
    gap = pre["median"] - scr["median"]
    verdict = {"gap": gap, "beyond_spread": len(pre["values"]) >= 3 and gap > max(pre["iqr"], scr["iqr"]),
               "wins": sum(p > s for p, s in zip(pre["values"], scr["values"])), "seeds": len(pre["values"])}
    tuned = point.get("scratch_finetuned")
    if tuned:
        tuned_gap = pre["median"] - tuned["median"]
        both = min(len(pre["values"]), len(tuned["values"]))
        verdict.update(finetuned_gap=tuned_gap, finetuned_seeds=both,
                       finetuned_beyond_spread=both >= 3 and tuned_gap > max(pre["iqr"], tuned["iqr"]),
                       finetuned_wins=sum(p > s for p, s in zip(pre["values"], tuned["values"])))
    return verdict


def seed_draw_share(pretrained: list[float], scratch: list[float], k: int, draws: int | None = None,
                    seed: int = 0) -> float:
    """How often `k` seeds put a point beyond both spreads: the share of draws of k of the seeds (without
    replacement, the same seeds for both starting points, as the job pairs them) for which `curve_verdict` says
    beyond. `pretrained[i]` and `scratch[i]` are seed i's accuracies. draws: that many draws from
    `numpy.random.default_rng(seed)`; None: every k-subset once (the exact share)."""
    if len(pretrained) != len(scratch) or not 1 <= k <= len(pretrained):
        raise ValueError(f"one accuracy per seed on both sides and 1 <= k <= {len(pretrained)}, got k {k}")

    def beyond(chosen) -> bool:
        return curve_verdict({"pretrained": quartiles([pretrained[i] for i in chosen]),
                              "scratch": quartiles([scratch[i] for i in chosen])})["beyond_spread"]

    if draws is None:
        subsets = list(itertools.combinations(range(len(pretrained)), k))
        return sum(map(beyond, subsets)) / len(subsets)
    rng = np.random.default_rng(seed)
    return sum(beyond(rng.choice(len(pretrained), size=k, replace=False)) for _ in range(draws)) / draws


# What the progress lines call each starting point of the curve.
START_NAMES = {"pretrained": "pretrained", "scratch": "random init", "scratch_finetuned": "random init fine-tuned"}


def label_set_name(labels: int, seed: int, baseline: bool = False) -> str:
    """The label set file of a point: the curve's `train-N-seedS.jsonl`; the fine-tuned baseline's, the same
    examples repeated for its own passes, `train-N-seedS-finetuned.jsonl`."""
    return f"train-{labels}-seed{seed}{'-finetuned' if baseline else ''}.jsonl"
