"""Fine-tuning end to end on tiny models and tiny files: every task family trains, evaluates with its official
metric, writes a model transformers loads, predicts, and reports bad input as one line naming file:line."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.cli import main
from conftest import kill_after_checkpoint
from bertkit.tasks.finetune import FinetuneConfig, evaluate_predictions, finetune, predict
from bertkit.tasks.run import EpochBatches
from bertkit.tasks.ner import tags_to_spans
from bertkit.models import IGNORE_INDEX, BertForSequenceClassification
from bertkit.tasks import family_for

FILLER = "the movie film plot actor was is very quite really a an story scene music fun long short".split()
PEOPLE, PLACES = ["john", "mary", "peter", "anna"], ["paris", "london", "berlin", "rome"]
QUICK = dict(batch_size=8, learning_rate=3e-3, progress=False, log_every=1, max_seq_length=24)


def classify_rows(n: int, seed: int, label=lambda good: "pos" if good else "neg") -> list[str]:
    """Label = whether the text contains "good" (else it contains "bad"): learnable from one word."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 == 0 else "bad")
        rows.append(f"{' '.join(words)},{label(i % 2 == 0)}")
    return rows


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny BertForPreTraining directory with a WordPiece vocabulary trained in-process."""
    root = tmp_path_factory.mktemp("pretrained")
    texts = [row.split(",")[0] for row in classify_rows(40, 0)]
    texts += [f"{p} lives in {c} . where does {p} live ? nobody knows" for p in PEOPLE for c in PLACES]
    texts += ["good bad parisville the man opens the door and walks away sits down"]
    tokenizer = WordPieceTokenizer.train(texts=texts, vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    # A larger initialisation than BERT's 0.02 lets a randomly initialised 32-wide model learn in a few steps.
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.1)
    BertForPreTraining(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


@pytest.fixture(scope="module")
def classify_run(pretrained, tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("classify")
    train = write_csv(root / "train.csv", classify_rows(64, 1))
    dev = write_csv(root / "dev.csv", classify_rows(16, 2))
    results = finetune("classify", pretrained, train, dev, root / "out",
                       FinetuneConfig(epochs=6, dropout=0.0, **QUICK))
    return root, results


# ------------------------------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------------------------------
def test_classification_learns_the_task(classify_run, capsys):
    root, results = classify_run
    assert results["labels"] == ["neg", "pos"]  # collected from the training file, sorted
    assert results["metric"] == "accuracy"
    assert [r["epoch"] for r in results["epochs"]] == [1, 2, 3, 4, 5, 6]
    assert results["best"]["accuracy"] == 1.0
    assert results["best"] == max(results["epochs"], key=lambda r: r["accuracy"])
    assert results["train_examples_per_s"] > 0 and results["steps"] == 6 * 8
    saved = json.loads((root / "out" / "results.json").read_text())
    assert saved["best"] == results["best"] and saved["config"]["epochs"] == 6
    losses = [json.loads(line)["loss"] for line in (root / "out" / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert len(losses) == 48
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])  # the training loss falls

    # The best epoch's dev predictions score the same through `bertkit evaluate`.
    code = main(["evaluate", "classify", "--data", str(root / "dev.csv"),
                 "--predictions", str(root / "out" / "dev_predictions.txt"), "--compact"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0

    (good,), (bad,) = (predict(root / "out" / "model", None, [text]) for text in ["a very good film", "bad plot"])
    assert good["label"] == "pos" and bad["label"] == "neg"
    assert good["probability"] > 0.5 and abs(sum(good["probabilities"].values()) - 1) < 1e-6


def test_finetuned_model_loads_in_transformers_with_same_logits(classify_run):
    transformers = pytest.importorskip("transformers")
    model_dir = classify_run[0] / "out" / "model"
    ours = BertForSequenceClassification.from_pretrained(model_dir).eval()
    peer = transformers.BertForSequenceClassification.from_pretrained(model_dir).eval()
    assert peer.config.id2label == {0: "neg", 1: "pos"} and ours.labels == ["neg", "pos"]
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    encoded = tokenizer.encode_batch(["a good film", "the long story was bad"], padding=True)
    ids = torch.tensor([e.input_ids for e in encoded])
    mask = torch.tensor([e.attention_mask for e in encoded])
    types = torch.tensor([e.token_type_ids for e in encoded])
    with torch.no_grad():
        a = ours(ids, mask, types).logits
        b = peer(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_epoch_batches_are_deterministic_and_resumable():
    features = [{"input_ids": [2] + [5] * (i % 5 + 1) + [3], "token_type_ids": [0] * (i % 5 + 3), "label": i % 2}
                for i in range(21)]
    stream = EpochBatches(features, pad_id=0, batch_size=4, seed=7, grad_accumulation=2)
    assert stream.steps_per_epoch == 5  # 21 = 5 x 4 + 1; a last example cannot be split in two micro-batches
    it = iter(stream)
    batches = [next(it) for _ in range(24)]
    assert all(b["input_ids"].shape[0] == 2 for b in batches)
    # Dynamic padding: each micro-batch is as long as its longest row.
    assert all(b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max()) for b in batches)
    assert batches[9]["_state"] == {"epoch": 1, "step": 0, "micro": 0}
    first_epoch = sorted(int(b["attention_mask"][r].sum()) for b in batches[:10] for r in range(2))
    assert len(first_epoch) == 20  # every example but one, once
    again = EpochBatches(features, pad_id=0, batch_size=4, seed=7, grad_accumulation=2)
    again.load_state_dict(batches[13]["_state"])
    resumed = iter(again)
    for b in batches[14:]:
        c = next(resumed)
        assert torch.equal(b["input_ids"], c["input_ids"]) and torch.equal(b["labels"], c["labels"])
    other = iter(EpochBatches(features, pad_id=0, batch_size=4, seed=8, grad_accumulation=2))
    assert any(not torch.equal(b["labels"], next(other)["labels"]) for b in batches[:10])


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_repeats_the_uninterrupted_run(pretrained, tmp_path, workers):
    train = write_csv(tmp_path / "train.csv", classify_rows(24, 3))
    dev = write_csv(tmp_path / "dev.csv", classify_rows(8, 4))
    # dropout on: the RNG state must be restored too; workers: the resumed run's batches come from new processes
    config = FinetuneConfig(epochs=2, dropout=0.1, workers=workers, **QUICK)
    full = finetune("classify", pretrained, train, dev, tmp_path / "full", config)
    finetune("classify", pretrained, train, dev, tmp_path / "split", config, stop_after_steps=4)
    assert (tmp_path / "split" / "checkpoints" / "step-00000004.pt").is_file()
    resumed = finetune("classify", pretrained, train, dev, tmp_path / "split", config, resume=True)

    def losses(run: str) -> list[tuple[int, float]]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]

    assert len(losses("full")) == 6 and losses("split") == losses("full")  # bit-identical on CPU
    assert resumed["epochs"] == full["epochs"] and resumed["best"] == full["best"]
    a = BertForSequenceClassification.from_pretrained(tmp_path / "full" / "model").state_dict()
    b = BertForSequenceClassification.from_pretrained(tmp_path / "split" / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def run_losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_worker_processes_train_exactly_as_the_training_process(pretrained, tmp_path):
    # The same run with batches collated in the training process, by 1 worker and by 2 workers: the same
    # losses at every step and the same weights, bit for bit (dropout on: the workers leave the RNG alone).
    train = write_csv(tmp_path / "train.csv", classify_rows(40, 3))
    dev = write_csv(tmp_path / "dev.csv", classify_rows(8, 4))
    runs = {}
    for workers in (0, 1, 2):
        config = FinetuneConfig(epochs=2, dropout=0.1, grad_accumulation=2, workers=workers, **QUICK)
        results = finetune("classify", pretrained, train, dev, tmp_path / f"w{workers}", config)
        runs[workers] = (run_losses(tmp_path / f"w{workers}"), results["epochs"],
                         BertForSequenceClassification.from_pretrained(tmp_path / f"w{workers}" / "model").state_dict())
    losses, epochs, weights = runs[0]
    assert len(losses) == 10
    for workers in (1, 2):
        assert runs[workers][0] == losses and runs[workers][1] == epochs
        assert all(torch.equal(weights[k], runs[workers][2][k]) for k in weights)


@pytest.mark.slow  # three CLI processes (a full run, a killed one, its resumption); in-process: the test above
def test_sigkilled_run_with_workers_resumes_bit_identically(pretrained, tmp_path):
    import os
    import subprocess
    import sys

    train = write_csv(tmp_path / "train.csv", classify_rows(96, 3))
    dev = write_csv(tmp_path / "dev.csv", classify_rows(8, 4))

    def command(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "bertkit.cli", "finetune", "classify", "--model", str(pretrained), "--train",
                str(train), "--dev", str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "8",
                "--learning-rate", "3e-3", "--max-seq-length", "24", "--log-every", "1", "--save-every", "3",
                "--quiet", "--workers", "2", *extra]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(command(full), check=True, env=env, capture_output=True)
    kill_after_checkpoint(command(killed), killed, env)
    assert max(run_losses(killed), default=0) < 24, "the run finished before the kill; nothing was tested"
    subprocess.run(command(killed, "--resume"), check=True, env=env, capture_output=True)
    assert run_losses(killed) == run_losses(full) and len(run_losses(full)) == 24  # every step, bit for bit
    assert (json.loads((killed / "results.json").read_text())["epochs"]
            == json.loads((full / "results.json").read_text())["epochs"])


def test_optimizer_settings_reach_the_optimizer(pretrained, tmp_path):
    train = write_csv(tmp_path / "train.csv", classify_rows(16, 3))
    config = FinetuneConfig(epochs=1, adam_epsilon=1e-8, weight_decay=0.05, **QUICK)
    finetune("classify", pretrained, train, train, tmp_path / "run", config)
    state = torch.load(next((tmp_path / "run" / "checkpoints").glob("step-*.pt")), weights_only=True)
    groups = state["optimizer"]["param_groups"]
    assert {g["eps"] for g in groups} == {1e-8} and sorted(g["weight_decay"] for g in groups) == [0.0, 0.05]
    with pytest.raises(ValueError, match="adam_epsilon"):
        FinetuneConfig(adam_epsilon=0.0)


def test_glue_pair_task_and_regression(pretrained, tmp_path):
    # MRPC's layout: a header, two sentences per row; the pair goes in as segment B.
    rng = random.Random(5)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    rows = []
    for i in range(12):
        a, b = rng.choice(PEOPLE), rng.choice(PLACES)
        rows.append(f"{i % 2}\t{i}\t{i}\t{a} lives in {b} .\t{a if i % 2 else 'nobody'} lives in {b} .")
    (tmp_path / "train.tsv").write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join([header] + rows[:4]) + "\n", encoding="utf-8")
    family = family_for("glue")(FinetuneConfig(kind="glue", task="MRPC", max_seq_length=24))
    examples = family.read(tmp_path / "train.tsv", training=True)
    feature = family.features(examples, WordPieceTokenizer.from_pretrained(pretrained), training=True)[0]
    assert examples[0].pair == "nobody lives in " + examples[0].text.split(" in ")[1]
    assert feature["token_type_ids"].count(1) == len(feature["input_ids"]) - feature["token_type_ids"].count(0) > 3
    results = finetune("glue", pretrained, tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "mrpc",
                       FinetuneConfig(task="MRPC", epochs=1, **dict(QUICK, batch_size=4)))
    assert results["metric"] == "accuracy" and set(results["best"]) == {"epoch", "step", "accuracy", "f1"}
    assert results["labels"] == ["0", "1"]

    scores = [f"{r.split(',')[0]},{len(r.split(',')[0].split()) / 2}" for r in classify_rows(12, 6)]
    write_csv(tmp_path / "scores.csv", scores)
    results = finetune("classify", pretrained, tmp_path / "scores.csv", tmp_path / "scores.csv", tmp_path / "reg",
                       FinetuneConfig(regression=True, epochs=1, **QUICK))
    assert results["metric"] == "pearson" and {"pearson", "spearmanr", "mse"} <= set(results["best"])
    (score,) = predict(tmp_path / "reg" / "model", "classify", ["a good film"])
    assert set(score) == {"score"}


# ------------------------------------------------------------------------------------------------------------------
# NER
# ------------------------------------------------------------------------------------------------------------------
def conll(sentences: list[list[tuple[str, str]]]) -> str:
    return "-DOCSTART- O\n\n" + "\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in sentences) + "\n"


def ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """IOB1 as in CoNLL-2003: "I-" everywhere; two-word places ("parisville rome") are one entity."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        place = [(rng.choice(PLACES), "I-LOC")] + ([("parisville", "I-LOC")] if rng.random() < 0.3 else [])
        out.append([(rng.choice(PEOPLE), "I-PER"), ("lives", "O"), ("in", "O"), *place, (".", "O")])
    return out


