"""bertkit.training.trainer: the learning-rate schedule at exact steps, accumulation against one big batch, a loss that
falls, and resuming from the resume state (model, optimizer, data position and RNG) to the same result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch
from torch import nn

from bertkit.training import trainer
from bertkit.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from bertkit.training.trainer import TrainConfig, learning_rate, param_groups, train
from device_reads import count_reads


def config(**overrides) -> TrainConfig:
    fields = dict(max_steps=4, learning_rate=0.1, warmup_steps=0, warmup_ratio=0.0, weight_decay=0.0,
                  max_grad_norm=0.0, log_every=1, save_every=1000, device="cpu", precision="fp32", progress=False)
    fields.update(overrides)
    return TrainConfig(**fields)


# ---- schedule --------------------------------------------------------------------------------------------------
def test_warmup_steps_then_linear_decay_at_exact_steps():
    c = config(max_steps=10, warmup_steps=2, learning_rate=1.0)
    # Warm-up counts the step being taken: 1/2, 2/2; then (1 - step/10) / (1 - 2/10).
    expected = [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    assert [learning_rate(c, step, 0.0) for step in range(10)] == pytest.approx(expected, abs=1e-12)


def test_warmup_ratio_and_the_time_budget():
    c = config(max_steps=8, warmup_ratio=0.25, learning_rate=2.0)
    # progress 0 and 1/8 are inside the first quarter: (step + 1) / 8 of it; then (1 - step/8) / (3/4).
    expected = [1.0, 2.0, 2.0, 2.0 * 5 / 6, 2.0 * 4 / 6, 2.0 * 3 / 6, 2.0 * 2 / 6, 2.0 * 1 / 6]
    assert [learning_rate(c, step, 0.0) for step in range(8)] == pytest.approx(expected, abs=1e-12)
    timed = config(max_steps=1000, max_time=100.0, learning_rate=1.0)
    # A time budget decays on whichever is further along, steps or seconds.
    assert learning_rate(timed, 0, 50.0) == pytest.approx(0.5, abs=1e-12)
    assert learning_rate(timed, 900, 50.0) == pytest.approx(0.1, abs=1e-12)
    assert learning_rate(timed, 0, 100.0) == 0.0


def test_no_weight_decay_on_biases_and_layernorm():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1, bias=False))
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[2].weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model[0].bias), id(model[1].weight), id(model[1].bias)}


# ---- a tiny regression task ------------------------------------------------------------------------------------
class Regression:
    """Summed squared error of a linear model; optional dropout so that the RNG matters."""

    def counts(self, batch):
        return {"mse_loss": float(batch["y"].numel())}

    def __call__(self, model, batch):
        error = model(batch["x"]).squeeze(-1) - batch["y"]
        return {"mse_loss": (error.pow(2).sum(), torch.tensor(float(error.numel())))}


def regression_batches(rows: list[int], seed: int = 0) -> list[dict]:
    """Micro-batches of (x, y = x . w_true + 1) with the given row counts; "_state" is the position after each."""
    g = torch.Generator().manual_seed(seed)
    w_true = torch.tensor([1.0, -2.0, 0.5, 3.0])
    out = []
    for i, n in enumerate(rows):
        x = torch.randn(n, 4, generator=g)
        out.append({"x": x, "y": x @ w_true + 1.0, "attention_mask": torch.ones(n, 1), "_state": i + 1})
    return out


class Stream:
    """A resumable list of micro-batches: `load_state_dict(position)` seeks to it."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches, self.start = batches, 0

    def load_state_dict(self, position: int) -> None:
        self.start = position

    def __iter__(self):
        return iter(self.batches[self.start:])


def linear(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(4, 1))


