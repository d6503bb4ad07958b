"""bertkit.pipeline: the one-command run, end to end on a tiny corpus with a training budget of a few seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertkit.checkpoint import CONFIG_NAME, WEIGHTS_NAME
from bertkit.pipeline import run_pipeline

WORDS = ("the cat dog bird sat ran on under a mat log tree big small red blue quickly slowly and then it was "
         "very happy sad home park river day night").split()


def tiny_corpus(path, documents: int = 400, seed: int = 0):
    """Google-format text: one sentence per line, a blank line between documents."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(documents):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
                     for _ in range(rng.randint(2, 4))]
        blocks.append("\n".join(sentences))
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    corpus = tiny_corpus(root / "corpus.txt")
    out = root / "out"
    report = run_pipeline(out, corpus=[str(corpus)], preset="tiny", vocab_size=120, probes=["the [MASK] sat."],
                          progress=False, train_seconds=3.0)
    return out, report


def test_every_stage_writes_its_files(pipeline_run):
    out, report = pipeline_run
    assert (out / "tokenizer" / "vocab.txt").is_file()
    assert (out / "data" / "manifest.json").is_file()
    model = out / "run" / "model"
    assert (model / CONFIG_NAME).is_file() and (model / WEIGHTS_NAME).is_file() and (model / "vocab.txt").is_file()
    assert (out / "run" / "metrics.jsonl").is_file() and (out / "run" / "config.yaml").is_file()
    assert json.loads((out / "report.json").read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    assert report["plots"] and all(Path(p).is_file() and p.endswith(".png") for p in report["plots"])


def test_report_fields(pipeline_run):
    out, report = pipeline_run
    assert set(report) == {"corpus", "tokens", "vocab_size", "steps", "train_tokens", "tokens_per_s",
                           "mlm_accuracy_before", "mlm_accuracy_after", "nsp_accuracy_after", "fill_mask", "plots",
                           "model", "minutes"}
    manifest = json.loads((out / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert report["tokens"] == manifest["splits"]["train"]["tokens"] > 0
    assert manifest["splits"]["eval"]["documents"] >= 2  # 2% held out: enough for the NSP evaluation
    assert report["vocab_size"] <= 120
    assert report["steps"] >= 1 and report["train_tokens"] > 0 and report["tokens_per_s"] > 0
    for key in ("mlm_accuracy_before", "mlm_accuracy_after", "nsp_accuracy_after"):
        assert 0.0 <= report[key] <= 1.0
    (probe, candidates), = report["fill_mask"].items()
    assert probe == "the [MASK] sat." and len(candidates) == 5
    assert all(isinstance(token, str) and 0.0 <= p <= 1.0 for token, p in candidates)
    result = json.loads((out / "run" / "result.json").read_text(encoding="utf-8"))
    assert result["step"] == report["steps"] and result["stopped_by"] == "max_time"
