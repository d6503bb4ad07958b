"""bertkit.tasks.run's batches: EpochBatches collated in worker processes are the batches collated in the training
process (any number of workers, ranks, micro-batches; resumed mid-epoch), each rank collates only its own rows,
and a killed worker ends the run with one line."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest
import torch
from torch import nn

from bertkit.tasks import run as taskrun
from bertkit.errors import DataError
from bertkit.tasks.run import EpochBatches
from bertkit.training.trainer import TrainConfig, train


def features(n: int = 45, kind: str = "label", seed: int = 0) -> list[dict]:
    """Features of lengths 3-14 with a class label, a float label (regression), per-token labels, or multiple
    choice (3 choices of their own lengths)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if kind == "choice":
            rows = [[2] + list(rng.integers(5, 50, rng.integers(1, 12))) + [3] for _ in range(3)]
            out.append({"input_ids": rows, "token_type_ids": [[0] * len(r) for r in rows], "label": i % 3})
            continue
        ids = [2] + list(rng.integers(5, 50, rng.integers(1, 12))) + [3]
        f = {"input_ids": ids, "token_type_ids": [0] * len(ids)}
        if kind == "label":
            f["label"] = i % 3
        elif kind == "float":
            f["label"] = float(rng.normal())
        else:
            f["labels"] = [int(x) for x in rng.integers(-1, 4, len(ids))]
        out.append(f)
    return out


def take(stream: EpochBatches, count: int) -> list[dict]:
    it = iter(stream)
    try:
        return [next(it) for _ in range(count)]
    finally:
        it.close()


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a["_state"] == b["_state"]
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == b[key].dtype and torch.equal(value, b[key]), key


@pytest.mark.parametrize("kind", ["label", "float", "tokens", "choice"])
@pytest.mark.parametrize("workers", [1, 2])
def test_workers_collate_exactly_the_batches_of_the_training_process(kind, workers):
    # Two epochs and a half of micro-batches (accumulation 2, bucketing on), with 0 workers and with `workers`.
    data = features(kind=kind)
    settings = dict(pad_id=0, batch_size=8, seed=4, grad_accumulation=2, bucket_window=2)
    plain = EpochBatches(data, **settings)
    count = 2 * plain.steps_per_epoch * 2 + 3
    made = take(plain, count)
    parallel = EpochBatches(data, **settings, workers=workers)
    for a, b in zip(made, take(parallel, count), strict=True):
        same(a, b)
    assert parallel.position == plain.position and parallel.steps_done == plain.steps_done
    assert (parallel.examples_yielded, parallel.tokens_yielded) == (plain.examples_yielded, plain.tokens_yielded)


def test_workers_resume_mid_epoch_and_stop_where_told():
    data = features()
    settings = dict(pad_id=0, batch_size=8, seed=1, grad_accumulation=2, bucket_window=3)
    made = take(EpochBatches(data, **settings), 20)
    resumed = EpochBatches(data, **settings, workers=2, stop_after_steps=9)
    resumed.load_state_dict(made[6]["_state"])  # step 3, micro-batch 1 of 2
    rest = list(resumed)  # ends by itself at step 9: micro-batches 7..17
    assert len(rest) == 11
    for a, b in zip(made[7:18], rest, strict=True):
        same(a, b)
    assert resumed.steps_done == 9


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_with_workers_make_the_global_batches_of_one_process(world):
    # Rank r's micro-batch i, in rank order, is the one-process run's micro-batch (the same global batch, split).
    data = features(61)
    one = take(EpochBatches(data, 0, 8, seed=2, grad_accumulation=world, bucket_window=2), 3 * world)
    ranks = [take(EpochBatches(data, 0, 8, seed=2, rank=r, world_size=world, bucket_window=2, workers=2), 3)
             for r in range(world)]
    for step in range(3):
        for r in range(world):
            a, b = one[step * world + r], ranks[r][step]
            assert torch.equal(a["labels"], b["labels"])
            width = b["input_ids"].shape[1]  # a micro-batch is padded to its own longest row
            assert torch.equal(a["input_ids"][:, :width], b["input_ids"])


def test_each_rank_collates_a_quarter_of_the_rows(monkeypatch):
    # The rows a rank collates are its own: at world size 4, a quarter of what one process collates for the same
    # global batches (never the whole global batch).
    collated = []
    original = taskrun.collate

    def counting(rows, pad_id):
        collated.append(len(rows))
        return original(rows, pad_id)

    monkeypatch.setattr(taskrun, "collate", counting)
    data = features(96)
    steps = 6
    take(EpochBatches(data, 0, 16, seed=0, bucket_window=2), steps)
    whole = sum(collated)
    assert whole == 16 * steps
    for rank in range(4):
        collated.clear()
        take(EpochBatches(data, 0, 16, seed=0, rank=rank, world_size=4, bucket_window=2), steps)
        assert sum(collated) == whole // 4