def test_accumulation_gives_the_update_of_one_big_batch(tmp_path):
    # A large epsilon makes AdamW's first step lr * g / (|g| + eps), one-to-one in the gradient g (Adam's usual
    # step is nearly sign(g), blind to a gradient off by a factor).
    overrides = dict(max_steps=1, learning_rate=10.0, adam_epsilon=10.0)
    big = regression_batches([8])
    split = [{"x": big[0]["x"][:3], "y": big[0]["y"][:3], "attention_mask": torch.ones(3, 1)},
             {"x": big[0]["x"][3:], "y": big[0]["y"][3:], "attention_mask": torch.ones(5, 1)}]
    one = linear()
    train(one, Regression(), big, config(**overrides), tmp_path / "one")
    accumulated = linear()
    train(accumulated, Regression(), split, config(grad_accumulation=2, **overrides), tmp_path / "acc")
    for a, b in zip(one.parameters(), accumulated.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # The same update by hand: the mean squared error's gradient over all 8 rows, through AdamW's first step.
    reference = linear()
    loss = (reference(big[0]["x"]).squeeze(-1) - big[0]["y"]).pow(2).mean()
    loss.backward()
    for p, trained in zip(reference.parameters(), one.parameters()):
        expected = p.detach() - 10.0 * p.grad / (p.grad.abs() + 10.0)
        torch.testing.assert_close(trained.detach(), expected, atol=1e-6, rtol=0)
    records = [json.loads(line) for line in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["mse_loss"] == pytest.approx(float(loss.detach()), rel=1e-6) and records[0]["tokens"] == 8


def test_loss_falls_on_a_tiny_task(tmp_path):
    model = linear()
    result = train(model, Regression(), regression_batches([16] * 60), config(max_steps=60, learning_rate=0.3),
                   tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 61))
    assert records[-1]["loss"] < 0.05 * records[0]["loss"]
    assert result.step == 60 and result.stopped_by == "max_steps" and result.tokens == 60 * 16


def test_stops_at_the_end_of_the_data_and_on_tokens(tmp_path):
    result = train(linear(), Regression(), regression_batches([4] * 3), config(max_steps=10), tmp_path / "a")
    assert (result.step, result.stopped_by) == (3, "end_of_data")
    result = train(linear(), Regression(), regression_batches([4] * 9), config(max_steps=10, max_tokens=10),
                   tmp_path / "b")
    assert (result.step, result.tokens, result.stopped_by) == (3, 12, "max_tokens")


# ---- resume ----------------------------------------------------------------------------------------------------
def test_resume_repeats_the_uninterrupted_run(tmp_path):
    """Stopped after 3 of 6 steps and resumed: the same weights and losses as one run (dropout draws included)."""
    batches = regression_batches([5] * 12)
    c = config(max_steps=6, grad_accumulation=2, save_every=3, learning_rate=0.05, warmup_steps=2)
    whole = linear(dropout=0.3)
    torch.manual_seed(7)
    train(whole, Regression(), Stream(batches), c, tmp_path / "whole")

    first = linear(dropout=0.3)
    torch.manual_seed(7)
    half = train(first, Regression(), Stream(batches[:6]), c, tmp_path / "half")  # the data runs out at step 3
    assert (half.step, half.stopped_by) == (3, "end_of_data")
    state = load_checkpoint(latest_checkpoint(tmp_path / "half"))
    assert (state["step"], state["data"], len(state["rng"])) == (3, 6, 1)
    torch.manual_seed(99)  # whatever the process did since, the resumed run restores the saved RNG states
    second = linear(seed=123, dropout=0.3)  # and the weights come from the checkpoint
    result = train(second, Regression(), Stream(batches), c, tmp_path / "half", resume=True)
    assert result.step == 6
    for a, b in zip(whole.parameters(), second.parameters()):
        assert torch.equal(a, b)
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("whole", "half")]
    assert len(losses[0]) == 6 and losses[0] == losses[1]


