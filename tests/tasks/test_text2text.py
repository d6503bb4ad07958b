"""Text to text (bertkit.tasks.text2text): T5's inputs and targets for GLUE, tables and SQuAD, generated labels
scored with the official metrics (an unrecognised one counted as wrong), the predictions file scoring the same under
`bertkit evaluate`, fine-tuning a tiny T5 through the CLI, predict, generate (greedy and beam, as transformers),
features and tokenize on a T5 directory, and one-line errors for the verbs a T5 cannot serve."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.config import T5Config
from bertkit.models import T5ForConditionalGeneration
from bertkit.tasks.run import FinetuneConfig, collate
from bertkit.tasks.classify import Example
from bertkit.tasks.squad import SquadExample
from bertkit.tasks.text2text import Text2TextFamily
from bertkit.tokenizers import UnigramTokenizer

POS = "good great fine lovely superb nice".split()
NEG = "bad awful poor dull terrible weak".split()
FILL = "the movie plot was and a film acting story it".split()
WORDS = ["positive", "negative", "equivalent", "not_equivalent", "acceptable", "unacceptable", "question:",
         "context:", "sst2", "mrpc", "sentence:", "sentence1:", "sentence2:", "classify", "text:", "pos", "neg",
         "0.0 1.2 2.4 3.8 4.6 5.0 -1 7 9", "Ann wrote it in May. Who? When? Why?"]


@pytest.fixture(scope="module")
def tokenizer() -> UnigramTokenizer:
    return UnigramTokenizer.train((POS + NEG + FILL + WORDS) * 20, vocab_size=120, extra_ids=10, show_progress=False)


def t5_dir(path: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    torch.manual_seed(seed)
    config = T5Config(**{"vocab_size": tokenizer.vocab_size, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
                         "num_heads": 4, "dropout_rate": 0.0, **overrides})
    T5ForConditionalGeneration(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def sst2_files(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """A sentiment task a tiny model learns in a few epochs: one sentiment word among filler words; 2/3 negative."""
    rng = random.Random(seed)

    def sentence(label: int) -> str:
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 6))] + [rng.choice(POS if label else NEG)]
        rng.shuffle(words)
        return " ".join(words)

    paths = []
    for name, n in (("train", 192), ("dev", 48)):
        rows = [(sentence(y), y) for y in (rng.choice([0, 0, 1]) for _ in range(n))]
        path = root / f"{name}.tsv"
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def family(kind: str, task: str | None = None, **fields) -> Text2TextFamily:
    return Text2TextFamily(FinetuneConfig(kind=kind, task=task, **fields))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- inputs and targets ----------------------------------------------------------------------------------------
def test_inputs_and_targets_are_t5s():
    mrpc = family("glue", "mrpc")
    pair = Example("A man runs.", "A man is running.", "1", 2)
    assert mrpc.source(pair) == "mrpc sentence1: A man runs. sentence2: A man is running."
    assert mrpc.target(pair) == "equivalent" and mrpc.target(Example("a", "b", "0", 3)) == "not_equivalent"
    mnli = family("glue", "mnli")
    assert mnli.source(Example("The premise.", "The hypothesis.", "neutral", 2)) == \
        "mnli hypothesis: The hypothesis. premise: The premise."
    sst2 = family("glue", "sst2")
    assert sst2.source(Example("a gem .", None, "1", 2)) == "sst2 sentence: a gem ." and \
        sst2.target(Example("x", None, "0", 2)) == "negative"
    assert family("glue", "cola").target(Example("x", None, "1", 2)) == "acceptable"
    assert family("glue", "qnli").source(Example("Why?", "Because.", "entailment", 2)) == \
        "qnli question: Why? sentence: Because."
    stsb = family("glue", "stsb")
    assert [stsb.target(Example("a", "b", x, 2)) for x in (3.75, 3.69, 0.0, 5.0)] == ["3.8", "3.6", "0.0", "5.0"]
    table = family("classify", pair_column="hypothesis", text_column="premise")
    table.labels = ["no", "yes"]
    assert table.source(Example("P.", "H.", "yes", 2)) == "classify premise: P. hypothesis: H."
    assert table.target(Example("P.", "H.", "yes", 2)) == "yes"
    assert family("classify", regression=True).target(Example("x", None, 2.345, 2)) == "2.35"
    squad = family("squad")
    question = SquadExample("q1", "Who?", "Ann wrote it.", [("Ann", 0)], False)
    assert squad.source(question) == "question: Who? context: Ann wrote it." and squad.target(question) == "Ann"
    assert squad.target(SquadExample("q2", "Why?", "No.", [], True)) == ""


def test_features_cut_long_texts_and_count_them(tokenizer, tmp_path, capsys):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "good film\t1\n" + " ".join(["bad"] * 40) + " film\t0\n",
                     encoding="utf-8")
    fits = max(8, len(tokenizer.encode("sst2 sentence: good film").input_ids))  # the short one just fits
    sst2 = family("glue", "sst2", max_seq_length=fits, max_target_length=2)
    examples = sst2.read(train, training=True)
    features = sst2.features(examples, tokenizer, training=True)
    assert [len(f["input_ids"]) for f in features] == [len(tokenizer.encode("sst2 sentence: good film").input_ids),
                                                       fits]
    assert all(f["input_ids"][-1] == tokenizer.sep_id for f in features)
    assert all(len(f["target_ids"]) == 2 and f["target_ids"][-1] == tokenizer.sep_id for f in features)
    assert sst2.stats["train"]["inputs_truncated"] == 1
    assert sst2.stats["train"]["targets_truncated"] == 2  # "positive" / "negative" need more than one piece
    err = capsys.readouterr().err
    assert f"{train}: 2 of 2 targets are longer than max_target_length 2" in err and "line 2" in err
    assert "--max-target-length" in err
    batch = collate(features, tokenizer.pad_id)
    assert batch["labels"].shape == (2, 2) and batch["input_ids"].shape[0] == 2


# ---- scoring ---------------------------------------------------------------------------------------------------
def generations(tokenizer, texts: list[str]) -> list[np.ndarray]:
    return [np.array(e.ids, dtype=np.int64) for e in tokenizer.encode_raw(texts)]


def test_unrecognised_labels_count_as_wrong_and_score_the_same_from_the_file(tokenizer, tmp_path):
    dev = tmp_path / "dev.tsv"
    rows = [("a", "b", 1), ("c", "d", 0), ("e", "f", 1), ("g", "h", 0), ("i", "j", 1)]
    dev.write_text("#1 String\t#2 String\tQuality\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows),
                   encoding="utf-8")
    mrpc = family("glue", "mrpc")
    examples = mrpc.read(dev, training=False)
    mrpc.features(examples, tokenizer, training=False)
    said = ["equivalent", "equivalent", "movie", "not_equivalent", ""]  # two unrecognised: wrong either way
    metrics, output = mrpc.evaluate(examples, None, generations(tokenizer, said))
    # T5's rule: an unrecognised label is the label other than gold -> predicted 1, 1, 0, 0, 0 against 1 0 1 0 1
    assert metrics == {"accuracy": pytest.approx(2 / 5), "f1": pytest.approx(2 * 1 / (2 * 1 + 1 + 2)),
                       "unrecognized": 2}
    mrpc.write_predictions(tmp_path, examples, output)
    assert (tmp_path / "dev_predictions.txt").read_text().splitlines() == ["1", "1", "movie", "0", "<empty>"]
    scored = json.loads(_evaluate(["glue", "--task", "mrpc", "--data", dev, "--predictions",
                                   tmp_path / "dev_predictions.txt"]))
    assert scored == metrics


def test_scores_and_answers_are_scored_as_the_file_is(tokenizer, tmp_path):
    stsb_dev = tmp_path / "stsb.tsv"
    stsb_dev.write_text("sentence1\tsentence2\tscore\nx\ty\t1.0\nz\tw\t4.0\nu\tv\t2.5\n", encoding="utf-8")
    stsb = family("glue", "stsb")
    examples = stsb.read(stsb_dev, training=False)
    stsb.features(examples, tokenizer, training=False)
    metrics, output = stsb.evaluate(examples, None, generations(tokenizer, ["1.2", "good", "2.4"]))
    assert metrics["unrecognized"] == 1 and output == ["1.2", "-1", "2.4"]  # T5 scores an unparsable text -1
    stsb.write_predictions(tmp_path, examples, output)
    file_metrics = json.loads(_evaluate(["glue", "--task", "stsb", "--data", stsb_dev, "--predictions",
                                         tmp_path / "dev_predictions.txt"]))
    assert file_metrics == {k: v for k, v in metrics.items() if k != "unrecognized"}

    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "Ann wrote it in May.", "qas": [
        {"id": "a", "question": "Who?", "answers": [{"text": "Ann", "answer_start": 0}], "is_impossible": False},
        {"id": "b", "question": "When?", "answers": [{"text": "May", "answer_start": 16}], "is_impossible": False},
        {"id": "c", "question": "Why?", "answers": [], "is_impossible": True}]}]}]}
    squad_dev = tmp_path / "dev.json"
    squad_dev.write_text(json.dumps(data), encoding="utf-8")
    squad = family("squad")
    examples = squad.read(squad_dev, training=False)
    squad.features(examples, tokenizer, training=False)
    metrics, predictions = squad.evaluate(examples, None, generations(tokenizer, ["Ann", "in May", ""]))
    assert predictions == {"a": "Ann", "b": "in May", "c": ""}
    assert metrics["exact"] == pytest.approx(200 / 3) and metrics["total"] == 3
    squad.write_predictions(tmp_path, examples, predictions)
    assert json.loads(_evaluate(["squad", "--data", squad_dev, "--predictions", tmp_path / "predictions.json"])) \
        == metrics


def _evaluate(args: list) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["evaluate", *[str(a) for a in args]]) == 0
    return buffer.getvalue()


# ---- the CLI end to end ----------------------------------------------------------------------------------------
def test_t5_finetunes_on_glue_through_the_cli_and_predicts(tokenizer, tmp_path, capsys):
    model = t5_dir(tmp_path / "t5", tokenizer)
    train, dev = sst2_files(tmp_path)
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "finetune", "glue", "--task", "sst2", "--model", model, "--train", train,
                            "--dev", dev, "--out", out, "--epochs", "5", "--lr", "3e-3", "--batch-size", "8",
                            "--warmup-ratio", "0.05", "--quiet")
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    majority = max(sum(line.endswith("\t0") for line in dev.read_text().splitlines()[1:]),
                   sum(line.endswith("\t1") for line in dev.read_text().splitlines()[1:])) / 48
    assert results["best"]["accuracy"] > majority + 0.2, results["epochs"]
    assert results["data"]["train"]["targets_truncated"] == 0 and "unrecognized" in results["best"]
    info = json.loads((out / "model" / "finetune.json").read_text())
    assert info["text_to_text"] and info["kind"] == "glue" and info["task"] == "sst2"
    code, stdout, _ = cli(capsys, "evaluate", "glue", "--task", "sst2", "--data", dev, "--predictions",
                          out / "dev_predictions.txt", "--compact")
    assert code == 0 and json.loads(stdout)["accuracy"] == pytest.approx(results["best"]["accuracy"])
    transformers = pytest.importorskip("transformers")
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(str(out / "model"))
    assert theirs.config.d_model == 32
    # predict says what the dev evaluation said, for a sentence of each label
    sentences = [line.split("\t")[0] for line in dev.read_text().splitlines()[1:]]
    said = (out / "dev_predictions.txt").read_text().splitlines()
    for label in ("0", "1"):
        i = said.index(label)
        code, stdout, _ = cli(capsys, "predict", "classify", "--model", out / "model", "--text", sentences[i],
                              "--json")
        word = {"0": "negative", "1": "positive"}[label]
        assert code == 0 and json.loads(stdout) == {"label": label, "text": word}
    code, stdout, _ = cli(capsys, "predict", "classify", "--model", out / "model", "--text", sentences[i])
    assert code == 0 and stdout.strip() == "1"


def test_t5_finetunes_on_squad_and_its_predictions_score_the_same(tokenizer, tmp_path, capsys):
    rng = random.Random(1)
    paragraphs = []
    for i in range(12):
        name = rng.choice(POS + NEG)
        context = f"the {rng.choice(FILL)} was {name} and {rng.choice(FILL)}"
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": "what was it?",
                                                        "answers": [{"text": name,
                                                                     "answer_start": context.index(name)}]}]})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = cli(capsys, "finetune", "squad", "--model", t5_dir(tmp_path / "t5", tokenizer), "--train", path,
                       "--dev", path, "--out", out, "--epochs", "2", "--batch-size", "4", "--lr", "3e-3", "--quiet")
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["metric"] == "f1" and set(results["best"]) >= {"exact_match", "f1"}
    code, stdout, _ = cli(capsys, "evaluate", "squad", "--data", path, "--predictions", out / "predictions.json")
    scored = json.loads(stdout)
    assert scored == {k: pytest.approx(results["best"][k]) for k in ("exact_match", "f1")}
    code, stdout, _ = cli(capsys, "predict", "squad", "--model", out / "model", "--question", "what was it?",
                          "--context", "the film was good", "--json")
    assert code == 0 and set(json.loads(stdout)) == {"answer", "text"}


def test_generate_matches_transformers_greedy_and_beam(tokenizer, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    model = t5_dir(tmp_path / "t5", tokenizer, seed=3, initializer_factor=3.0)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(str(model)).eval()
    prompts = ["sst2 sentence: a good film", "question: who? context: the plot was dull"]

    def expected(text: str, **kwargs) -> list[int]:
        ids = torch.tensor([tokenizer.encode(text).input_ids])
        out = theirs.generate(input_ids=ids, do_sample=False, max_new_tokens=9, **kwargs)[0, 1:].tolist()
        return out[:out.index(1)] if 1 in out else out

    for extra, kwargs in (([], {"num_beams": 1}),
                          (["--num-beams", "3", "--length-penalty", "0.5"],
                           {"num_beams": 3, "length_penalty": 0.5, "early_stopping": True})):
        code, stdout, _ = cli(capsys, "generate", "--model", model, "--max-new-tokens", "9", "--json", *extra,
                              *prompts)
        assert code == 0
        items = [json.loads(line) for line in stdout.splitlines()]
        assert [item["ids"] for item in items] == [expected(p, **kwargs) for p in prompts]
        assert items[0]["prompt"] == prompts[0]
    sampled = [cli(capsys, "generate", "--model", model, "--temperature", "1.5", "--top-k", "5", "--seed", "4",
                   "--json", prompts[0])[1] for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_features_and_tokenize_on_a_t5_directory_are_transformers(tokenizer, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from bertkit.features import read_features

    model = t5_dir(tmp_path / "t5", tokenizer, seed=5)
    lines = ["a good film", "the plot was awful and dull"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "features", "--model", model, "--input", tmp_path / "in.txt", "--out",
                       tmp_path / "f.safetensors", "--layers=-1,0,1", "--combine", "none")
    assert code == 0, err
    features, tokens = read_features(tmp_path / "f.safetensors")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(model))
    encoder = transformers.T5EncoderModel.from_pretrained(str(model)).eval()
    for text, ours, pieces in zip(lines, features, tokens):
        ids = hf_tok(text, return_tensors="pt").input_ids
        states = encoder(input_ids=ids, output_hidden_states=True).hidden_states
        assert pieces == hf_tok.convert_ids_to_tokens(ids[0])
        want = torch.stack([states[-1][0], states[0][0], states[1][0]], dim=1)  # (T, 3, d)
        assert np.allclose(ours, want.detach().numpy(), atol=1e-5)
    code, stdout, _ = cli(capsys, "tokenize", "--model-or-vocab", model, "the film was superb", "--json")
    assert json.loads(stdout)["input_ids"] == hf_tok("the film was superb").input_ids


@pytest.mark.parametrize("argv,verb", [
    (["finetune", "ner", "--train", "{d}/x", "--dev", "{d}/x", "--out", "{d}/o"], "bertkit finetune ner"),
    (["finetune", "swag", "--train", "{d}/x", "--dev", "{d}/x", "--out", "{d}/o"], "bertkit finetune swag"),
    (["predict", "ner", "--text", "x"], "bertkit predict ner"),
    (["fill-mask", "a [MASK] film"], "bertkit fill-mask"),
])
def test_verbs_that_cannot_take_a_t5_say_so(tokenizer, tmp_path, capsys, argv, verb):
    model = t5_dir(tmp_path / "t5", tokenizer)
    args = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, _, err = cli(capsys, *args[:2], "--model", model, *args[2:])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"bertkit: error: {verb}: ") and "model_type t5" in err


def test_predict_needs_a_fine_tuned_t5(tokenizer, tmp_path, capsys):
    code, _, err = cli(capsys, "predict", "classify", "--model", t5_dir(tmp_path / "t5", tokenizer), "--text", "x")
    assert code == 2 and "not fine-tuned for a task" in err and "bertkit generate" in err