def test_starting_workers_leaves_the_global_random_state_alone():
    # The training's dropout draws from torch's global generator: starting the workers must not move it.
    torch.manual_seed(3)
    take(EpochBatches(features(), 0, 8, seed=0, workers=2), 3)
    after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(3))


def test_workers_must_be_a_count():
    with pytest.raises(ValueError, match="workers"):
        EpochBatches(features(), 0, 8, seed=0, workers=-1)
    with pytest.raises(ValueError, match="workers"):
        taskrun.FinetuneConfig(workers=-2)


class KillsAWorker:
    """A trainer task on a linear model over the batches' labels that SIGKILLs a data worker at step 3."""

    def __init__(self) -> None:
        self.calls = 0

    def counts(self, batch):
        return {"sq_loss": float(batch["labels"].shape[0])}

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls == 3:
            workers = multiprocessing.active_children()
            assert workers
            os.kill(workers[0].pid, signal.SIGKILL)
        x = batch["input_ids"][:, :1].float()
        loss = ((model(x).squeeze(-1) - batch["labels"].float()) ** 2).sum()
        return {"sq_loss": (loss, torch.tensor(float(x.shape[0])))}


def test_a_killed_worker_ends_the_run_with_one_line(tmp_path):
    stream = EpochBatches(features(400), 0, 4, seed=0, workers=2, prefetch=1)
    config = TrainConfig(max_steps=90, learning_rate=1e-3, warmup_steps=0, save_every=1000, device="cpu",
                         precision="fp32", progress=False)
    with pytest.raises(DataError) as caught:
        train(nn.Linear(1, 1), KillsAWorker(), stream, config, tmp_path / "run")
    message = str(caught.value)
    assert "worker process" in message and "--resume" in message and "\n" not in message
    assert not multiprocessing.active_children()  # the other worker was shut down with the stream


def test_a_killed_run_leaves_its_directory_free_for_resume_at_once(tmp_path):
    # A run holds its directory's lock; its worker processes are forked with a copy of the lock's file. SIGKILLed,
    # the run's orphaned workers live on for seconds (until they notice): they must not keep the directory locked,
    # or an immediate --resume is refused as "in use by another bertkit process".
    import subprocess
    import sys

    from bertkit.io import lock_directory

    script = f"""
import sys, time
from bertkit.io import lock_directory
from bertkit.tasks.run import EpochBatches
features = [{{"input_ids": [2, 5 + i % 7, 3], "token_type_ids": [0, 0, 0], "label": i % 2}} for i in range(64)]
with lock_directory({str(tmp_path)!r}):
    batches = iter(EpochBatches(features, 0, 4, seed=0, workers=2))
    next(batches), next(batches)  # batch k comes from worker k mod 2: both workers have started
    print("ready", flush=True)
    time.sleep(120)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with lock_directory(tmp_path):  # at once: DirectoryLockedError if a worker still held the lock
            pass
    finally:
        proc.kill()


def test_collate_pads_each_field_to_the_batch_s_longest_row():
    rows = [{"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 1], "labels": [-100, 4, -100]},
            {"input_ids": [2], "token_type_ids": [0], "labels": [-1]},
            {"input_ids": [2, 9], "token_type_ids": [0, 1], "labels": [-100, 0]}]
    batch = taskrun.collate(rows, pad_id=5)
    assert batch["input_ids"].tolist() == [[2, 7, 3], [2, 5, 5], [2, 9, 5]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 4, -100], [-1, -100, -100], [-100, 0, -100]]
    assert {v.dtype for v in batch.values()} == {torch.int64}
    targets = taskrun.collate([{"input_ids": [2, 3], "token_type_ids": [0, 0], "target_ids": [8, 1]},
                               {"input_ids": [2], "token_type_ids": [0], "target_ids": [9, 9, 1]}], pad_id=0)
    assert targets["labels"].tolist() == [[8, 1, -100], [9, 9, 1]]  # padded to the longest target, not T
    choice = taskrun.collate([{"input_ids": [[2, 3], [2, 4, 3]], "token_type_ids": [[0, 0], [0, 0, 1]], "label": 1}],
                             pad_id=0)
    assert choice["input_ids"].tolist() == [[[2, 3, 0], [2, 4, 3]]] and choice["labels"].tolist() == [1]
    assert choice["attention_mask"].tolist() == [[[1, 1, 0], [1, 1, 1]]]