@pytest.mark.parametrize("change", ["no window", "window losses as a list"])
def test_resume_refuses_a_state_without_the_metrics_window_in_one_line(tmp_path, change):
    """A resume state without the metrics window as (sum, steps) (bertkit before the step loop kept it on the
    device) is refused with the file named, before the model is touched."""
    c = config(max_steps=2, save_every=2)
    train(linear(), Regression(), Stream(regression_batches([4] * 2)), c, tmp_path / "run")
    path = latest_checkpoint(tmp_path / "run")
    state = load_checkpoint(path)
    if change == "no window":
        del state["window"]
    else:
        state["window"]["losses"] = [0.5, 0.25]
    torch.save(state, path)
    model = linear(seed=5)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: not a resume state of this bertkit "
                                              f"\\(no window"):
        train(model, Regression(), Stream(regression_batches([4] * 4)), config(max_steps=4), tmp_path / "run",
              resume=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_restarted_torchrun_attempt_keeps_its_process_group_keys_apart(monkeypatch):
    """Under torchrun's agent store, each attempt's keys (every rank's address) live under its own prefix, so a
    restarted rank never reads the address of a rank of the attempt before."""
    import torch.distributed as dist

    from bertkit.training.trainer import Distributed, _attempt_store

    assert _attempt_store(Distributed(0, 2, 0)) == {}  # plain torchrun or env://: torch's own store
    from datetime import timedelta

    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    server.set("rank_1", "the address of attempt 0's rank 1")  # what a killed rank left behind
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        fields = _attempt_store(Distributed(0, 1, 0))  # one client (a store client waits for world_size of them)
        assert (fields["rank"], fields["world_size"]) == (0, 1)
        fields["store"].set("rank_1", f"attempt {attempt}")
        assert server.get(f"bertkit/attempt-{attempt}/rank_1") == f"attempt {attempt}".encode()  # PrefixStore adds "/"
    assert server.get("rank_1") == b"the address of attempt 0's rank 1"


# A fresh interpreter: bertkit.training.trainer imported first, as every verb does, then a gloo group, a DDP step and a
# collective, and `end_distributed`. DDP's constructor imports torch.distributed.nn.functional (through
# torch._dynamo); imported after the group exists, its default arguments hold the group, nothing is freed, and the
# gloo threads live on into interpreter shutdown, where they ended ranks with SIGABRT (see end_distributed).
PROCESS_GROUP_LIFE = """
import os, sys
from bertkit.training.trainer import end_distributed
import torch
import torch.distributed as dist
from torch import nn

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
model = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
model(torch.ones(4, 3)).sum().backward()
dist.all_reduce(torch.ones(2))
during = threads()
del model
end_distributed()
print(before, during, threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_end_distributed_joins_the_gloo_threads_after_a_ddp_run(tmp_path):
    """No thread of the process group outlives `end_distributed`, DDP and all: the threads gloo started are gone
    and the count is back to what it was before the group."""
    proc = subprocess.run([sys.executable, "-c", PROCESS_GROUP_LIFE, str(tmp_path / "store")], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, during, after = map(int, proc.stdout.split())
    assert during > before  # gloo's workers and its socket loop: what the count must see leave
    assert after == before, (before, during, after)


# ---- no device reads between log steps -------------------------------------------------------------------------
@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_step_loop_reads_the_device_only_at_log_and_save_steps(tmp_path, monkeypatch, accumulation):
    # max_steps 2 and 8 with one log line and one checkpoint at the end: a loop that read a loss, a count or the
    # gradient norm every step would read four times as often in the longer run.
    def run(steps, name):
        batches = regression_batches([4] * (steps * accumulation))
        c = config(max_steps=steps, log_every=1000, max_grad_norm=1.0, grad_accumulation=accumulation)
        return lambda: train(linear(), Regression(), batches, c, tmp_path / name)

    short, long = count_reads(run(2, "short"), monkeypatch), count_reads(run(8, "long"), monkeypatch)
    assert short == long
    # A log line every 2 steps: the reads grow with the lines, not with the steps.
    every_two = count_reads(lambda: train(linear(), Regression(), regression_batches([4] * 8 * accumulation),
                                          config(max_steps=8, log_every=2, max_grad_norm=1.0,
                                                 grad_accumulation=accumulation), tmp_path / "two"), monkeypatch)
    assert every_two > long


class TinyPretraining(nn.Module):
    """BertForPreTraining's interface in two layers: MLM logits at `predict_at` (sparse) and NSP logits. The
    objective and the loop are under test, not the encoder (whose own per-forward checks are the model's)."""

    def __init__(self, vocab: int = 60) -> None:
        super().__init__()
        self.embed, self.mlm, self.nsp = nn.Embedding(vocab, 16), nn.Linear(16, vocab), nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask, token_type_ids, predict_at=None):
        from bertkit.models.layouts import positions

        h = self.embed(input_ids)  # (B, T, 16)
        at = h.flatten(0, 1).index_select(0, positions(predict_at))  # as the encoder's `select`
        return types.SimpleNamespace(prediction_logits=self.mlm(at), seq_relationship_logits=self.nsp(h[:, 0]))


def test_the_pretraining_objective_reads_nothing_from_the_device(tmp_path, monkeypatch):
    # MLM + NSP: counts come from the batch, (sum, count) terms stay tensors.
    from bertkit.training.objectives import MaskedLMObjective

    g = torch.Generator().manual_seed(0)

    def batch():
        ids = torch.randint(5, 60, (4, 12), generator=g)
        labels = torch.where(torch.rand(4, 12, generator=g) < 0.2, ids, torch.full_like(ids, -100))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                "labels": labels, "next_sentence_label": torch.randint(0, 2, (4,), generator=g)}

    def run(steps, name):
        torch.manual_seed(0)
        batches = [batch() for _ in range(steps)]
        return lambda: train(TinyPretraining(), MaskedLMObjective("nsp"), batches,
                             config(max_steps=steps, log_every=1000), tmp_path / name)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


