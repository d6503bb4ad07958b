"""Every tokenizer kind through every verb, on the command line, from raw text to fine-tuned models transformers loads.

Three model directories, each made as a user would:
  bpe-roberta     `tokenizer train --kind bpe` -> `prepare` -> `pretrain --config roberta-mini` (RoBERTa, <s> ... </s>)
  wordpiece-bert  `tokenizer train` -> `prepare` -> `pretrain --config mini` (BERT, [CLS] ... [SEP])
  tokenizer-json  the BERT model with only a transformers `tokenizer.json` (no vocab.txt) beside its weights
Each goes through `finetune glue`, `finetune ner`, `finetune squad`, `predict`, `features`, `fill-mask`,
`distill init-student` + `distill glue`; the fine-tuned directories load in transformers' matching
`RobertaFor...` / `BertFor...` classes with the same logits (1e-5) on transformers' own tokenisation.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.tokenizers import load_tokenizer

transformers = pytest.importorskip("transformers")

KINDS = ["bpe-roberta", "wordpiece-bert", "tokenizer-json"]
PEOPLE = ["john", "mary", "peter", "anna", "carl", "lena"]
PLACES = ["paris", "london", "berlin", "rome", "madrid", "vienna"]
FILLER = "the movie film plot actor was is very quite really a an story scene music fun long short".split()
TINY_MODEL = ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
              "--intermediate-size", "64", "--max-seq-length", "32", "--batch-size", "8", "--max-steps", "4",
              "--eval-instances", "8", "--save-every", "4", "--log-every", "1", "--learning-rate", "1e-3",
              "--max-position-embeddings", "80"]
FINETUNE = ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "40", "--learning-rate", "3e-3", "--quiet"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


def corpus_text(seed: int) -> str:
    """Documents of a few sentences each, a blank line between documents (Google's format)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(40):
        sentences = []
        for _ in range(rng.randint(3, 6)):
            p, c = rng.choice(PEOPLE), rng.choice(PLACES)
            words = [rng.choice(FILLER) for _ in range(rng.randint(2, 6))]
            sentences.append(f"{p.title()} lives in {c.title()} and the {' '.join(words)} was good or bad.")
        docs.append("\n".join(sentences))
    return "\n\n".join(docs) + "\n"


def run(*argv: str) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"bertkit {' '.join(map(str, argv))} exited {code}"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text(0), encoding="utf-8")
    out = {}
    for name, kind, recipe, vocab in (("bpe-roberta", "bpe", "roberta-mini", 400),
                                      ("wordpiece-bert", "wordpiece", "mini", 200)):
        run("tokenizer", "train", "--kind", kind, "--files", corpus, "--vocab-size", vocab, "--min-frequency", 1,
            "--out", root / f"tok-{name}", "--quiet")
        run("prepare", "--corpus", corpus, "--tokenizer", root / f"tok-{name}", "--out", root / f"data-{name}",
            "--eval-fraction", "0.1", "--quiet")
        run("pretrain", "--data", root / f"data-{name}", "--out", root / f"run-{name}", "--config", recipe,
            "--progress", "false", *TINY_MODEL)
        out[name] = root / f"run-{name}" / "model"
    # The BERT model with its tokenizer as transformers writes it for a hub model that ships only tokenizer.json.
    json_dir = root / "model-tokenizer-json"
    shutil.copytree(out["wordpiece-bert"], json_dir)
    lines = (out["wordpiece-bert"] / "vocab.txt").read_text(encoding="utf-8").splitlines()
    fast = transformers.BertTokenizerFast(vocab={token: i for i, token in enumerate(lines)}, do_lower_case=True)
    assert len(fast) == len(lines)
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json"):
        (json_dir / name).unlink(missing_ok=True)
    fast.save_pretrained(str(json_dir))
    (json_dir / "vocab.txt").unlink(missing_ok=True)  # transformers 5 writes tokenizer.json only; older ones add it
    assert (json_dir / "tokenizer.json").is_file() and not (json_dir / "vocab.txt").exists()
    out["tokenizer-json"] = json_dir
    return out


