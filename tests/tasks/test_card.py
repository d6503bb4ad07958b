"""Result cards: seeds and a learning-rate grid through the CLI, statistics recomputed from every run's own
results.json, merged tables, confusion matrices and extra evaluation files, and `init --like`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_finetune import classify_rows, write_csv

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.tasks.card import (PAPER_LR_GRID, card_from_runs, find_runs, merge_cards, parse_grid, parse_seeds, read_card,
                          summarize)
from bertkit.cli import main
from bertkit.tasks.metrics import confusion_matrix

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = ["--epochs", "4", "--batch-size", "8", "--lr", "3e-3", "--max-seq-length", "24", "--dropout", "0", "--quiet"]


def run_cli(argv: list[str], capsys) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("card")
    texts = [row.split(",")[0] for row in classify_rows(40, 0)]
    tokenizer = WordPieceTokenizer.train(texts=texts, vocab_size=100, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, initializer_range=0.1)
    BertForPreTraining(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return {"root": root, "model": root / "model", "train": write_csv(root / "train.csv", classify_rows(48, 1)),
            "dev": write_csv(root / "dev.csv", classify_rows(16, 2)),
            "test": write_csv(root / "test.csv", classify_rows(20, 3))}


@pytest.fixture(scope="module")
def sweep(task, tmp_path_factory) -> Path:
    """Five seeds through the CLI, with an extra evaluation file."""
    out = tmp_path_factory.mktemp("sweep") / "five"
    code = main(["finetune", "classify", "--model", str(task["model"]), "--train", str(task["train"]), "--dev",
                 str(task["dev"]), "--eval-file", str(task["test"]), "--out", str(out), "--seeds", "1-5",
                 "--name", "tiny", *FAST])
    assert code == 0
    return out


# ------------------------------------------------------------------------------------------------------------------
# Parsing and statistics
# ------------------------------------------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True))
def test_seed_lists_parse_back(seeds):
    assert parse_seeds(",".join(map(str, seeds))) == seeds


def test_seed_ranges_grids_and_bad_input():
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5] and parse_seeds("1-3, 7") == [1, 2, 3, 7]
    assert parse_grid(None) == parse_grid("paper") == [2e-5, 3e-5, 5e-5] == list(PAPER_LR_GRID)
    assert parse_grid("1e-4,3e-4") == [1e-4, 3e-4]
    for bad in ("", "1,x", "5-1", "1,1", "-2"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)
    for bad in ("0", "1e-4,abc", "1e-4,1e-4", "nan"):
        with pytest.raises(ValueError, match="--lr-grid"):
            parse_grid(bad)


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=12))
def test_summary_statistics(values):
    s = summarize(values)
    x = np.array(values)
    assert s["n"] == len(values) and s["median"] == pytest.approx(statistics.median(values), abs=1e-12)
    assert s["mean"] == pytest.approx(float(np.mean(x))) and (s["min"], s["max"]) == (min(values), max(values))
    if len(values) > 1:  # statistics' "inclusive" quantiles are numpy's linear ones
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        assert (s["q1"], s["q3"]) == (pytest.approx(q1, abs=1e-12), pytest.approx(q3, abs=1e-12))
        assert s["std"] == pytest.approx(statistics.stdev(values), abs=1e-12)
    assert s["iqr"] == pytest.approx(s["q3"] - s["q1"]) and s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]


def test_confusion_matrix_rows_are_gold():
    import sklearn.metrics

    gold, predicted = [0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 2, 0]
    assert confusion_matrix(predicted, gold, 3) == sklearn.metrics.confusion_matrix(gold, predicted).tolist()
    assert confusion_matrix(predicted, gold, 3) == [[1, 1, 0], [0, 2, 1], [1, 0, 0]]
    with pytest.raises(ValueError):
        confusion_matrix([0, 3], [0, 1], 3)


# ------------------------------------------------------------------------------------------------------------------
# A five-seed card through the CLI
# ------------------------------------------------------------------------------------------------------------------
def test_five_seed_card_equals_its_runs(sweep):
    card = json.loads((sweep / "card.json").read_text())
    runs = sorted(sweep.glob("seed*/results.json"))
    assert [p.parent.name for p in runs] == [f"seed{s}" for s in range(1, 6)] and card["runs"] == 5
    results = [json.loads(p.read_text()) for p in runs]
    assert [r["config"]["seed"] for r in results] == [1, 2, 3, 4, 5]
    for key, stats in card["stats"].items():  # accuracy, macro_f1, test/accuracy, test/macro_f1
        file, _, metric = key.rpartition("/")
        values = [r["eval_files"][file][metric] if file else r["best"][metric] for r in results]
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        assert stats["median"] == pytest.approx(median, abs=1e-12) == statistics.median(values)
        assert stats["iqr"] == pytest.approx(q3 - q1, abs=1e-12)
        assert (stats["min"], stats["max"], stats["mean"]) == (min(values), max(values), pytest.approx(np.mean(values)))
    assert set(card["stats"]) == {"accuracy", "macro_f1", "test/accuracy", "test/macro_f1"}
    tokens = [r["train_tokens_per_s"] for r in results]
    assert card["throughput"]["train_tokens_per_s"]["median"] == pytest.approx(statistics.median(tokens))
    assert card["wall_seconds"] == pytest.approx(sum(r["wall_seconds"] for r in results))
    assert card["chosen"]["learning_rate"] == 3e-3 and card["stats"]["accuracy"]["median"] >= 0.75  # it learns
    for name in ("card.md", "card.png", "confusion_matrix.png", "seed3/confusion_matrix.png"):
        assert (sweep / name).is_file(), name
    assert "| accuracy |" in (sweep / "card.md").read_text()


def test_confusion_matrices_and_extra_file(sweep, task):
    results = json.loads((sweep / "seed2" / "results.json").read_text())
    cm = results["confusion_matrix"]
    gold = [line.rsplit(",", 1)[1] for line in task["dev"].read_text().splitlines()[1:]]
    predicted = (sweep / "seed2" / "dev_predictions.txt").read_text().split()
    labels = cm["labels"]
    assert cm["dev"] == confusion_matrix([labels.index(p) for p in predicted], [labels.index(g) for g in gold], 2)
    assert json.loads((sweep / "seed2" / "confusion_matrix.json").read_text()) == cm
    assert sum(map(sum, cm["test"])) == 20 and results["eval_files"]["test"]["accuracy"] == pytest.approx(
        (cm["test"][0][0] + cm["test"][1][1]) / 20)
    card = json.loads((sweep / "card.json").read_text())
    pooled = np.sum([json.loads((sweep / f"seed{s}" / "results.json").read_text())["confusion_matrix"]["test"]
                     for s in range(1, 6)], axis=0)
    assert card["confusion_matrix"]["test"] == pooled.tolist() and card["confusion_matrix"]["runs"] == 5


def test_card_is_rebuilt_from_the_run_directories(sweep):
    card = json.loads((sweep / "card.json").read_text())
    again = card_from_runs(find_runs(sweep), root=sweep, name="tiny")
    assert json.loads(json.dumps(again)) == card


def test_sweep_continues_without_rerunning(sweep, task, capsys):
    before = {p: p.stat().st_mtime_ns for p in sweep.glob("seed*/results.json")}
    run_cli(["finetune", "classify", "--model", task["model"], "--train", task["train"], "--dev", task["dev"],
             "--eval-file", task["test"], "--out", sweep, "--seeds", "1-5", "--name", "tiny", *FAST], capsys)
    assert {p: p.stat().st_mtime_ns for p in sweep.glob("seed*/results.json")} == before
    other = [str(a) for a in ["finetune", "classify", "--model", task["model"], "--train", task["train"], "--dev",
                              task["dev"], "--out", sweep, "--seeds", "1-5", *FAST[:-3], "--dropout", "0.2", "--quiet"]]
    assert main(other) == 2  # another setting does not reuse these runs
    assert "dropout 0.0, not 0.2" in capsys.readouterr().err


def test_learning_rate_grid_and_merged_table(sweep, task, tmp_path, capsys):
    grid = tmp_path / "grid"
    out = run_cli(["finetune", "classify", "--model", task["model"], "--train", task["train"], "--dev", task["dev"],
                   "--out", grid, "--seeds", "1,2", "--lr-grid", "1e-5,3e-3", *FAST[:4], *FAST[6:]], capsys)
    assert "Chosen: learning rate" in out
    card = json.loads((grid / "card.json").read_text())
    assert sorted(p.parent.relative_to(grid).as_posix() for p in grid.glob("*/*/results.json")) == [
        "lr0.003/seed1", "lr0.003/seed2", "lr1e-05/seed1", "lr1e-05/seed2"]
    medians = {s["learning_rate"]: s["stats"]["accuracy"]["median"] for s in card["settings"]}
    assert card["chosen"]["learning_rate"] == max(medians, key=medians.get)
    assert card["stats"] == next(s["stats"] for s in card["settings"]
                                 if s["learning_rate"] == card["chosen"]["learning_rate"])

    table_dir = tmp_path / "table"
    printed = run_cli(["card", sweep, f"grid={grid}", "--out", table_dir], capsys)
    table = json.loads((table_dir / "card.json").read_text())
    assert table["rows"] == ["tiny", "grid"] and (table_dir / "card.png").is_file() and "| tiny |" in printed
    assert table["columns"] == ["classify: accuracy", "classify (test): accuracy"]
    assert table["cells"]["tiny"]["classify: accuracy"] == read_card(sweep)["stats"]["accuracy"]
    assert "classify (test): accuracy" not in table["cells"]["grid"]  # the grid had no extra file
    assert merge_cards([read_card(sweep)], metrics=["macro_f1"])["columns"] == ["classify: macro_f1"]


def test_bad_card_input_is_one_line(tmp_path, task, capsys):
    assert main(["card", str(tmp_path / "nothing")]) == 2
    assert "nothing" in capsys.readouterr().err
    assert main(["finetune", "classify", "--model", str(task["model"]), "--train", str(task["train"]), "--dev",
                 str(task["dev"]), "--out", str(tmp_path / "x"), "--seeds", "1,a"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["finetune", "classify", "--model", str(task["model"]), "--train", str(task["train"]), "--dev",
                 str(task["dev"]), "--out", str(tmp_path / "y"), "--eval-file", str(tmp_path / "absent.csv")]) == 2
    assert "absent.csv" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# init --like: the same architecture, fresh weights
# ------------------------------------------------------------------------------------------------------------------
def test_init_like_copies_the_architecture(task, tmp_path, capsys):
    from safetensors.torch import load_file

    run_cli(["init", "--like", task["model"], "--seed", "3", "--out", tmp_path / "a"], capsys)
    run_cli(["init", "--like", task["model"], "--seed", "3", "--out", tmp_path / "b"], capsys)
    source = json.loads((task["model"] / "config.json").read_text())
    copy = json.loads((tmp_path / "a" / "config.json").read_text())
    assert {k: v for k, v in copy.items() if k != "transformers_version"} == {
        k: v for k, v in source.items() if k != "transformers_version"}
    assert (tmp_path / "a" / "vocab.txt").read_text() == (task["model"] / "vocab.txt").read_text()
    old, new = load_file(task["model"] / "model.safetensors"), load_file(tmp_path / "a" / "model.safetensors")
    again = load_file(tmp_path / "b" / "model.safetensors")
    assert set(old) == set(new) and all(old[k].shape == new[k].shape for k in old)
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(old[name], new[name]) and all(torch.equal(new[k], again[k]) for k in new)
    assert main(["init", "--like", str(tmp_path / "nowhere"), "--out", str(tmp_path / "c")]) == 2
    assert "nowhere" in capsys.readouterr().err
