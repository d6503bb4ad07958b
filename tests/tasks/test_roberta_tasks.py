"""A byte-level BPE RoBERTa through every task family with the Python API: features framed as transformers'
RobertaTokenizerFast frames them (`<s> A </s></s> B </s>`, one token type), fine-tuning glue / ner / squad / swag,
prediction, frozen features and task distillation, each model directory keeping its byte-level BPE tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, ByteLevelBPETokenizer
from bertkit.training.distill import DistillConfig, distill_task
from bertkit.features import extract_features
from bertkit.tasks.finetune import FinetuneConfig, finetune, predict
from bertkit.models import BertForSequenceClassification, BertModel
from bertkit.tasks import family_for
from bertkit.tokenizers import load_tokenizer
from test_finetune import swag_file  # the same SWAG file maker as the BERT tasks'

transformers = pytest.importorskip("transformers")

FILLER = "the movie film plot actor was is very quite really a an story scene music fun long short".split()
PEOPLE, PLACES = ["john", "mary", "peter", "anna"], ["paris", "london", "berlin", "rome"]
QUICK = dict(batch_size=8, learning_rate=3e-3, progress=False, log_every=1, max_seq_length=32, dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """(sentence, label): 1 when the text says "good", 0 when it says "bad"."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 6))]
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 == 0 else "bad")
        out.append((" ".join(words), "1" if i % 2 == 0 else "0"))
    return out


@pytest.fixture(scope="module")
def roberta(tmp_path_factory) -> Path:
    """A tiny randomly initialised RoBERTa MLM directory with a byte-level BPE vocabulary trained here."""
    root = tmp_path_factory.mktemp("roberta")
    texts = [t for t, _ in sentiment_rows(60, 0)]
    texts += [f"{p.title()} lives in {c.title()} . Where does {p} live ? {p} walks to {c} ." for p in PEOPLE
              for c in PLACES]
    tokenizer = ByteLevelBPETokenizer.train(texts=texts * 2, vocab_size=330, min_frequency=1, show_progress=False)
    config = BertConfig.for_family(
        "roberta", vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id, layer_norm_eps=1e-5, initializer_range=0.1)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def theirs(model_dir: Path, **options):
    return transformers.RobertaTokenizerFast.from_pretrained(str(model_dir), **options)


