"""`bertkit pretrain --objective xlnet` through the command line: the permutation-LM loss falls on a tiny corpus;
shards without <cls>/<sep> are refused by name. Gloo processes and SIGKILL + --resume (its memory carried by the
checkpoint): tests/training/test_pretrain_every_row.py, as for every row of the objective table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.cli import main

from training.test_sigkill_families import corpus, losses

TINY = ["--config", "xlnet-mini", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--d-inner", "48",
        "--max-seq-length", "32", "--reuse-len", "8", "--mem-len", "16", "--max-predictions-per-seq", "5",
        "--batch-size", "4", "--log-every", "1", "--eval-every", "0", "--eval-instances", "8", "--progress", "false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("xlnet-data")
    text = corpus(root / "corpus.txt")
    assert main(["tokenizer", "train", "--kind", "unigram", "--xlnet", "--vocab-size", "120", "--files", str(text),
                 "--out", str(root / "tok"), "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(text), "--tokenizer", str(root / "tok"), "--out", str(root / "data"),
                 "--eval-fraction", "0.1", "--quiet"]) == 0
    return root / "data"


def test_permutation_lm_loss_falls(data, tmp_path):
    assert main(["pretrain", "--data", str(data), "--out", str(tmp_path / "run"), *TINY, "--max-steps", "40",
                 "--learning-rate", "3e-3", "--save-every", "100"]) == 0
    steps = losses(tmp_path / "run")
    first, last = [steps[s] for s in range(1, 6)], [steps[s] for s in range(36, 41)]
    assert sum(last) / 5 < sum(first) / 5 - 0.5
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["model_type"] == "xlnet" and config["architectures"] == ["XLNetLMHeadModel"]
    assert config["reuse_len"] == 8 and config["mem_len"] == 16


def test_shards_without_cls_are_refused_naming_the_tokenizer(tmp_path, capsys):
    text = corpus(tmp_path / "corpus.txt")
    assert main(["tokenizer", "train", "--kind", "unigram", "--vocab-size", "220", "--files", str(text),
                 "--out", str(tmp_path / "t5tok"), "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(text), "--tokenizer", str(tmp_path / "t5tok"), "--out",
                 str(tmp_path / "data"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["pretrain", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), *TINY,
                 "--max-steps", "2"]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path / "data") in err and "<cls>" in err and "--xlnet" in err


def test_the_xlnet_base_recipe_has_the_papers_settings():
    from bertkit.config import XLNetConfig
    from bertkit.training.pretrain import resolve_config

    config = resolve_config("xlnet-base")
    model = XLNetConfig.preset(config.preset, **{k: v for k, v in config.model.items() if k != "model_type"})
    assert (model.n_layer, model.d_model, model.n_head, model.d_inner) == (12, 768, 12, 3072)
    assert (model.mem_len, model.reuse_len) == (384, 256)
    d, t = config.data, config.train
    assert (d.objective, d.max_seq_length, d.max_predictions_per_seq, d.partial_k) == ("xlnet", 512, 85, 7)
    assert d.batch_size * t.grad_accumulation == 256
    assert (t.learning_rate, t.warmup_steps, t.adam_epsilon, t.weight_decay) == (4e-4, 40000, 1e-6, 0.01)


def test_xlnet_objective_and_architecture_go_together(tmp_path, capsys):
    from bertkit.training.pretrain import resolve_config

    with pytest.raises(ValueError, match="xlnet objective"):
        resolve_config("xlnet-mini", {"objective": "roberta"})
    from bertkit.training.pretrain import stream_options

    config = resolve_config("xlnet-mini", {"model.mem_len": 0})
    with pytest.raises(ValueError, match="mem_len 0 with reuse_len 32: the memory would grow"):
        stream_options(config.data, None, "tok", config.model)
    with pytest.raises(ValueError, match="reuse_len 40 does not fit"):
        from bertkit.data.loader import StreamOptions

        StreamOptions(instances="xlnet", max_seq_length=44, reuse_len=40)