def test_ner_first_sub_word_alignment_training_and_spans(pretrained, tmp_path, capsys):
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(conll(ner_sentences(40, 0)), encoding="utf-8")
    dev.write_text(conll(ner_sentences(10, 1)), encoding="utf-8")

    # Inside the pipeline: IOB1 becomes BIO and only each word's first sub-word carries a label.
    family = family_for("ner")(FinetuneConfig(kind="ner", max_seq_length=24))
    tokenizer = WordPieceTokenizer.from_pretrained(pretrained)
    family.read(train, training=True)  # collects the labels
    words = ["john", "parisville", "."]
    (feature,) = family.features([(words, ["B-PER", "B-LOC", "O"])], tokenizer, training=True)
    assert family.labels == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    pieces = tokenizer.convert_ids_to_tokens(feature["input_ids"])
    assert len(pieces) > len(words) + 2, f"'parisville' should be several word pieces: {pieces}"
    first = [i for i, w in enumerate(feature["word_ids"]) if w is not None and w != feature["word_ids"][i - 1]]
    assert [feature["labels"][i] for i in first] == [3, 1, 0]
    assert all(label == IGNORE_INDEX for i, label in enumerate(feature["labels"]) if i not in first)

    results = finetune("ner", pretrained, train, dev, tmp_path / "out", FinetuneConfig(epochs=10, dropout=0.0, **QUICK))
    assert results["metric"] == "f1" and results["best"]["f1"] > 0.9
    assert code_and_json(["evaluate", "ner", "--data", str(dev), "--predictions",
                          str(tmp_path / "out" / "dev_predictions.conll")], capsys)[1]["f1"] == results["best"]["f1"]

    (result,) = predict(tmp_path / "out" / "model", "ner", ["Mary lives in Rome parisville."])
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in result["entities"]] == [
        ("PER", "Mary", 0, 4), ("LOC", "Rome parisville", 14, 29)]
    assert result["words"] == ["Mary", "lives", "in", "Rome", "parisville", "."]
    assert all(0 < e["score"] <= 1 for e in result["entities"])


