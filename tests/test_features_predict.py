"""Prediction with the model directory of a task model on encoder layers (bertkit.features): `bertkit predict` reads
what a `--frozen` or `--task-model bilstm` run kept (encoder + mix + BiLSTM + head) and answers as the run's dev
predictions did, for ELMo and BERT encoders; the directory still serves as an encoder directory; a frozen GLUE run
through the command line keeps its encoder bit-identical and its predictions file scores as the run reported."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_features_frozen import SENTENCES, TEXTS, dirs  # noqa: F401  (dirs: the tiny BERT and ELMo directories)

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.cli import main
from bertkit.features import extract_features
from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS

pytestmark = pytest.mark.usefixtures("one_thread")


def save_fixed_bert(path, hidden: int, layers: int) -> list[str]:
    """A tiny BERT (seed 0) whose vocabulary is fixed (the special tokens, then every word of the texts, sorted),
    saved to `path`, so that a run trains the same way every time (a WordPiece vocabulary trained on so few words
    breaks ties at random). Returns the words."""
    words = sorted({w for text in TEXTS for w in text.split()})
    tokenizer = WordPieceTokenizer({t: i for i, t in enumerate([*SPECIAL_TOKENS, *words])}, lowercase=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=32)
    BertForPreTraining(config).save_pretrained(path, tokenizer=tokenizer)
    return words


@pytest.fixture(scope="module")
def encoders(dirs):  # noqa: F811
    """{"elmo": the tiny ELMo directory, "bert": a tiny BERT whose vocabulary is fixed (`save_fixed_bert`)."""
    save_fixed_bert(dirs / "fixed_bert", hidden=16, layers=3)
    return {"elmo": dirs / "elmo", "bert": dirs / "fixed_bert"}

QUICK = ["--epochs", "2", "--batch-size", "4", "--learning-rate", "0.01", "--lstm-hidden", "8", "--seed", "1",
         "--quiet"]


def cli_json(capsys, args) -> list[dict]:
    """The JSON lines a command printed (earlier output dropped)."""
    capsys.readouterr()
    assert main(args) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith(("{", "["))]


def predicted(capsys, kind: str, model_dir, texts, tmp_path) -> list[dict]:
    inputs = tmp_path / f"{kind}_inputs.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return cli_json(capsys, ["predict", kind, "--model", str(model_dir), "--input", str(inputs), "--json"])


def finetuned(kind: str, encoder, train, dev, out, flags) -> dict:
    assert main(["finetune", kind, "--model", str(encoder), "--train", str(train), "--dev", str(dev), "--out",
                 str(out), *QUICK, *flags]) == 0
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("encoder, flags, both_labels", [
    ("elmo", ["--frozen", "--layers", "all", "--combine", "concat", "--task-model", "linear"], True),
    ("elmo", ["--frozen", "--task-model", "bilstm", "--combine", "scalar-mix"], False),  # (too few steps to learn)
    ("bert", ["--frozen", "--layers=-1,-2", "--combine", "concat", "--task-model", "linear"], True),
    ("bert", ["--task-model", "bilstm", "--layers=-1"], False),  # the encoder trained with the BiLSTM
])
def test_predict_reads_a_classifier_on_encoder_layers_and_answers_as_its_dev_predictions(encoders, tmp_path, capsys,
                                                                                         encoder, flags, both_labels):
    # texts that name a person or not: learnable, so that the dev predictions hold both labels
    data = tmp_path / "people.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{' '.join(w)}\t{'person' if 'B-PER' in t else 'none'}\n"
                                              for w, t in SENTENCES + [(x.split(), "") for x in TEXTS[-2:]]),
                    encoding="utf-8")
    texts = [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines()[1:]]
    finetuned("classify", encoders[encoder], data, data, tmp_path / "run",
              flags + ["--epochs", "8", "--learning-rate", "0.03"])
    written = (tmp_path / "run" / "dev_predictions.txt").read_text(encoding="utf-8").split()
    results = predicted(capsys, "classify", tmp_path / "run" / "model", texts, tmp_path)
    assert [r["label"] for r in results] == written and set(written) <= {"person", "none"}
    if both_labels:
        assert len(set(written)) == 2  # the best epoch tells the texts apart
    for r in results:
        assert r["probability"] == max(r["probabilities"].values())
        assert sum(r["probabilities"].values()) == pytest.approx(1.0)
    # the same texts give the same probabilities in any batch (here one at a time)
    alone = predicted(capsys, "classify", tmp_path / "run" / "model", texts[-1:], tmp_path)
    assert alone[0]["probabilities"] == pytest.approx(results[-1]["probabilities"], abs=1e-5)
    # a prediction of the wrong kind is refused by name
    assert main(["predict", "ner", "--model", str(tmp_path / "run" / "model"), "--text", "John"]) == 2
    err = capsys.readouterr().err.strip()
    assert "was fine-tuned for classify: it predicts as classify, not ner" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("encoder, flags", [
    ("elmo", ["--frozen", "--layers", "all", "--combine", "sum", "--task-model", "bilstm"]),
    ("bert", ["--frozen", "--layers=-1,-2,-3,-4", "--combine", "scalar-mix", "--task-model", "bilstm"]),
])
def test_predict_reads_a_tagger_on_encoder_layers_and_answers_as_its_dev_predictions(
        dirs, encoders, tmp_path, capsys, encoder, flags):  # noqa: F811
    run = tmp_path / "run"
    finetuned("ner", encoders[encoder], dirs / "train.txt", dirs / "dev.txt", run, flags)
    sentences = [block.splitlines() for block in
                 (run / "dev_predictions.conll").read_text(encoding="utf-8").strip().split("\n\n")]
    words = [[line.split()[0] for line in block] for block in sentences]
    written = [[line.split()[-1] for line in block] for block in sentences]
    assert words == [w for w, _ in SENTENCES[:4]]
    results = predicted(capsys, "ner", run / "model", [" ".join(w) for w in words], tmp_path)
    assert [r["words"] for r in results] == words
    assert [r["tags"] for r in results] == written
    # The task model's directory is still an encoder directory, and a frozen encoder's features did not move.
    ours, _ = extract_features(run / "model", TEXTS[-2:], layers=[0, -1], combine="concat")
    theirs, _ = extract_features(encoders[encoder], TEXTS[-2:], layers=[0, -1], combine="concat")
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_frozen_glue_from_the_command_line_keeps_the_encoder_and_scores_its_predictions(encoders, tmp_path, capsys):
    # SST-2 style files: sentences that name a person (1) or not (0), in the GLUE layout (sentence, label)
    rows = [(" ".join(words), int("B-PER" in tags)) for words, tags in SENTENCES]
    for name, chosen in (("train.tsv", rows), ("dev.tsv", rows[:6])):
        (tmp_path / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in chosen),
                                     encoding="utf-8")
    run = tmp_path / "run"
    results = finetuned("glue", encoders["bert"], tmp_path / "train.tsv", tmp_path / "dev.tsv", run,
                        ["--task", "SST-2", "--frozen", "--layers=-1,-2,-3,-4", "--combine", "concat",
                         "--task-model", "bilstm", "--lstm-hidden", "16", "--epochs", "6", "--learning-rate", "0.03"])
    assert results["features"]["frozen"] and results["features"]["layers"] == [3, 2, 1, 0]
    # the encoder's weights are bit-identical to the pretraining directory's; the BiLSTM and head are beside them
    original = {k.removeprefix("bert."): v for k, v in load_file(str(encoders["bert"] / "model.safetensors")).items()}
    saved = load_file(str(run / "model" / "model.safetensors"))
    assert len(saved) > 10 and all(torch.equal(saved[k], original[k]) for k in saved)
    task = load_file(str(run / "model" / "task_model.safetensors"))
    assert "head.weight" in task and any(k.startswith("lstm.") for k in task) and not saved.keys() & task.keys()
    # bertkit evaluate scores the run's predictions file as the run scored its best epoch
    scored = cli_json(capsys, ["evaluate", "glue", "--task", "SST-2", "--data", str(tmp_path / "dev.tsv"),
                               "--predictions", str(run / "dev_predictions.txt"), "--compact"])[0]
    assert scored["accuracy"] == pytest.approx(results["best"]["accuracy"])
    # predict reads the GLUE model as a classifier and answers as the predictions file
    answers = predicted(capsys, "classify", run / "model", [t for t, _ in rows[:6]], tmp_path)
    written = (run / "dev_predictions.txt").read_text(encoding="utf-8").split()
    assert [a["label"] for a in answers] == written and set(answers[0]["probabilities"]) == {"0", "1"}
    assert set(written) == {"0", "1"}  # the best epoch tells the texts apart
    (tmp_path / "ours.txt").write_text("".join(a["label"] + "\n" for a in answers), encoding="utf-8")
    again = cli_json(capsys, ["evaluate", "glue", "--task", "SST-2", "--data", str(tmp_path / "dev.tsv"),
                              "--predictions", str(tmp_path / "ours.txt"), "--compact"])[0]
    assert again == scored
