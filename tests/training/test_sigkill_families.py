"""SIGKILL at an arbitrary moment, then `--resume`: every family's pretraining logs the per-step losses of the run
that was never interrupted, bit for bit on CPU (ModernBERT with packed documents, T5 with span corruption, ELMo with
its LSTM state carried across batches).

BERT's own kill test is in tests/training/test_pretrain.py; this one drives the other recipes through the same command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.cli import main
from conftest import kill_after_checkpoint
from training.objective_rows import corpus  # the same tiny corpus as every row of the objective table

TINY = {
    "modernbert-mini": ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
                        "--intermediate-size", "48", "--local-attention", "8", "--max-seq-length", "32",
                        "--isolate-documents", "true"],
    "t5-mini": ["--d-model", "32", "--d-kv", "8", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
                "--max-seq-length", "32", "--dropout-rate", "0.1"],
    # ELMo: the forward LSTMs' carried state and the sampled softmax's draws must come back too
    "elmo-mini": ["--preset", "tiny", "--lstm-dim", "48", "--projection-dim", "16", "--max-seq-length", "9",
                  "--sampled-softmax", "8"],
}
KINDS = {"modernbert-mini": ["--kind", "wordpiece", "--vocab-size", "120", "--min-frequency", "1"],
         "t5-mini": ["--kind", "unigram", "--vocab-size", "220", "--extra-ids", "100"],
         "elmo-mini": ["--kind", "word", "--vocab-size", "40"]}
STEPS = ["--max-steps", "24", "--save-every", "3", "--batch-size", "8", "--log-every", "1", "--eval-every", "0",
         "--eval-instances", "8", "--learning-rate", "2e-3", "--progress", "false"]


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *map(str, args)]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def full_and_killed(args: list, tmp_path: Path, steps: int = 24) -> tuple[Path, Path]:
    """Run `bertkit *args` to its end in tmp_path/full, and again in tmp_path/killed, SIGKILLed at an arbitrary
    moment after its step-6 checkpoint (before its last step); returns both run directories."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(cli(*args, "--out", full), check=True, env=env(), capture_output=True)
    kill_after_checkpoint(cli(*args, "--out", killed), killed, env())
    assert max(losses(killed)) < steps, "the run finished before the kill; nothing was tested"
    return full, killed


@pytest.mark.parametrize("recipe", ["modernbert-mini", "t5-mini", "elmo-mini"])
def test_sigkilled_family_run_resumes_bit_identically(recipe, tmp_path):
    text = corpus(tmp_path / "corpus.txt")
    assert main(["tokenizer", "train", "--files", str(text), *KINDS[recipe], "--out", str(tmp_path / "tok"),
                 "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(text), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "data"), "--eval-fraction", "0.1", "--quiet"]) == 0
    args = ["pretrain", "--data", tmp_path / "data", "--config", recipe, *TINY[recipe], *STEPS]
    full, killed = full_and_killed(args, tmp_path)
    subprocess.run(cli(*args, "--out", killed, "--resume"), check=True, env=env(), capture_output=True)
    assert losses(killed) == losses(full) and sorted(losses(full)) == list(range(1, 25))
