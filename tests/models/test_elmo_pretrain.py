"""ELMo pretraining through the command line: `bertkit tokenizer train --kind word`, `bertkit prepare`,
`bertkit pretrain --objective elmo`. Both directions' losses fall and are logged apart, held-out perplexities per
direction; carrying the state and resetting it are different runs, the carried state travelling with the
checkpoint (SIGKILL + `--resume` is tests/training/test_sigkill_families.py's; gloo processes
tests/training/test_pretrain_every_row.py's); the model directory reloads with identical features.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.data.lmstream import WordWindowStream

WORDS = "the a cat dog sat ran on under mat park big small red blue house river city old new".split()
TINY = ["--config", "elmo-mini", "--preset", "tiny", "--lstm-dim", "48", "--projection-dim", "16",
        "--max-seq-length", "9", "--batch-size", "4", "--log-every", "1", "--eval-every", "0", "--eval-instances",
        "8", "--learning-rate", "1e-2", "--warmup-steps", "2", "--progress", "false", "--sampled-softmax", "8"]


def corpus(path: Path) -> Path:
    rng = random.Random(0)
    # A learnable language: "the" starts every sentence, adjectives come before nouns.
    docs = ["\n".join("the " + " ".join(rng.choice(WORDS[2:]) for _ in range(rng.randint(3, 7))) + " ."
                      for _ in range(rng.randint(2, 5))) for _ in range(50)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("elmo_pretrain")
    text = corpus(root / "corpus.txt")
    assert main(["tokenizer", "train", "--kind", "word", "--files", str(text), "--vocab-size", "40",
                 "--out", str(root / "tok"), "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(text), "--tokenizer", str(root / "tok"), "--out", str(root / "data"),
                 "--eval-fraction", "0.2", "--quiet"]) == 0
    return root / "data"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(run: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["forward_loss"], r["backward_loss"]) for r in records(run) if "loss" in r}


def test_both_directions_learn_and_the_directory_reloads_identically(data, tmp_path):
    from bertkit.features import extract_features

    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--out", str(run), *TINY, "--max-steps", "40",
                 "--eval-instances", "16"]) == 0
    steps = losses(run)
    first, last = steps[1], steps[40]
    early = [sum(steps[s][d] for s in range(1, 6)) / 5 for d in (0, 1)]
    late = [sum(steps[s][d] for s in range(36, 41)) / 5 for d in (0, 1)]
    assert late[0] < early[0] - 0.5 and late[1] < early[1] - 0.5, (first, last)
    evals = [r for r in records(run) if "eval_forward_perplexity" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 40
    assert evals[-1]["eval_forward_perplexity"] < evals[0]["eval_forward_perplexity"]
    assert evals[-1]["eval_backward_perplexity"] < evals[0]["eval_backward_perplexity"]
    texts = ["the big cat sat on the mat .", "a zebra ran"]
    one, _ = extract_features(run / "model", texts, layers=[0, 1, 2], combine="none")
    two, tokens = extract_features(run / "model", texts, layers=[0, 1, 2], combine="none")
    assert all((a == b).all() for a, b in zip(one, two)) and tokens[1][2] == "zebra"  # unseen words keep spelling


def test_carried_state_and_reset_state_are_different_runs(data, tmp_path):
    runs = {}
    for mode in ("carry", "reset"):
        assert main(["pretrain", "--data", str(data), "--out", str(tmp_path / mode), *TINY, "--max-steps", "4",
                     "--eval-instances", "0", "--lstm-state", mode]) == 0
        runs[mode] = losses(tmp_path / mode)
    assert runs["carry"][1] == runs["reset"][1]  # the first batch starts from zeros either way
    assert runs["carry"][2][0] != runs["reset"][2][0]  # then the forward LSTMs start from the carried state
    state = torch.load(sorted((tmp_path / "carry" / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
    assert len(state["data"]["carried"]["h"]) == 2  # one state per layer travels with the data position
    reset = torch.load(sorted((tmp_path / "reset" / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
    assert "carried" not in reset["data"]


def test_word_windows_continue_each_lane():
    class Docs:
        def __init__(self, sentences):
            self.sentences = sentences

        def __len__(self):
            return len(self.sentences)

        def document(self, i):
            return [self.sentences[i]], None

    import numpy as np

    docs = Docs([np.arange(10, 10 + n) for n in (5, 7, 3, 9)])
    stream = WordWindowStream(docs, 1, 2, window=3, micro_batch_size=2, shuffle=False)
    lanes = stream.lanes(0)
    assert lanes.shape == (2, 16) and lanes[0, 0] == 1 and lanes[0, 6] == 2  # <s> w*5 </s>
    batches = []
    for batch in stream:
        batches.append(batch["input_ids"])
        if len(batches) == 5:
            break
    assert batches[0].tolist() == lanes[:, 0:4].tolist() and batches[1].tolist() == lanes[:, 3:7].tolist()
    assert batches[4][0].tolist() == stream.lanes(1)[0, 0:4].tolist() or stream.windows_per_epoch() == 5
    resumed = WordWindowStream(docs, 1, 2, window=3, micro_batch_size=2, shuffle=False)
    resumed.load_state_dict({"epoch": 0, "window": 2})
    assert next(iter(resumed))["input_ids"].tolist() == batches[2].tolist()


def test_elmo_needs_a_word_tokenizer_and_its_own_objective(data, tmp_path, capsys):
    from bertkit.training.pretrain import resolve_config

    text = corpus(tmp_path / "corpus.txt")
    assert main(["tokenizer", "train", "--files", str(text), "--vocab-size", "60", "--min-frequency", "1",
                 "--out", str(tmp_path / "wp"), "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(text), "--tokenizer", str(tmp_path / "wp"), "--out",
                 str(tmp_path / "wpdata"), "--quiet"]) == 0
    assert main(["pretrain", "--data", str(tmp_path / "wpdata"), "--out", str(tmp_path / "x"), *TINY,
                 "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "prepare the corpus with a word tokenizer" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="the elmo objective"):
        resolve_config("elmo-mini", {"objective": "roberta"})
