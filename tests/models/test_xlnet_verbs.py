"""Every fine-tuning verb takes an XLNet directory, on the command line, from raw text to directories transformers
loads: `tokenizer train --kind unigram --xlnet` -> `prepare` -> `pretrain --config xlnet-mini` (tiny), then
`finetune` of every kind (glue, classify, ner, squad, swag) and `predict`; each directory written loads in
transformers' XLNetFor... class with no missing keys and the same logits (1e-5) on transformers' own tokenisation
(left-padded, as XLNet's tokenizer pads). `bertkit features` gives transformers' XLNetModel hidden states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from tasks.test_every_kind import FINETUNE, corpus_text, same_logits, their_inputs, write_data
from test_modernbert_verbs import swag_file

transformers = pytest.importorskip("transformers")

TINY = ["--config", "xlnet-mini", "--d-model", "32", "--n-layer", "2", "--n-head", "4", "--d-inner", "48",
        "--max-seq-length", "32", "--reuse-len", "8", "--mem-len", "16", "--max-predictions-per-seq", "5",
        "--batch-size", "4", "--eval-instances", "8", "--eval-every", "0", "--progress", "false"]


def run(*argv) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"bertkit {' '.join(map(str, argv))} exited {code}"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xlnet-verbs")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text(0), encoding="utf-8")
    run("tokenizer", "train", "--kind", "unigram", "--xlnet", "--files", corpus, "--vocab-size", 200, "--out",
        root / "tok", "--quiet")
    run("prepare", "--corpus", corpus, "--tokenizer", root / "tok", "--out", root / "data", "--eval-fraction", "0.1",
        "--quiet")
    run("pretrain", "--data", root / "data", "--out", root / "run", *TINY, "--max-steps", "4", "--save-every", "4")
    return {"model": root / "run" / "model"}


def test_the_pretrained_directory_is_transformers_xlnet(made):
    theirs, info = transformers.XLNetLMHeadModel.from_pretrained(str(made["model"]), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert transformers.AutoTokenizer.from_pretrained(str(made["model"])).padding_side == "left"


def test_finetune_every_kind_and_predict(made, tmp_path, capsys):
    from bertkit.models import (XLNetForMultipleChoice, XLNetForQuestionAnswering, XLNetForSequenceClassification,
                                XLNetForTokenClassification)

    model, data = made["model"], write_data(tmp_path)
    texts = ["a good film", "the long story was very bad and the music was long and the actor was quite fun"]
    run("finetune", "glue", "--task", "sst2", "--model", model, "--train", data["sst2"], "--dev", data["sst2"],
        "--out", tmp_path / "glue", *FINETUNE)
    assert json.loads((tmp_path / "glue" / "model" / "config.json").read_text())["architectures"] == \
        ["XLNetForSequenceClassification"]
    same_logits(tmp_path / "glue" / "model", "XLNetForSequenceClassification", "XLNet",
                XLNetForSequenceClassification, texts)
    run("finetune", "glue", "--task", "mrpc", "--model", model, "--train", _pairs(tmp_path), "--dev",
        _pairs(tmp_path), "--out", tmp_path / "mrpc", *FINETUNE)
    same_logits(tmp_path / "mrpc" / "model", "XLNetForSequenceClassification", "XLNet",
                XLNetForSequenceClassification, ["a good film", "bad"], ["the film was good", "a long story"])
    run("finetune", "ner", "--model", model, "--train", data["ner"], "--dev", data["ner"], "--out", tmp_path / "ner",
        *FINETUNE)
    same_logits(tmp_path / "ner" / "model", "AutoModelForTokenClassification", "XLNet",
                XLNetForTokenClassification, ["Mary lives in Rome .", "Carl lives in Vienna and Paris ."])
    run("finetune", "squad", "--model", model, "--train", data["squad"], "--dev", data["squad"],
        "--out", tmp_path / "squad", *FINETUNE)
    assert (tmp_path / "squad" / "predictions.json").is_file()
    same_logits(tmp_path / "squad" / "model", "XLNetForQuestionAnsweringSimple", "XLNet",
                XLNetForQuestionAnswering, ["Where does mary live ?"],
                ["Mary lives in Rome . The film was good and the music was long ."])
    swag = swag_file(tmp_path / "swag.csv")
    run("finetune", "swag", "--model", model, "--train", swag, "--dev", swag, "--out", tmp_path / "swag", *FINETUNE)
    theirs = transformers.AutoModelForMultipleChoice.from_pretrained(str(tmp_path / "swag" / "model")).eval()
    assert type(theirs).__name__ == "XLNetForMultipleChoice"
    ours = XLNetForMultipleChoice.from_pretrained(tmp_path / "swag" / "model").eval()
    enc = their_inputs(tmp_path / "swag" / "model", ["mary is from rome ."] * 2,
                       ["Mary lives in rome .", "Mary lives in a very long story about the film and the music ."])
    with torch.no_grad():
        expected = theirs(**{k: v[None] for k, v in enc.items()}).logits
        got = ours(enc["input_ids"][None], enc["attention_mask"][None], enc["token_type_ids"][None]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    capsys.readouterr()

    run("predict", "classify", "--model", tmp_path / "glue" / "model", "--text", "a very good film", "--json")
    assert json.loads(capsys.readouterr().out)["label"] in ("0", "1")
    run("predict", "ner", "--model", tmp_path / "ner" / "model", "--text", "Mary lives in Rome .", "--json")
    assert json.loads(capsys.readouterr().out)["words"] == ["Mary", "lives", "in", "Rome", "."]
    run("predict", "squad", "--model", tmp_path / "squad" / "model", "--question", "Where does Mary live ?",
        "--context", "Mary lives in Rome .", "--json")
    answer = json.loads(capsys.readouterr().out)
    assert answer["answer"] == "" or answer["answer"] in "Mary lives in Rome ."
    run("predict", "swag", "--model", tmp_path / "swag" / "model", "--context", "mary is from rome .",
        "--choice", "Mary lives in rome .", "--choice", "Mary lives in paris .", "--json")
    assert json.loads(capsys.readouterr().out)["choice"] in (0, 1)


def _pairs(root: Path) -> Path:
    path = root / "mrpc.tsv"
    if not path.is_file():
        rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(24):
            rows.append(f"{i % 2}\t{i}\t{i + 100}\ta {'good' if i % 2 else 'bad'} film {i}\tthe film was "
                        f"{'good' if i % 2 else 'long'}")
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_features_are_transformers_hidden_states(made, tmp_path):
    lines = ["Mary lives in Rome .", "the film was good and the music was long", "bad"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run("features", "--model", made["model"], "--input", tmp_path / "in.txt", "--out", tmp_path / "f.npz",
        "--layers=-1,-2", "--combine", "none")
    stored = np.load(tmp_path / "f.npz")
    theirs = transformers.XLNetModel.from_pretrained(str(made["model"])).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(made["model"]))
    for i, line in enumerate(lines):
        enc = tok(line, return_tensors="pt")
        with torch.no_grad():
            hidden = theirs(**enc, output_hidden_states=True).hidden_states
        want = torch.stack([hidden[-1][0], hidden[-2][0]], dim=1).numpy()  # (T, 2, H)
        got = stored["features"][i, :stored["lengths"][i]]  # (T_i, 2, H), padding cut off
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_fill_mask_predicts_through_the_query_stream(made, capsys):
    """Every <mask> hidden from every token, one target per mask: transformers' XLNetLMHeadModel gives the same
    distribution with the same perm_mask and target_mapping."""
    from bertkit.inference import fill_mask

    text = "Mary lives in <mask> and the film was <mask> ."
    got = fill_mask(made["model"], text, top_k=3)
    assert len(got) == 2 and all(len(row) == 3 for row in got)
    tok = transformers.AutoTokenizer.from_pretrained(str(made["model"]))
    enc = tok(text, return_tensors="pt")
    ids = enc["input_ids"]
    positions = (ids[0] == tok.mask_token_id).nonzero().flatten()
    perm = torch.zeros(1, ids.shape[1], ids.shape[1])
    perm[0, :, positions] = 1.0
    mapping = torch.zeros(1, len(positions), ids.shape[1])
    mapping[0, torch.arange(len(positions)), positions] = 1.0
    theirs = transformers.XLNetLMHeadModel.from_pretrained(str(made["model"])).eval()
    with torch.no_grad():
        probs = theirs(**enc, perm_mask=perm, target_mapping=mapping).logits[0].softmax(-1)
    for row, expected in zip(got, probs):
        top = expected.topk(3)
        assert [c["id"] for c in row] == top.indices.tolist()
        np.testing.assert_allclose([c["probability"] for c in row], top.values.numpy(), atol=1e-5)
