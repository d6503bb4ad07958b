"""Plain tag sets with the ner kind (`--column N --scheme none`): CoNLL's other columns read as they are (POS, chunks),
token accuracy by hand, fine-tuning, prediction and evaluation through the CLI agreeing with each other, and the
one-line errors that point to the option."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit import BertConfig, WordPieceTokenizer
from bertkit.cli import main
from bertkit.errors import DataError
from bertkit.tasks.finetune import FinetuneConfig
from bertkit.models import BertForPreTraining
from bertkit.tasks.base import family_for
from bertkit.tasks.ner import read_conll, tag_accuracy

pytestmark = pytest.mark.usefixtures("one_thread")

# CoNLL-2003's four columns: word, POS, chunk (IOB1), entity (IOB1).
SAMPLE = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ I-VP O
German JJ B-NP I-MISC
call NN I-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""


def test_read_conll_takes_any_column_and_plain_tags(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(SAMPLE)
    pos = read_conll(path, tag_column=1, plain=True)
    assert [s.tags for s in pos] == [["NNP", "VBZ", "JJ", "NN", "."], ["NNP", "NNP"]]
    assert [s.line for s in pos] == [3, 9] and pos[0].tokens[0] == "EU"
    chunks = read_conll(path, tag_column=2)  # IOB tags: readable as spans too
    assert chunks[0].tags == ["B-NP", "I-VP", "B-NP", "I-NP", "O"]
    with pytest.raises(DataError, match=r"x.txt:3: malformed tag 'NNP'.*--scheme none"):
        read_conll(path, tag_column=1)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=5),
                                   st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=4)),
                         min_size=1, max_size=5), min_size=1, max_size=4))
def test_plain_tags_round_trip(tmp_path_factory, sentences):
    sentences = [[(w, t) for w, t in s if w != "-DOCSTART-"] for s in sentences]
    sentences = [s for s in sentences if s]
    if not sentences:
        return
    path = tmp_path_factory.mktemp("rt") / "x.txt"
    path.write_text("\n\n".join("\n".join(f"{w} {t} x" for w, t in s) for s in sentences) + "\n", encoding="utf-8")
    read = read_conll(path, tag_column=1, plain=True)
    assert [list(zip(s.tokens, s.tags)) for s in read] == sentences


def test_tag_accuracy_by_hand():
    gold = [["NNP", "VBZ", "JJ"], ["NN", "."]]
    pred = [["NNP", "VBZ", "NN"], ["NN", ","]]
    assert tag_accuracy(gold, pred) == {"accuracy": 3 / 5, "tokens": 5}
    with pytest.raises(ValueError, match="sentence 1: 2 gold tags for 1 predicted"):
        tag_accuracy(gold, [["NNP", "VBZ", "NN"], ["NN"]])


def test_family_with_scheme_none(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(SAMPLE)
    family = family_for("ner")(FinetuneConfig(kind="ner", column=1, scheme="none"))
    examples = family.read(path, training=True)
    assert family.labels == [".", "JJ", "NN", "NNP", "VBZ"]  # the training file's tags, sorted; no "O" added
    assert family.main_metric == "accuracy" and family.metric_names == ("accuracy",)
    assert examples[0] == (["EU", "rejects", "German", "call", "."], ["NNP", "VBZ", "JJ", "NN", "."])
    # Logits that pick, for each word's first piece, label 3 (NNP): 3 of the 7 words are NNP.
    word_ids = [[None, 0, 1, 2, 3, 4, None], [None, 0, 1, None]]
    logits = [np.tile(np.eye(5)[3], (len(w), 1)) for w in word_ids]
    metrics, predicted = family.evaluate(examples, [{"word_ids": w} for w in word_ids], logits)
    assert metrics == {"accuracy": 3 / 7, "tokens": 7} and predicted[1] == ["NNP", "NNP"]
    assert family.task_info()["scheme"] == "none" and family.task_info()["column"] == 1


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="column 0 is the word"):
        FinetuneConfig(column=0)
    with pytest.raises(ValueError, match="scheme must be auto or none"):
        FinetuneConfig(scheme="bio")


# ---- end to end through the CLI ----------------------------------------------------------------------------------
LEXICON = {"the": "DT", "a": "DT", "dog": "NN", "cat": "NN", "man": "NN", "runs": "VBZ", "sees": "VBZ",
           "big": "JJ", "old": "JJ", ".": "."}


def tagged(n: int, seed: int) -> str:
    """Sentences "DT (JJ) NN VBZ DT NN ." whose POS is a function of the word: learnable by a tiny model."""
    rng = random.Random(seed)
    out = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        words = [rng.choice(["the", "a"])] + ([rng.choice(["big", "old"])] if rng.random() < 0.5 else [])
        words += [rng.choice(["dog", "cat", "man"]), rng.choice(["runs", "sees"]), rng.choice(["the", "a"]),
                  rng.choice(["dog", "cat", "man"]), "."]
        out += [f"{w} {LEXICON[w]} B-NP O" for w in words] + [""]
    return "\n".join(out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagging")
    tokenizer = WordPieceTokenizer.train(texts=[" ".join(LEXICON)] * 3, vocab_size=60, min_frequency=1,
                                         show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.1)
    BertForPreTraining(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def test_finetune_predict_and_evaluate_agree(model_dir, tmp_path, capsys):
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(tagged(40, 1))
    dev.write_text(tagged(12, 2))
    out = tmp_path / "out"
    assert main(["finetune", "ner", "--model", str(model_dir), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--column", "1", "--scheme", "none", "--epochs", "6", "--batch-size", "8",
                 "--lr", "3e-3", "--max-seq-length", "24", "--dropout", "0", "--quiet"]) == 0
    capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert results["metric"] == "accuracy" and results["labels"] == [".", "DT", "JJ", "NN", "VBZ"]
    majority = 2 / 7  # DT and NN are the most frequent tags, about 2 of every 7 words
    assert results["best"]["accuracy"] > 0.9 > majority
    # The predictions file scored by `bertkit evaluate` gives the run's accuracy of its last epoch.
    assert main(["evaluate", "ner", "--data", str(dev), "--predictions", str(out / "dev_predictions.conll"),
                 "--column", "1", "--scheme", "none", "--compact"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["accuracy"] == pytest.approx(results["epochs"][-1]["accuracy"])
    assert scored["tokens"] == sum(1 for line in dev.read_text().splitlines() if line and "DOCSTART" not in line)
    # Prediction: word/TAG for a sentence of known words.
    assert main(["predict", "ner", "--model", str(out / "model"), "--text", "the old man sees a cat ."]) == 0
    assert capsys.readouterr().out.strip() == "the/DT old/JJ man/NN sees/VBZ a/DT cat/NN ./."
    # Entity tags expected but plain tags given: one line naming the remedy.
    assert main(["finetune", "ner", "--model", str(model_dir), "--train", str(train), "--dev", str(dev),
                 "--out", str(tmp_path / "bad"), "--column", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "malformed tag" in err and "--scheme none" in err