def test_tags_to_spans_reads_bio_iob1_and_iobes():
    assert tags_to_spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == [
        ("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 5), ("ORG", 5, 6)]
    assert tags_to_spans(["S-PER", "B-LOC", "I-LOC", "E-LOC", "O"]) == [("PER", 0, 1), ("LOC", 1, 4)]
    assert tags_to_spans(["O", "O"]) == []


# ------------------------------------------------------------------------------------------------------------------
# SQuAD 2.0
# ------------------------------------------------------------------------------------------------------------------
def squad_file(path: Path, seed: int, mismatch: bool = False) -> Path:
    rng = random.Random(seed)
    articles = []
    for a in range(4):
        people = rng.sample(PEOPLE, 2)
        places = rng.sample(PLACES, 2)
        context = f"{people[0]} lives in {places[0]} . {people[1]} lives in {places[1]} ."
        qas = []
        for k in range(2):
            start = context.index(places[k])
            qas.append({"id": f"{seed}-{a}-{k}", "question": f"where does {people[k]} live ?",
                        "answers": [{"text": places[k], "answer_start": start}], "is_impossible": False})
        absent = next(p for p in PEOPLE if p not in people)
        qas.append({"id": f"{seed}-{a}-x", "question": f"where does {absent} live ?", "answers": [],
                    "plausible_answers": [{"text": places[0], "answer_start": context.index(places[0])}],
                    "is_impossible": True})
        articles.append({"title": f"t{a}", "paragraphs": [{"context": context, "qas": qas}]})
    if mismatch:  # an answer_start that does not point at its text: counted and reported, not trained on
        articles[0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    path.write_text(json.dumps({"version": "v2.0", "data": articles}), encoding="utf-8")
    return path


def test_squad_v2_end_to_end_with_official_files(pretrained, tmp_path, capsys):
    train = squad_file(tmp_path / "train.json", 0, mismatch=True)
    dev = squad_file(tmp_path / "dev.json", 1)
    config = FinetuneConfig(epochs=2, max_seq_length=24, doc_stride=8, max_query_length=8, batch_size=4,
                            progress=False)
    results = finetune("squad", pretrained, train, dev, tmp_path / "out", config)
    assert results["data"]["train"]["answers_not_matching_context"] == 1
    assert results["data"]["train"]["skipped_for_training"] == 1
    assert results["data"]["train"]["windows"] > 11  # 24-token windows: the contexts are cut in two or more
    assert results["metric"] == "best_f1" and "best_f1_thresh" in results["best"]

    predictions_text = (tmp_path / "out" / "predictions.json").read_text()
    predictions, null_odds = json.loads(predictions_text), json.loads((tmp_path / "out" / "null_odds.json").read_text())
    assert predictions_text.startswith("{\n    \"") and predictions_text.endswith("}\n")  # run_squad.py's layout
    qids = {f"1-{a}-{k}" for a in range(4) for k in ("0", "1", "x")}
    assert set(predictions) == qids == set(null_odds)
    assert all(isinstance(v, str) for v in predictions.values())
    assert all(isinstance(v, float) for v in null_odds.values())

    code, metrics = code_and_json(["evaluate", "squad", "--data", str(dev), "--predictions",
                                   str(tmp_path / "out" / "predictions.json"), "--null-odds",
                                   str(tmp_path / "out" / "null_odds.json")], capsys)
    assert code == 0
    assert set(metrics) == {"exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                            "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"}
    assert metrics["total"] == 12 and metrics["NoAns_total"] == 4
    assert metrics["best_f1"] == pytest.approx(results["best"]["best_f1"])

    (answer,) = predict(tmp_path / "out" / "model", "squad", [("where does john live ?",
                                                                 "john lives in paris . mary lives in rome .")])
    assert isinstance(answer["answer"], str) and 0 <= answer["score"] <= 1 and "null_odds" in answer


# ------------------------------------------------------------------------------------------------------------------
# SWAG
# ------------------------------------------------------------------------------------------------------------------
def swag_file(path: Path, n: int, seed: int) -> Path:
    """The right ending repeats the context's place; the wrong ones name another."""
    rng = random.Random(seed)
    rows = ["video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"]
    for i in range(n):
        place, person = rng.choice(PLACES), rng.choice(PEOPLE)
        others = [p for p in PLACES if p != place]
        label = rng.randrange(4)
        endings = others[:label] + [place] + others[label:]
        rows.append(f"v{i},{i},x,{person} lives in {place} .,{person},gold,"
                    + ",".join(f"walks to {e} ." for e in endings[:4]) + f",{label}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_swag_end_to_end(pretrained, tmp_path, capsys):
    train, dev = swag_file(tmp_path / "train.csv", 16, 0), swag_file(tmp_path / "val.csv", 8, 1)
    results = finetune("swag", pretrained, train, dev, tmp_path / "out",
                       FinetuneConfig(epochs=2, batch_size=4, progress=False, max_seq_length=24))
    assert results["metric"] == "accuracy" and len(results["epochs"]) == 2
    assert 0.0 <= results["best"]["accuracy"] <= 1.0
    code, metrics = code_and_json(["evaluate", "swag", "--data", str(dev), "--predictions",
                                   str(tmp_path / "out" / "dev_predictions.txt")], capsys)
    assert metrics["accuracy"] == results["best"]["accuracy"]
    (choice,) = predict(tmp_path / "out" / "model", None, [("john lives in rome .", ["walks to rome .",
                                                                                   "walks to paris ."])])
    assert choice["choice"] in (0, 1) and sum(choice["probabilities"]) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------------------------
# Bad input through the command line
# ------------------------------------------------------------------------------------------------------------------
def code_and_json(argv: list[str], capsys) -> tuple[int, dict]:
    capsys.readouterr()  # drop what came before
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out) if code == 0 else {}


def test_unknown_dev_label_is_one_line_naming_file_and_line(pretrained, tmp_path, capsys):
    train = write_csv(tmp_path / "train.csv", classify_rows(8, 0))
    dev = write_csv(tmp_path / "dev.csv", classify_rows(3, 1) + ["a good film,neutral"])
    code = main(["finetune", "classify", "--model", str(pretrained), "--train", str(train), "--dev", str(dev),
                 "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"bertkit: error: {dev}:5: unknown label 'neutral'")


def test_a_head_with_another_number_of_labels_is_explained(pretrained, tmp_path, capsys):
    three = BertForSequenceClassification.from_pretrained(pretrained, num_labels=3, labels=["a", "b", "c"])
    three.save_pretrained(tmp_path / "three", tokenizer=WordPieceTokenizer.from_pretrained(pretrained))
    train = write_csv(tmp_path / "train.csv", classify_rows(8, 0))
    dev = write_csv(tmp_path / "dev.csv", classify_rows(4, 1))
    argv = ["finetune", "classify", "--model", str(tmp_path / "three"), "--train", str(train), "--dev", str(dev),
            "--out", str(tmp_path / "out"), "--quiet", "--epochs", "1", "--batch-size", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: ") and err.count("\n") == 1
    assert "classifier." in err and "does not fit the task" in err and "--new-head" in err
    assert main(argv + ["--new-head"]) == 0
    assert json.loads((tmp_path / "out" / "model" / "config.json").read_text())["id2label"] == {"0": "neg",
                                                                                                "1": "pos"}


def test_evaluate_reads_glue_submissions_and_checks_counts(tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngood\t1\nbad\t0\nfine\t1\n", encoding="utf-8")
    submission = tmp_path / "SST-2.tsv"
    submission.write_text("index\tprediction\n2\t0\n0\t1\n1\t0\n", encoding="utf-8")
    assert evaluate_predictions("glue", dev, submission, task="SST-2") == {"accuracy": pytest.approx(2 / 3)}
    lines = tmp_path / "lines.txt"
    lines.write_text("1\n0\n", encoding="utf-8")
    assert main(["evaluate", "glue", "--task", "sst2", "--data", str(dev), "--predictions", str(lines)]) == 2
    assert "2 predictions for 3 examples" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["finetune", "evaluate", "predict", "features"])
def test_help(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--help"])
    assert exit_info.value.code == 0
    assert "usage: bertkit " + verb in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------------------------
# The same rows in any format give the same run
# ------------------------------------------------------------------------------------------------------------------
def _same_run(a: Path, b: Path) -> None:
    """Two run directories trained identically: per-epoch metrics, every logged loss, dev predictions, weights."""
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    assert ra["epochs"] == rb["epochs"] and ra["best"] == rb["best"] and ra["labels"] == rb["labels"]
    losses = [[json.loads(line).get("loss") for line in (d / "metrics.jsonl").read_text().splitlines()]
              for d in (a, b)]
    assert losses[0] == losses[1] and len([x for x in losses[0] if x is not None]) > 4
    for name in ("dev_predictions.txt", "dev_predictions.conll"):
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "model" / "model.safetensors").read_bytes() == (b / "model" / "model.safetensors").read_bytes()


def test_tsv_parquet_and_a_datasets_directory_fine_tune_identically(pretrained, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the save_to_disk fixture")
    splits = {"train": classify_rows(24, 5), "dev": classify_rows(8, 6)}
    for split, rows in splits.items():
        texts, labels = zip(*(row.rsplit(",", 1) for row in rows))
        (tmp_path / f"{split}.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in zip(texts, labels)))
        columns = {"sentence": list(texts), "gold": list(labels), "n": list(range(len(texts)))}
        pq.write_table(pa.table(columns), tmp_path / f"{split}.parquet", row_group_size=5)
        datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "saved" / split))
    config = FinetuneConfig(epochs=2, dropout=0.1, seed=3, **QUICK)
    finetune("classify", pretrained, tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "tsv", config)
    columns = dataclasses.replace(config, text_column="sentence", label_column="gold")
    finetune("classify", pretrained, tmp_path / "train.parquet", tmp_path / "dev.parquet", tmp_path / "parquet",
             columns)
    _same_run(tmp_path / "tsv", tmp_path / "parquet")
    # On the command line: a DatasetDict directory's splits, --format datasets, the column options.
    common = ["--model", str(pretrained), "--quiet", "--epochs", "2", "--seed", "3", "--batch-size", "8",
              "--learning-rate", "3e-3", "--log-every", "1", "--max-seq-length", "24"]
    assert main(["finetune", "classify", "--train", str(tmp_path / "train.tsv"), "--dev", str(tmp_path / "dev.tsv"),
                 "--out", str(tmp_path / "tsv-cli"), *common]) == 0
    code = main(["finetune", "classify", "--train", str(tmp_path / "saved" / "train"),
                 "--dev", str(tmp_path / "saved" / "dev"), "--out", str(tmp_path / "saved-cli"), *common,
                 "--format", "datasets", "--text-column", "sentence", "--label-column", "gold"])
    assert code == 0, capsys.readouterr().err
    _same_run(tmp_path / "tsv-cli", tmp_path / "saved-cli")
    # `evaluate` reads the Parquet dev file as fine-tuning did.
    assert code_and_json(["evaluate", "classify", "--data", str(tmp_path / "dev.parquet"), "--text-column",
                          "sentence", "--label-column", "gold", "--predictions",
                          str(tmp_path / "parquet" / "dev_predictions.txt")], capsys)[1]["accuracy"] == \
        json.loads((tmp_path / "tsv" / "results.json").read_text())["best"]["accuracy"]


def test_conll_and_parquet_with_class_label_tags_fine_tune_ner_identically(pretrained, tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the ClassLabel fixture")
    names = ["O", "I-PER", "I-LOC", "B-PER", "B-LOC"]  # IOB1 tags as CoNLL-2003 writes them, in a ClassLabel
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    for split, seed, n in (("train", 0, 24), ("dev", 1, 8)):
        sentences = ner_sentences(n, seed)
        (tmp_path / f"{split}.txt").write_text(conll(sentences), encoding="utf-8")
        datasets.Dataset.from_dict({"tokens": [[w for w, _ in s] for s in sentences],
                                    "ner_tags": [[names.index(t) for _, t in s] for s in sentences]},
                                   features=features).to_parquet(str(tmp_path / f"{split}.parquet"))
    config = FinetuneConfig(epochs=2, dropout=0.1, seed=4, **QUICK)
    finetune("ner", pretrained, tmp_path / "train.txt", tmp_path / "dev.txt", tmp_path / "conll", config)
    finetune("ner", pretrained, tmp_path / "train.parquet", tmp_path / "dev.parquet", tmp_path / "parquet", config)
    _same_run(tmp_path / "conll", tmp_path / "parquet")
    assert code_and_json(["evaluate", "ner", "--data", str(tmp_path / "dev.parquet"), "--predictions",
                          str(tmp_path / "parquet" / "dev_predictions.conll")], capsys)[1]["f1"] == \
        json.loads((tmp_path / "conll" / "results.json").read_text())["best"]["f1"]
