"""The default recipe: `bertkit pretrain` without --config runs the built-in recipe its help names (DEFAULT_RECIPE),
PretrainConfig() and the help list are that recipe, and a bare run learns (its held-out loss falls)."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest
import yaml
from conftest import synthetic_corpus

from bertkit import WordPieceTokenizer
from bertkit.data.corpus import iter_lines
from bertkit.data.prepare import prepare
from bertkit.training.pretrain import (DEFAULT_RECIPE, DataConfig, PretrainConfig, TrainConfig, field_help, load_recipe,
                              resolve_config)

WORDS = "the a cat dog bird sees likes chases eats small big red green house tree river park runs sleeps".split()


def recipe_file() -> dict:
    return yaml.safe_load((resources.files("bertkit.recipes") / f"{DEFAULT_RECIPE}.yaml").read_text())


def test_no_config_is_the_default_recipe_everywhere():
    recipe = recipe_file()
    assert load_recipe(None) == recipe
    default = resolve_config()
    assert default == resolve_config(DEFAULT_RECIPE) == PretrainConfig()
    assert default.preset == recipe["preset"]
    # Every value the recipe file sets is what runs (the dataclass defaults fill only what it leaves out).
    for section, cls in (("data", DataConfig), ("train", TrainConfig)):
        for key, value in recipe[section].items():
            assert getattr(getattr(default, section), key) == value, (section, key)
    # The regression: TrainConfig's own defaults (1e-4, 10,000 warm-up steps) never reach a bare run.
    assert (default.train.learning_rate, default.train.warmup_steps) == (recipe["train"]["learning_rate"],
                                                                         recipe["train"]["warmup_steps"])
    # A section left out of PretrainConfig(...) is the default recipe's too.
    assert PretrainConfig(preset="tiny").train == default.train
    # `bertkit pretrain --help` lists the values that run.
    shown = {section: {name: value for name, value, _ in rows} for section, rows in field_help().items()}
    assert shown["train"] == dataclasses.asdict(default.train)
    assert shown["data"] == dataclasses.asdict(default.data)


def test_the_help_names_the_default_recipe(capsys):
    from bertkit.cli import main

    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {DEFAULT_RECIPE}," in help_text
    assert f"peak learning rate (default {recipe_file()['train']['learning_rate']})" in help_text


def short_documents(path: Path, documents: int, seed: int) -> Path:
    """Documents of 2-3 short sentences (rows of about 20 tokens, so that the recipe's batch of 32 rows of up to
    128 is cheap); each sentence repeats its document's topic word."""
    return synthetic_corpus(path, documents, seed, sentences=(2, 3), words=(3, 6), vocabulary=WORDS)


def bare_run(root: Path, seed: int = 0) -> tuple[dict, dict]:
    """`bertkit pretrain --data D --out R --preset tiny --max-steps 40` (nothing else but the seed): (the first
    and the last eval record, the run's config.yaml)."""
    from bertkit.cli import main

    corpus = short_documents(root / "corpus.txt", 200, seed=0)
    held_out = short_documents(root / "held_out.txt", 20, seed=1)
    tok = WordPieceTokenizer.train(iter_lines([corpus]), vocab_size=100, min_frequency=1, show_progress=False)
    tok.save(root / "tok")
    prepare([corpus], root / "tok", root / "data", eval_paths=[held_out], progress=False)
    run = root / "run"
    assert main(["pretrain", "--data", str(root / "data"), "--out", str(run), "--preset", "tiny",
                 "--max-steps", "40", "--seed", str(seed)]) == 0
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval_mlm_loss" in r]
    return (evals[0], evals[-1]), yaml.safe_load((run / "config.yaml").read_text())


def test_a_bare_pretrain_learns(tmp_path):
    (first, last), written = bare_run(tmp_path)
    assert written["train"]["learning_rate"] == recipe_file()["train"]["learning_rate"]
    assert (first["step"], last["step"]) == (0, 40)
    # Held-out MLM loss over 40 steps, seeds 0-2: 4.627 -> 3.225, 4.551 -> 3.242, 4.627 -> 3.224 (drops 1.31-1.40);
    # with TrainConfig's defaults instead (the regression: lr 1e-4 warming up over 10,000 steps) 4.627 -> 4.625.
    # Half the smallest drop is the bar.
    assert first["eval_mlm_loss"] - last["eval_mlm_loss"] > 0.65