def assert_roberta_directory(model_dir: Path, architecture: str) -> None:
    """A model directory with its byte-level BPE tokenizer and RoBERTa's architecture name."""
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == [architecture]
    assert (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file()
    assert load_tokenizer(model_dir).kind == "bpe"


def assert_same_logits(model_dir: Path, ours_cls, auto_class: str, enc: dict) -> None:
    peer = getattr(transformers, auto_class).from_pretrained(str(model_dir)).eval()
    ours = ours_cls.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = peer(**enc)
        expected = (torch.stack([out.start_logits, out.end_logits], -1) if hasattr(out, "start_logits")
                    else out.logits)
        mine = ours(enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids")).logits
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------------------------
# GLUE (a sentence-pair task and a single-sentence one) and distillation
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def glue_run(roberta, tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("sst2")
    for name, rows in (("train.tsv", sentiment_rows(64, 1)), ("dev.tsv", sentiment_rows(16, 2))):
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    results = finetune("glue", roberta, root / "train.tsv", root / "dev.tsv", root / "out",
                       FinetuneConfig(task="sst2", epochs=10, **QUICK))
    return root, results


def test_glue_pairs_are_framed_as_roberta_frames_them(roberta, tmp_path):
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    rows = ["1\t1\t2\tJohn lives in Paris .\tJohn walks to Paris .", "0\t3\t4\tMary lives in Rome .\tAnna is bad ."]
    (tmp_path / "mrpc.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    family = family_for("glue")(FinetuneConfig(kind="glue", task="mrpc", max_seq_length=32))
    examples = family.read(tmp_path / "mrpc.tsv", training=True)
    features = family.features(examples, load_tokenizer(roberta), training=True)
    enc = theirs(roberta)([e.text for e in examples], [e.pair for e in examples], return_token_type_ids=True)
    assert [f["input_ids"] for f in features] == enc["input_ids"]
    assert features[0]["input_ids"][0] == 0 and features[0]["input_ids"].count(2) == 3  # <s> A </s></s> B </s>
    assert all(f["token_type_ids"] == [0] * len(f["input_ids"]) for f in features)
    assert [f["label"] for f in features] == [1, 0]


def test_glue_fine_tunes_and_the_directory_is_a_roberta_classifier(glue_run):
    root, results = glue_run
    assert results["metric"] == "accuracy" and results["best"]["accuracy"] >= 0.9
    model_dir = root / "out" / "model"
    assert_roberta_directory(model_dir, "RobertaForSequenceClassification")
    texts = ["a good film", "the long story was bad"]
    enc = theirs(model_dir)(texts, padding=True, return_tensors="pt")
    assert_same_logits(model_dir, BertForSequenceClassification, "AutoModelForSequenceClassification", dict(enc))
    good, bad = predict(model_dir, None, ["a very good film", "bad plot"])
    assert good["label"] == "1" and bad["label"] == "0"
    assert abs(sum(good["probabilities"].values()) - 1) < 1e-6


def test_glue_distils_into_a_roberta_student(glue_run, tmp_path):
    root, _ = glue_run
    teacher = root / "out" / "model"
    results = distill_task("glue", teacher, root / "train.tsv", root / "dev.tsv", tmp_path / "run",
                           FinetuneConfig(task="sst2", epochs=2, **QUICK),
                           DistillConfig(student_layers_from_teacher="1", temperature=1.0))
    assert results["student"]["layers"] == 1 and results["teacher"]["accuracy"] >= 0.9
    assert "teacher_agreement" in results["best"]
    assert_roberta_directory(tmp_path / "run" / "model", "RobertaForSequenceClassification")
    (result,) = predict(tmp_path / "run" / "model", None, ["a good film"])
    assert result["label"] in ("0", "1")


# ------------------------------------------------------------------------------------------------------------------
# NER
# ------------------------------------------------------------------------------------------------------------------
def ner_file(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        p, c = rng.choice(PEOPLE).title(), rng.choice(PLACES).title()
        sentences.append(f"{p} B-PER\nlives O\nin O\n{c} B-LOC\n. O")
    path.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    return path


def test_ner_words_are_pieced_and_framed_as_roberta_does(roberta, tmp_path):
    family = family_for("ner")(FinetuneConfig(kind="ner", max_seq_length=32))
    family.read(ner_file(tmp_path / "train.txt", 4, 0), training=True)
    words = ["Mary", "lives", "in", "Parisville", "."]
    (feature,) = family.features([(words, ["B-PER", "O", "O", "B-LOC", "O"])], load_tokenizer(roberta), True)
    # transformers takes pre-split words for RoBERTa only with a space before each word.
    enc = theirs(roberta, add_prefix_space=True)(words, is_split_into_words=True)
    assert feature["input_ids"] == enc["input_ids"] and feature["word_ids"] == enc.word_ids()
    assert feature["token_type_ids"] == [0] * len(feature["input_ids"])
    first = [i for i, w in enumerate(feature["word_ids"]) if w is not None and w != feature["word_ids"][i - 1]]
    assert len(first) == len(words) < len(feature["input_ids"]) - 2  # "Parisville" is several pieces
    to_id = {name: i for i, name in enumerate(family.labels)}
    assert [feature["labels"][i] for i in first] == [to_id[t] for t in ["B-PER", "O", "O", "B-LOC", "O"]]


def test_ner_fine_tunes_and_predicts_entity_spans(roberta, tmp_path):
    train, dev = ner_file(tmp_path / "train.txt", 40, 1), ner_file(tmp_path / "dev.txt", 10, 2)
    results = finetune("ner", roberta, train, dev, tmp_path / "out", FinetuneConfig(epochs=8, **QUICK))
    assert results["metric"] == "f1" and results["best"]["f1"] >= 0.9
    assert_roberta_directory(tmp_path / "out" / "model", "RobertaForTokenClassification")
    text = "Anna lives in Berlin ."
    (result,) = predict(tmp_path / "out" / "model", "ner", [text])
    assert result["words"] == ["Anna", "lives", "in", "Berlin", "."]
    assert [(e["type"], e["text"]) for e in result["entities"]] == [("PER", "Anna"), ("LOC", "Berlin")]
    assert all(text[e["start"]:e["end"]] == e["text"] for e in result["entities"])


# ------------------------------------------------------------------------------------------------------------------
# SQuAD
# ------------------------------------------------------------------------------------------------------------------
def squad_file(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    paragraphs = []
    for a in range(6):
        p, c = rng.choice(PEOPLE), rng.choice(PLACES)
        context = f"{p.title()} lives in {c.title()} . The film was good ."
        qas = [{"id": f"{seed}-{a}", "question": f"Where does {p} live ?", "is_impossible": False,
                "answers": [{"text": c.title(), "answer_start": context.index(c.title())}]}]
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "v1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def test_squad_windows_are_robertas_question_context_pairs(roberta):
    config = FinetuneConfig(kind="squad", max_seq_length=64)
    family = family_for("squad")(config)
    question, context = "Where does mary live ?", "Mary lives in Rome . The film was good ."
    (feature,) = family.prediction_features([(question, context)], load_tokenizer(roberta))
    enc = theirs(roberta)(question, context, return_token_type_ids=True)
    assert feature["input_ids"] == enc["input_ids"]  # <s> question </s></s> context </s>
    assert feature["token_type_ids"] == enc["token_type_ids"] == [0] * len(enc["input_ids"])
    assert family.answer_text is None  # byte-level BPE answers are cut from the context by offsets


def test_squad_fine_tunes_and_answers_with_context_text(roberta, tmp_path):
    train, dev = squad_file(tmp_path / "train.json", 0), squad_file(tmp_path / "dev.json", 1)
    config = FinetuneConfig(epochs=3, doc_stride=8, max_query_length=12, **dict(QUICK, max_seq_length=24))
    results = finetune("squad", roberta, train, dev, tmp_path / "out", config)
    assert results["metric"] == "f1" and set(results["best"]) >= {"exact_match", "f1"}
    assert results["data"]["train"]["windows"] > 6  # 24-token windows cut the contexts in two
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
    contexts = {q["id"]: p["context"] for p in json.loads(dev.read_text())["data"][0]["paragraphs"] for q in p["qas"]}
    assert set(predictions) == set(contexts) and all(a in contexts[q] for q, a in predictions.items())
    assert_roberta_directory(tmp_path / "out" / "model", "RobertaForQuestionAnswering")
    context = "Mary lives in Rome . The film was good ."
    (answer,) = predict(tmp_path / "out" / "model", None, [("Where does mary live ?", context)])
    assert answer["answer"] in context and 0 <= answer["score"] <= 1


# ------------------------------------------------------------------------------------------------------------------
# SWAG
# ------------------------------------------------------------------------------------------------------------------


def test_swag_choices_are_roberta_pairs_and_fine_tune(roberta, tmp_path):
    train, dev = swag_file(tmp_path / "train.csv", 16, 0), swag_file(tmp_path / "val.csv", 8, 1)
    family = family_for("swag")(FinetuneConfig(kind="swag", max_seq_length=32))
    example = family.read(dev, training=False)[0]
    (feature,) = family.features([example], load_tokenizer(roberta), training=False)
    enc = theirs(roberta)([example.context] * 4, example.choices, return_token_type_ids=True)
    assert feature["input_ids"] == enc["input_ids"] and feature["token_type_ids"] == enc["token_type_ids"]

    results = finetune("swag", roberta, train, dev, tmp_path / "out", FinetuneConfig(epochs=2, **QUICK))
    assert results["metric"] == "accuracy" and len(results["epochs"]) == 2
    assert_roberta_directory(tmp_path / "out" / "model", "RobertaForMultipleChoice")
    lines = (tmp_path / "out" / "dev_predictions.txt").read_text().split()
    assert len(lines) == 8 and set(lines) <= {"0", "1", "2", "3"}
    choices = ["walks to rome .", "walks to paris .", "walks to london ."]  # any number of choices
    first, second = predict(tmp_path / "out" / "model", "swag", [("mary lives in rome .", choices),
                                                                  ("john lives in paris .", choices[:2])])
    assert len(first["probabilities"]) == 3 and len(second["probabilities"]) == 2
    assert first["text"] == choices[first["choice"]] and abs(sum(second["probabilities"]) - 1) < 1e-6


# ------------------------------------------------------------------------------------------------------------------
# Frozen features
# ------------------------------------------------------------------------------------------------------------------
def test_features_of_a_roberta_are_its_hidden_states_with_its_tokens(roberta):
    texts = ["Mary lives in Rome .", "a good film"]
    features, tokens = extract_features(roberta, texts, layers=(-1, 0), combine="concat", batch_size=2)
    tokenizer = load_tokenizer(roberta)
    model = BertModel.from_pretrained(roberta, add_pooler=False).eval()
    for text, feature, toks in zip(texts, features, tokens):
        enc = tokenizer.encode(text)
        assert toks == enc.tokens and toks[0] == "<s>" and toks[-1] == "</s>"
        ids = torch.tensor([enc.input_ids])
        with torch.no_grad():
            hidden = model(ids, torch.ones_like(ids), output_hidden_states=True).hidden_states
        expected = torch.cat([hidden[-1], hidden[0]], dim=-1)[0].numpy()
        assert feature.shape == (len(toks), 64) and np.allclose(feature, expected, atol=1e-5)