@pytest.mark.parametrize("packed", [False, True])
def test_a_padded_batch_through_bert_reads_nothing_from_the_device(tmp_path, monkeypatch, packed):
    # The real encoder on rows of different lengths (the unpadded layout) or packed rows (documents 1, 2, ...):
    # its layout comes from the batch's host copy of the mask, so a longer run reads the device no more often.
    from bertkit import BertForPreTraining
    from bertkit.models import layouts
    from bertkit.training.objectives import MaskedLMObjective
    from conftest import tiny_config

    # The model checks input values only where reading them is free (the CPU); here the batch plays the device's
    monkeypatch.setattr(layouts, "checks_values", lambda x: False)
    g = torch.Generator().manual_seed(0)

    def batch():
        ids = torch.randint(5, 90, (4, 12), generator=g)
        lengths = torch.tensor([12, 9, 5, 7])
        mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
        if packed:
            mask = mask * (1 + (torch.arange(12)[None, :] >= 6).long())  # two documents per row
        labels = torch.where((torch.rand(4, 12, generator=g) < 0.3) & (mask != 0), ids, torch.full_like(ids, -100))
        labels[:, 1] = ids[:, 1]  # every row predicts at least one token
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
                "labels": labels, "next_sentence_label": torch.randint(0, 2, (4,), generator=g)}

    def run(steps, name):
        torch.manual_seed(0)
        batches = [batch() for _ in range(steps)]
        model = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        return lambda: train(model, MaskedLMObjective("nsp"), batches, config(max_steps=steps, log_every=1000),
                             tmp_path / name)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