def write_data(root: Path) -> dict[str, Path]:
    rng = random.Random(1)
    rows = []
    for i in range(48):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 6))]
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 else "bad")
        rows.append(f"{' '.join(words)}\t{i % 2}")
    (root / "sst2.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    sentences = []
    for _ in range(40):
        p, c = rng.choice(PEOPLE), rng.choice(PLACES)
        sentences.append(f"{p.title()} I-PER\nlives O\nin O\n{c.title()} I-LOC\n. O")
    (root / "ner.txt").write_text("-DOCSTART- O\n\n" + "\n\n".join(sentences) + "\n", encoding="utf-8")
    paragraphs = []
    for i in range(12):
        p, c = PEOPLE[i % len(PEOPLE)], PLACES[(i * 5) % len(PLACES)]
        context = f"{p.title()} lives in {c.title()} . The film was good ."
        qas = [{"id": f"q{i}", "question": f"Where does {p} live ?", "is_impossible": False,
                "answers": [{"text": c.title(), "answer_start": context.index(c.title())}]},
               {"id": f"n{i}", "question": "Who wrote the music ?", "is_impossible": True, "answers": []}]
        paragraphs.append({"context": context, "qas": qas})
    squad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}
    (root / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    (root / "lines.txt").write_text("Mary lives in Rome .\nthe film was good\n", encoding="utf-8")
    return {"sst2": root / "sst2.tsv", "ner": root / "ner.txt", "squad": root / "squad.json",
            "lines": root / "lines.txt"}


def their_inputs(model_dir: Path, texts, pairs=None) -> dict[str, torch.Tensor]:
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    enc = tok(texts, pairs, padding=True, return_tensors="pt")
    ours = load_tokenizer(model_dir)
    for i, text in enumerate(texts):  # bertkit reads the same files into the same ids
        mine = ours.encode(text, pair=None if pairs is None else pairs[i]).input_ids
        assert mine == [t for t, m in zip(enc["input_ids"][i].tolist(), enc["attention_mask"][i].tolist()) if m]
    return dict(enc)


def same_logits(model_dir: Path, auto_class: str, expected_prefix: str, ours_cls, texts, pairs=None) -> None:
    theirs = getattr(transformers, auto_class).from_pretrained(str(model_dir)).eval()
    assert type(theirs).__name__.startswith(expected_prefix), type(theirs).__name__
    ours = ours_cls.from_pretrained(model_dir).eval()
    enc = their_inputs(model_dir, texts, pairs)
    types = enc.get("token_type_ids")
    with torch.no_grad():
        out = theirs(**enc)
        theirs_logits = (torch.stack([out.start_logits, out.end_logits], -1) if hasattr(out, "start_logits")
                         else out.logits)
        mine = ours(enc["input_ids"], enc["attention_mask"], types).logits
    if mine.dim() == 3:  # per token: compare real positions only
        real = enc["attention_mask"].bool()
        mine, theirs_logits = mine[real], theirs_logits[real]
    torch.testing.assert_close(mine, theirs_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_verb_takes_the_model(kind, models, tmp_path, capsys):
    from bertkit.models import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

    model = models[kind]
    data = write_data(tmp_path)
    family = "Roberta" if kind == "bpe-roberta" else "Bert"
    tokenizer = load_tokenizer(model)
    mask = tokenizer.id_to_token(tokenizer.mask_id)

    run("finetune", "glue", "--task", "sst2", "--model", model, "--train", data["sst2"], "--dev", data["sst2"],
        "--out", tmp_path / "glue", *FINETUNE)
    same_logits(tmp_path / "glue" / "model", "AutoModelForSequenceClassification", family,
                BertForSequenceClassification, ["a good film", "the long story was very bad"])
    run("finetune", "ner", "--model", model, "--train", data["ner"], "--dev", data["ner"], "--out", tmp_path / "ner",
        *FINETUNE)
    same_logits(tmp_path / "ner" / "model", "AutoModelForTokenClassification", family, BertForTokenClassification,
                ["Mary lives in Rome .", "Carl lives in Vienna and Paris ."])
    run("finetune", "squad", "--model", model, "--train", data["squad"], "--dev", data["squad"],
        "--out", tmp_path / "squad", *FINETUNE)
    assert (tmp_path / "squad" / "predictions.json").is_file()
    same_logits(tmp_path / "squad" / "model", "AutoModelForQuestionAnswering", family, BertForQuestionAnswering,
                ["Where does mary live ?"], ["Mary lives in Rome . The film was good ."])
    capsys.readouterr()

    run("predict", "classify", "--model", tmp_path / "glue" / "model", "--text", "a very good film", "--json")
    assert json.loads(capsys.readouterr().out)["label"] in ("0", "1")
    run("predict", "ner", "--model", tmp_path / "ner" / "model", "--text", "Mary lives in Rome .", "--json")
    result = json.loads(capsys.readouterr().out)
    assert result["words"] == ["Mary", "lives", "in", "Rome", "."]
    assert all("Mary lives in Rome ."[e["start"]:e["end"]] == e["text"] for e in result["entities"])
    run("predict", "squad", "--model", tmp_path / "squad" / "model", "--question", "Where does Mary live ?",
        "--context", "Mary lives in Rome .", "--json")
    answer = json.loads(capsys.readouterr().out)
    assert answer["answer"] == "" or answer["answer"] in "Mary lives in Rome ."

    run("features", "--model", model, "--input", data["lines"], "--layers=-1,-2", "--combine", "concat",
        "--out", tmp_path / "feats.safetensors")
    summary = json.loads(capsys.readouterr().out)
    assert summary["lines"] == 2 and summary["feature_shape"] == ["T", 64]
    from bertkit.features import read_features

    features, tokens = read_features(tmp_path / "feats.safetensors")
    assert [len(t) for t in tokens] == [f.shape[0] for f in features]
    assert tokens[0] == tokenizer.encode("Mary lives in Rome .").tokens

    run("fill-mask", "--model", model, f"Mary lives in {mask} .")
    assert capsys.readouterr().out.strip()

    run("distill", "init-student", "--from", tmp_path / "glue" / "model", "--layers", "0",
        "--out", tmp_path / "student")
    run("distill", "glue", "--task", "sst2", "--teacher", tmp_path / "glue" / "model",
        "--student", tmp_path / "student", "--train", data["sst2"], "--dev", data["sst2"],
        "--out", tmp_path / "distilled", *FINETUNE)
    same_logits(tmp_path / "distilled" / "model", "AutoModelForSequenceClassification", family,
                BertForSequenceClassification, ["a good film", "bad"])
