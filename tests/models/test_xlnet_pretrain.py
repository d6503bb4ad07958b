"""`bertkit pretrain --objective xlnet` through the command line: the permutation-LM loss falls on a tiny corpus; a
run SIGKILLed at an arbitrary moment and resumed logs the per-step losses of the run that was never interrupted,
bit for bit, its memory included (the checkpoint carries it); shards without <cls>/<sep> are refused by name."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from bertkit.cli import main

from test_sigkill_families import cli, corpus, env, full_and_killed, losses

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


def test_sigkilled_xlnet_run_resumes_bit_identically_with_its_memory(data, tmp_path):
    args = ["pretrain", "--data", data, *TINY, "--max-steps", "24", "--save-every", "3", "--learning-rate", "2e-3"]
    full, killed = full_and_killed(args, tmp_path)
    state = torch.load(full / "checkpoints" / "step-00000024.pt", weights_only=True)
    mems = state["data"]["mems"]  # the memory rides with the data position: one (B, M, H) tensor per layer
    assert len(mems) == 2 and tuple(mems[0].shape[::2]) == (4, 32) and 8 <= mems[0].shape[1] <= 16
    subprocess.run(cli(*args, "--out", killed, "--resume"), check=True, env=env(), capture_output=True)
    assert losses(killed) == losses(full) and sorted(losses(full)) == list(range(1, 25))


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
    from bertkit.pretrain import resolve_config

    config = resolve_config("xlnet-base")
    model = XLNetConfig.preset(config.preset, **{k: v for k, v in config.model.items() if k != "model_type"})
    assert (model.n_layer, model.d_model, model.n_head, model.d_inner) == (12, 768, 12, 3072)
    assert (model.mem_len, model.reuse_len) == (384, 256)
    d, t = config.data, config.train
    assert (d.objective, d.max_seq_length, d.max_predictions_per_seq, d.partial_k) == ("xlnet", 512, 85, 7)
    assert d.batch_size * t.grad_accumulation == 256
    assert (t.learning_rate, t.warmup_steps, t.adam_epsilon, t.weight_decay) == (4e-4, 40000, 1e-6, 0.01)


def test_xlnet_objective_and_architecture_go_together(tmp_path, capsys):
    from bertkit.pretrain import resolve_config

    with pytest.raises(ValueError, match="xlnet objective"):
        resolve_config("xlnet-mini", {"objective": "roberta"})
    from bertkit.pretrain import stream_options

    config = resolve_config("xlnet-mini", {"model.mem_len": 0})
    with pytest.raises(ValueError, match="mem_len 0 with reuse_len 32: the memory would grow"):
        stream_options(config.data, None, "tok", config.model)
    with pytest.raises(ValueError, match="reuse_len 40 does not fit"):
        from bertkit.data.loader import StreamOptions

        StreamOptions(instances="xlnet", max_seq_length=44, reuse_len=40)


# Four processes: five process start-ups and a gloo rendezvous, a minute or more on a 2-core machine
@pytest.mark.slow  # three process start-ups and a gloo rendezvous
@pytest.mark.parametrize("processes", [2, 4])
def test_gloo_processes_equal_one_process(data, tmp_path, processes):
    """Each rank reads its own rows of every group of segments and keeps their memory: 2 (4) processes with half
    (a quarter of) the batch log the losses of 1 process (no dropout, so the random streams of the ranks do not
    matter)."""
    import sys

    def command(run: Path, batch: str) -> list[str]:
        return ["pretrain", "--data", str(data), "--out", str(run), *TINY, "--batch-size", batch, "--dropout", "0",
                "--max-steps", "4", "--save-every", "100"]

    environ = {**env(), "PYTHONHASHSEED": "0"}
    one = subprocess.run([sys.executable, "-m", "bertkit.cli", *command(tmp_path / "one", "4")], env=environ,
                         capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(processes), "-m", "bertkit.cli", *command(tmp_path / "two", str(4 // processes))],
                         env=environ, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "global_batch_size: 4" in (tmp_path / "two" / "config.yaml").read_text()
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