def test_electra_through_the_loop_reads_nothing_from_the_device(tmp_path, monkeypatch):
    # Generator, sampling (uniforms from the host key) and discriminator: every masked or real position is
    # indexed through the batch's host copies, so a longer run reads the device no more often.
    from bertkit.config import BertConfig
    from bertkit.models import GeneratorDiscriminator, layouts
    from bertkit.training.objectives import ElectraObjective

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)  # the batch plays the device's
    g = torch.Generator().manual_seed(0)

    def batch():
        ids = torch.randint(5, 90, (4, 12), generator=g)
        mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 5, 7])[:, None]).long()
        labels = torch.where((torch.rand(4, 12, generator=g) < 0.3) & (mask != 0), ids, torch.full_like(ids, -100))
        labels[:, 1] = ids[:, 1]
        return {"input_ids": torch.where(labels != -100, 4, ids), "attention_mask": mask,
                "token_type_ids": torch.zeros_like(ids), "labels": labels}

    def run(steps, name):
        torch.manual_seed(0)
        batches = [batch() for _ in range(steps)]
        config_ = BertConfig.for_family("electra", vocab_size=90, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, embedding_size=16,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = GeneratorDiscriminator(config_, generator_fraction=0.5)
        return lambda: train(model, ElectraObjective(), batches, config(max_steps=steps, log_every=1000),
                             tmp_path / name)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


@pytest.mark.parametrize("head", ["classification", "regression", "tokens", "mlm"])
def test_distillation_steps_read_nothing_from_the_device(tmp_path, monkeypatch, head):
    # Teacher and student on padded rows (the unpadded layout), every loss term on (soft, hard, logits, hidden
    # states through a projection), transfer-set rows without gold labels among the labelled ones: the compared
    # positions and the labelled ones are weights or host-known indices, so a longer run reads the device no more.
    from bertkit.training.distill import UNLABELLED, DistillationStudent, DistillationTask, DistillConfig, layer_map
    from bertkit.models import (IGNORE_INDEX, BertForMaskedLM, BertForSequenceClassification,
                                BertForTokenClassification, layouts)
    from conftest import tiny_config

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)  # the batch plays the device's
    g = torch.Generator().manual_seed(0)

    def batch():
        ids = torch.randint(5, 90, (4, 12), generator=g)
        mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 5, 7])[:, None]).long()
        chosen = (torch.rand(4, 12, generator=g) < 0.4) & (mask != 0)
        chosen[:, 1] = True  # every row has a compared position
        if head == "classification":
            labels = torch.tensor([0, 2, IGNORE_INDEX, 1])  # a transfer-set row: no gold label
        elif head == "regression":
            labels = torch.tensor([0.5, float("nan"), 1.0, -0.25])
        elif head == "tokens":
            tags = torch.randint(0, 3, (4, 12), generator=g)
            tags[2] = UNLABELLED  # a transfer-set sentence: its words are distilled, never scored on gold tags
            labels = torch.where(chosen, tags, torch.full_like(tags, IGNORE_INDEX))
        else:
            labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}

    def run(steps, name):
        torch.manual_seed(0)
        batches = [batch() for _ in range(steps)]
        cls, kwargs = {"classification": (BertForSequenceClassification, {"num_labels": 3}),
                       "regression": (BertForSequenceClassification, {"num_labels": 1}),
                       "tokens": (BertForTokenClassification, {"num_labels": 3}),
                       "mlm": (BertForMaskedLM, {})}[head]
        quiet = dict(vocab_size=90, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        teacher = cls(tiny_config(**quiet), **kwargs)
        student = cls(tiny_config(**quiet, num_hidden_layers=1, hidden_size=16, num_attention_heads=2), **kwargs)
        pairs = layer_map("uniform", 1, 2)
        model = DistillationStudent(student, pairs, teacher.config.hidden_size)  # 16 -> 32 projections
        task = DistillationTask(teacher, DistillConfig(alpha_logits=0.5, alpha_hidden=1.0), head, pairs)
        return lambda: train(model, task, batches, config(max_steps=steps, log_every=1000), tmp_path / name)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


def test_a_fine_tuning_run_reads_the_device_only_at_log_eval_and_save_steps(tmp_path, monkeypatch):
    # `bertkit.tasks.finetune` end to end (task files, features, EpochBatches with dynamic padding and bucketing, the
    # family's loss, BERT on the unpadded layout, dev evaluation and best-model saving at the epoch's end): one
    # epoch of 2 steps and one of 6 steps read the device equally often (the end's log line, evaluation, save).
    import random

    from bertkit import BertForPreTraining, WordPieceTokenizer
    from bertkit.tasks.finetune import FinetuneConfig, finetune
    from bertkit.models import layouts
    from conftest import tiny_config

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)  # the batch plays the device's
    words = "the film plot actor was very quite story scene music fun long short".split()
    rng = random.Random(0)

    def rows(n):
        out = []
        for i in range(n):
            text = [rng.choice(words) for _ in range(rng.randint(2, 9))] + ["good" if i % 2 else "bad"]
            out.append(f"{' '.join(text)},{'pos' if i % 2 else 'neg'}\n")
        return "text,label\n" + "".join(out)

    tokenizer = WordPieceTokenizer.train(texts=words + ["good bad"], vocab_size=60, min_frequency=1,
                                         show_progress=False)
    BertForPreTraining(tiny_config(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path / "model",
                                                                                     tokenizer=tokenizer)
    (tmp_path / "dev.csv").write_text(rows(8), encoding="utf-8")
    settings = FinetuneConfig(kind="classify", epochs=1, batch_size=4, log_every=1000, progress=False,
                              max_seq_length=16, bucket_window=2, device="cpu")

    def run(steps, name):
        (tmp_path / f"{name}.csv").write_text(rows(4 * steps), encoding="utf-8")
        return lambda: finetune("classify", tmp_path / "model", tmp_path / f"{name}.csv", tmp_path / "dev.csv",
                                tmp_path / name, settings)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


@pytest.mark.parametrize("head", ["tokens", "language-model"])
def test_task_losses_index_host_known_positions(tmp_path, monkeypatch, head):
    # NER's labelled tokens and the auxiliary language-model loss's real positions come from the host copies of
    # the labels and the attention mask (index_select), so a longer run reads the device no more often: indexing
    # with a mask computed on the device (logits[labels != -100]) would read it every step.
    from bertkit.models import IGNORE_INDEX, BertForSequenceClassification, BertForTokenClassification, layouts
    from bertkit.tasks.classify import SequenceClassificationTask
    from bertkit.tasks.ner import TokenClassificationTask
    from conftest import tiny_config

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)  # the batch plays the device's
    g = torch.Generator().manual_seed(0)

    def batch():
        ids = torch.randint(5, 90, (4, 12), generator=g)
        mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 5, 7])[:, None]).long()
        if head == "tokens":
            tags = torch.randint(0, 3, (4, 12), generator=g)
            labels = torch.where((torch.rand(4, 12, generator=g) < 0.5) & (mask != 0), tags,
                                 torch.full_like(tags, IGNORE_INDEX))
        else:
            labels = torch.randint(0, 2, (4,), generator=g)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}

    def run(steps, name):
        torch.manual_seed(0)
        batches = [batch() for _ in range(steps)]
        quiet = tiny_config(vocab_size=90, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            causal=head == "language-model")  # GPT-1's auxiliary loss needs a causal model
        if head == "tokens":
            model, task = BertForTokenClassification(quiet, num_labels=3), TokenClassificationTask()
        else:
            model = BertForSequenceClassification(quiet, num_labels=2)
            task = SequenceClassificationTask().with_language_model(0.5)
        return lambda: train(model, task, batches, config(max_steps=steps, log_every=1000), tmp_path / name)

    assert count_reads(run(2, "short"), monkeypatch) == count_reads(run(6, "long"), monkeypatch)


