"""What the reliability tests share: a tiny prepared corpus, the command line of a tiny pretraining run, running
bertkit in a subprocess, and reading a run's per-step losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bertkit import WordPieceTokenizer
from bertkit.data.corpus import iter_lines
from bertkit.data.prepare import prepare

from conftest import synthetic_corpus


# A tiny model and budget: each step takes milliseconds on one thread.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_seq_length": 32, "max_predictions_per_seq": 5, "eval_instances": 16, "progress": False,
        "warmup_steps": 0, "warmup_ratio": 0.1, "batch_size": 8, "learning_rate": 2e-3, "eval_every": 0}


def make_prepared(root: Path, documents: int = 40, shard_tokens: int = 2 ** 24) -> Path:
    """root/corpus.txt, root/tok (a WordPiece vocabulary trained on it) and root/data (prepared, with an eval
    split from root/held_out.txt); returns root/data."""
    root.mkdir(parents=True, exist_ok=True)
    corpus = synthetic_corpus(root / "corpus.txt", documents)
    held_out = synthetic_corpus(root / "held_out.txt", documents=8, seed=1)
    tok = WordPieceTokenizer.train(iter_lines([corpus]), vocab_size=120, min_frequency=1, show_progress=False)
    tok.save(root / "tok")
    prepare([corpus], root / "tok", root / "data", eval_paths=[held_out], progress=False, shard_tokens=shard_tokens)
    return root / "data"


def tiny_overrides(**changes) -> dict:
    """`resolve_config("tiny", ...)` overrides of a tiny run."""
    values = dict(TINY)
    values.update(changes)
    return values


def pretrain_argv(data_dir: Path, run_dir: Path, *extra: str, **changes) -> list[str]:
    """`bertkit pretrain` arguments of a tiny run (`changes` override TINY's values)."""
    argv = ["pretrain", "--data", str(data_dir), "--out", str(run_dir), "--config", "tiny"]
    for key, value in tiny_overrides(**changes).items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv + list(extra)


def bertkit_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *argv]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")
    env.pop("BERTKIT_DEBUG", None)
    return env


def run_bertkit(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m bertkit.cli argv` to completion; stdout and stderr as text."""
    return subprocess.run(bertkit_command(*argv), env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


def losses(run_dir: Path, key: str = "loss") -> dict[int, float]:
    """step -> value of `key` in run_dir/metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in records if key in r}


def training_records(run_dir: Path) -> dict[int, dict]:
    """step -> the training line of metrics.jsonl without its timing fields (which no two runs share)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[record["step"]] = {k: v for k, v in record.items() if k not in ("tokens_per_s", "elapsed_s")}
    return out


def one_error_line(stderr: str) -> str:
    """The single `bertkit: error: ...` line of a failed command's stderr (asserting there is one, no traceback)."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("bertkit: error: ")]
    assert len(errors) == 1, stderr
    return errors[0]
