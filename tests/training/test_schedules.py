"""The trainer's warmup-stable-decay schedule and batch-size warm-up: exact values, validation, and what a run
with them takes (resume with both is pinned in tests/models/test_modernbert_verbs.py)."""

from __future__ import annotations

import math

import pytest
import torch

from bertkit.training.trainer import TrainConfig, learning_rate, micro_batches, train


def wsd(**fields) -> TrainConfig:
    return TrainConfig(**{"max_steps": 100, "learning_rate": 1.0, "warmup_steps": 10, "schedule": "wsd",
                          "decay_fraction": 0.2, **fields})


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_zero():
    config = wsd()
    assert [learning_rate(config, s, 0.0) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert all(learning_rate(config, s, 0.0) == 1.0 for s in range(10, 80))  # stable until 80% of the budget
    assert learning_rate(config, 80, 0.0) == pytest.approx(1.0)
    assert learning_rate(config, 90, 0.0) == pytest.approx(0.5)
    assert learning_rate(config, 95, 0.0) == pytest.approx(0.25)
    assert learning_rate(config, 100, 0.0) == 0.0


def test_wsd_one_minus_sqrt_decay_and_time_budget():
    config = wsd(decay_shape="1-sqrt")
    assert learning_rate(config, 85, 0.0) == pytest.approx(1 - math.sqrt(0.25))
    assert learning_rate(config, 96, 0.0) == pytest.approx(1 - math.sqrt(0.8))
    # A time budget: progress is the larger of steps and time, as for the linear schedule.
    timed = wsd(max_time=100.0, warmup_steps=0, warmup_ratio=0.0)
    assert learning_rate(timed, 20, 10.0) == 1.0 and learning_rate(timed, 20, 90.0) == pytest.approx(0.5)


def test_wsd_with_a_warmup_ratio_and_without_warmup():
    config = wsd(warmup_steps=0, warmup_ratio=0.1)
    assert learning_rate(config, 0, 0.0) == pytest.approx(0.1) and learning_rate(config, 9, 0.0) == 1.0
    assert learning_rate(wsd(warmup_steps=0), 0, 0.0) == 1.0


def test_batch_warmup_grows_one_micro_batch_at_a_time():
    config = TrainConfig(grad_accumulation=4, batch_warmup_steps=6, warmup_steps=0)
    assert [micro_batches(config, s) for s in range(9)] == [1, 1, 2, 2, 3, 3, 4, 4, 4]
    assert micro_batches(TrainConfig(grad_accumulation=4, warmup_steps=0), 0) == 4


@pytest.mark.parametrize("fields, message", [
    ({"schedule": "cosine"}, "schedule must be one of linear, inverse_sqrt, wsd"),
    ({"schedule": "wsd", "decay_fraction": 0.0}, "decay_fraction must be in"),
    ({"schedule": "wsd", "decay_fraction": 1.5}, "decay_fraction must be in"),
    ({"decay_shape": "cosine"}, "decay_shape must be one of linear, 1-sqrt"),
    ({"batch_warmup_steps": -1}, "batch_warmup_steps must not be negative"),
    ({"batch_warmup_steps": 10}, "set grad_accumulation"),
])
def test_schedule_options_are_validated(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


class CountingTask:
    """Trainer task on a one-parameter model: the loss is the parameter times the number of rows; it records how
    many rows each optimizer step saw."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def counts(self, batch):
        return {"x_loss": float(batch["input_ids"].shape[0])}

    def __call__(self, model, batch):
        self.rows.append(batch["input_ids"].shape[0])
        n = batch["input_ids"].shape[0]
        return {"x_loss": (model.weight.sum() * n, torch.tensor(float(n)))}


class Stream:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]

    def __iter__(self):
        while True:
            self.position += 1
            yield {"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3),
                   "_state": {"position": self.position}}


def test_a_run_takes_the_batch_warmup_and_the_wsd_rates(tmp_path):
    import json

    task, stream = CountingTask(), Stream()
    config = TrainConfig(max_steps=8, grad_accumulation=3, batch_warmup_steps=4, warmup_steps=2, schedule="wsd",
                         decay_fraction=0.25, learning_rate=0.1, log_every=1, save_every=100, progress=False,
                         device="cpu", precision="fp32")
    train(torch.nn.Linear(1, 1, bias=False), task, stream, config, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["micro_batches"] for r in records] == [1, 1, 2, 2, 3, 3, 3, 3]
    assert stream.position == sum(r["micro_batches"] for r in records)  # the stream gave exactly those
    assert [r["tokens"] for r in records][:3] == [6, 12, 24]  # 2 rows of 3 tokens per micro-batch
    assert [round(r["lr"], 6) for r in records] == [0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05]