def test_the_counting_mode_counts_every_kind_of_device_read():
    # Each way of reading a device value on the host (or of waiting to learn a size from it) counts once; the same
    # operations on host tensors (the batch as the loader made it) count nothing.
    import numpy as np

    from device_reads import DeviceReads

    weight = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    reads = [lambda x: float(x.detach().sum()), lambda x: x.detach().sum().item(), lambda x: x.tolist(), lambda x: x.detach().numpy(),
             lambda x: x.detach().cpu(), lambda x: x.detach().to("cpu"), lambda x: x.to(device="cpu"),
             lambda x: np.asarray(x.detach()), lambda x: torch.equal(x, x), lambda x: torch.allclose(x, x),
             lambda x: torch.where(x > 0), lambda x: (x > 0).nonzero(), lambda x: x[x > 0],
             lambda x: bool((x > 0).any())]
    for read in reads:
        mode = DeviceReads()
        with mode:
            read(weight * 1.0)  # a value computed on the device
        assert mode.reads == 1, (read, mode.where)
        host = torch.tensor([0.5, -1.0, 2.0])
        with DeviceReads() as mode:
            read(host)
        assert mode.reads == 0, (read, mode.where)
    # Moves between device tensors (the optimizer's, `.to(x.device)`) and three-argument where are no reads
    with DeviceReads() as mode:
        x = weight * 1.0
        x.to(x.device), x.to(torch.float64), torch.where(x > 0, x, -x)
    assert mode.reads == 0, mode.where
