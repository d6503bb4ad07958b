"""Pretraining end to end on a tiny synthetic corpus: the loss falls, a killed run resumes exactly, and two
gloo processes train exactly like one process with the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertkit import WordPieceTokenizer
from conftest import kill_after_checkpoint, synthetic_corpus
from bertkit.data.corpus import iter_lines
from bertkit.data.prepare import prepare
from bertkit.models.registry import ARCHITECTURES
from bertkit.training.pretrain import PretrainConfig, pretrain, resolve_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pretrain")
    corpus = synthetic_corpus(root / "corpus.txt")
    held_out = synthetic_corpus(root / "held_out.txt", documents=8, seed=1)
    tok = WordPieceTokenizer.train(iter_lines([corpus]), vocab_size=120, min_frequency=1, show_progress=False)
    tok.save(root / "tok")
    prepare([corpus], root / "tok", root / "data", eval_paths=[held_out], progress=False)
    return root / "data"


TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_seq_length": 32, "max_predictions_per_seq": 5, "eval_instances": 32, "progress": False,
        "warmup_steps": 0, "warmup_ratio": 0.1}


def tiny_config(**overrides) -> PretrainConfig:
    values = dict(TINY)
    values.update(overrides)
    return resolve_config("tiny", values)


def losses(run_dir: Path, key: str = "loss") -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in records if key in r}


def test_loss_falls_and_model_directory_is_written(data_dir, tmp_path):
    config = tiny_config(max_steps=60, batch_size=16, learning_rate=3e-3, log_every=1, save_every=30,
                         eval_every=0)
    result = pretrain(data_dir, tmp_path / "run", config, eval_at_start=True)
    curve = losses(tmp_path / "run")
    first = np.mean([curve[s] for s in range(1, 11)])
    last = np.mean([curve[s] for s in range(51, 61)])
    assert last < first - 0.5, (first, last)
    evals = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "eval_mlm_accuracy" in l]
    assert len(evals) == 2 and evals[0]["step"] == 0 and evals[1]["step"] == 60
    assert evals[1]["eval_mlm_accuracy"] > evals[0]["eval_mlm_accuracy"]
    assert result.step == 60 and result.stopped_by == "max_steps"
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000030.pt",
                                                                                  "step-00000060.pt"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "run" / "model"))
    assert hf.config.hidden_size == 32


def _cli(*args: str, env: dict | None = None) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *args]


def _pretrain_args(data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    args = ["pretrain", "--data", str(data_dir), "--out", str(run_dir), "--config", "tiny"]
    for key, value in TINY.items():
        args += [f"--{key}", str(value)]
    return args + ["--log-every", "1", "--eval-every", "0", "--learning-rate", "2e-3", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    return env


def test_sigkilled_run_resumes_bit_identically(data_dir, tmp_path):
    steps = ["--max-steps", "30", "--save-every", "3", "--batch-size", "8"]
    full = tmp_path / "full"
    subprocess.run(_cli(*_pretrain_args(data_dir, full, *steps)), check=True, env=_env(), capture_output=True)
    killed = tmp_path / "killed"
    kill_after_checkpoint(_cli(*_pretrain_args(data_dir, killed, *steps)), killed, _env(), timeout=120)
    done = losses(killed)
    assert max(done) < 30, "the run finished before the kill; nothing was tested"
    subprocess.run(_cli(*_pretrain_args(data_dir, killed, *steps, "--resume")), check=True, env=_env(),
                   capture_output=True)
    assert losses(killed) == losses(full)  # every step, bit for bit
    assert len(losses(full)) == 30


@pytest.mark.parametrize("processes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_gloo_processes_equal_one_process(data_dir, tmp_path, processes):
    common = ["--max-steps", "6", "--save-every", "100", "--hidden-dropout-prob", "0",
              "--attention-probs-dropout-prob", "0"]
    one = tmp_path / "one"
    subprocess.run(_cli(*_pretrain_args(data_dir, one, *common, "--batch-size", "8")), check=True, env=_env(),
                   capture_output=True)
    two = tmp_path / "two"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                "-m", "bertkit.cli", *_pretrain_args(data_dir, two, *common, "--batch-size", str(8 // processes))]
    proc = subprocess.run(torchrun, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = (two / "config.yaml").read_text()
    assert f"world_size: {processes}" in config and "global_batch_size: 8" in config
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    for key in ("mlm_accuracy", "nsp_accuracy"):
        assert losses(one, key) == pytest.approx(losses(two, key), abs=1e-9)


def test_isolated_documents_train_through_the_cli(data_dir, tmp_path):
    """`--isolate-documents true`: packed FULL-SENTENCES rows with document-numbered attention masks train end to
    end (loss falls), the run records the option, and the model directory loads in transformers."""
    run = tmp_path / "run"
    args = _pretrain_args(data_dir, run, "--objective", "roberta", "--isolate-documents", "true", "--max-steps",
                          "60", "--batch-size", "16", "--learning-rate", "3e-3", "--save-every", "100")
    proc = subprocess.run(_cli(*args), env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "isolate_documents: true" in (run / "config.yaml").read_text()
    curve = losses(run)
    first = np.mean([curve[s] for s in range(1, 11)])
    last = np.mean([curve[s] for s in range(51, 61)])
    assert last < first - 0.5, (first, last)
    transformers = pytest.importorskip("transformers")
    assert transformers.BertForMaskedLM.from_pretrained(str(run / "model")).config.hidden_size == 32


# The BERT-family objectives on these shards with worker processes (every row of the objective table on 1, 2 and 4
# gloo processes and killed without workers: tests/training/test_pretrain_every_row.py), with the options that pick its rows.
OBJECTIVE_ARGS = {
    "albert": ["--objective", "albert"],
    "roberta": ["--objective", "roberta"],
    "roberta-isolated": ["--objective", "roberta", "--isolate-documents", "true"],
    "roberta-doc": ["--objective", "roberta-doc"],
    "roberta-sentence-pair": ["--objective", "roberta-sentence-pair"],
    "electra": ["--objective", "electra", "--model-type", "electra"],
    "causal": ["--objective", "causal", "--causal", "true"],
}


@pytest.mark.slow  # a full run and a killed one per objective, with worker processes
@pytest.mark.parametrize("objective", list(OBJECTIVE_ARGS))
def test_every_objective_sigkilled_with_workers_resumes_bit_identically(data_dir, tmp_path, objective):
    steps = [*OBJECTIVE_ARGS[objective], "--max-steps", "16", "--save-every", "3", "--batch-size", "8",
             "--workers", "2"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_cli(*_pretrain_args(data_dir, full, *steps)), check=True, env=_env(), capture_output=True)
    kill_after_checkpoint(_cli(*_pretrain_args(data_dir, killed, *steps)), killed, _env(), timeout=180)
    assert max(losses(killed)) < 16, "the run finished before the kill; nothing was tested"
    subprocess.run(_cli(*_pretrain_args(data_dir, killed, *steps, "--resume")), check=True, env=_env(),
                   capture_output=True)
    assert losses(killed) == losses(full) and len(losses(full)) == 16


def test_electra_resumed_from_a_checkpoint_repeats_the_run(data_dir, tmp_path):
    """ELECTRA's samples depend on (seed, step, row) only: resuming from step 3 repeats steps 4-6 bit for bit
    (the generator's draws included; the global RNG is no longer part of them)."""
    config = tiny_config(objective="electra", model_type="electra", max_steps=6, batch_size=8, log_every=1,
                         save_every=3, eval_every=0)
    full = tmp_path / "full"
    pretrain(data_dir, full, config, eval_at_start=False)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    (resumed / "checkpoints" / "step-00000006.pt").unlink()  # as if killed between steps 3 and 6
    pretrain(data_dir, resumed, config, resume=True, eval_at_start=False)
    assert sorted(losses(full)) == list(range(1, 7))
    for key in ("loss", "rtd_bce", "replaced_fraction"):
        assert len(losses(full, key)) == 6 and losses(resumed, key) == losses(full, key), key


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_init_writes_every_architecture_of_the_table(model_type, tiny_vocab_dir, tmp_path):
    """`bertkit init --model-type X` for every row of the architecture table: the directory reads back as that
    architecture's pretraining model, with the tokenizer's vocabulary and padding id."""
    from bertkit.cli import main
    from bertkit.models import ModelDir, pretraining_class
    from bertkit.models.registry import architecture
    from bertkit.tokenizers import WordTokenizer, load_tokenizer

    row = architecture(model_type)
    tokenizer_dir = tiny_vocab_dir
    if row.positions == "none":  # ELMo reads words and their characters
        tokenizer_dir = tmp_path / "words"
        WordTokenizer.train(["the cat sat on the mat", "a dog ran"], vocab_size=20, show_progress=False).save(
            tokenizer_dir)
    preset = "tiny" if "tiny" in row.presets else next(iter(row.presets))
    assert main(["init", "--model-type", model_type, "--tokenizer", str(tokenizer_dir), "--preset", preset,
                 "--out", str(tmp_path / "model")]) == 0
    model_dir = ModelDir.open(tmp_path / "model")
    tokenizer = load_tokenizer(tokenizer_dir)
    assert model_dir.config.model_type == row.model_type and model_dir.config.vocab_size == tokenizer.vocab_size
    for name, value in row.config_fields.items():
        assert getattr(model_dir.config, name) == value
    assert model_dir.config.pad_token_id == tokenizer.pad_id
    assert pretraining_class(model_dir.config).__name__ == row.roles[row.pretraining_role]
    encoder = model_dir.load("encoder")  # the weights read back whole
    assert sum(p.numel() for p in encoder.parameters()) > 0
