"""--task-model logistic (bertkit.features): the L-BFGS fit equals scikit-learn's LogisticRegression (multinomial for
3+ classes, binary with the same C for 2), a frozen classify run fits it to its standardised pooled layers and keeps
results, model and predictions as a trained run does, reruns, a shared feature cache and a repeated label set give
bit-identical heads, and wrong uses are one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.linear_model import LogisticRegression
from test_features_frozen import SENTENCES, TEXTS
from test_features_predict import cli_json, predicted, save_fixed_bert

from bertkit.cli import main
from bertkit.features import FeatureTaskModel, fit_logistic_regression
from bertkit.tasks.finetune import FinetuneConfig

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------------------------
# The fit against scikit-learn
# ------------------------------------------------------------------------------------------------------------------
def problem(n: int, d: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random features with a class signal on the first column (every class present)."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.arange(k), rng.integers(0, k, size=n - k)])
    x = rng.normal(size=(n, d)) + 0.8 * y[:, None] * (np.arange(d) == 0)
    return x, y


def sklearn_fit(x, y, c, sample_weight=None) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=10000, tol=1e-10).fit(x, y, sample_weight=sample_weight)


def probabilities(weight, bias, x) -> np.ndarray:
    return torch.softmax(torch.from_numpy(x) @ weight.T + bias, dim=-1).numpy()


# Measured differences to scikit-learn over these cases: probabilities <= 1.3e-7, weights and intercepts <= 3.4e-6
# (scikit-learn's own stopping: it ends on a flat loss as well as on its gradient tolerance).
@pytest.mark.parametrize("n, d", [(40, 5), (30, 50), (120, 12)])
@pytest.mark.parametrize("c", [0.1, 1.0, 10.0])
def test_three_and_more_classes_fit_scikit_learns_multinomial_logistic_regression(n, d, c):
    for k in (3, 4):
        x, y = problem(n, d, k)
        weight, bias, facts = fit_logistic_regression(torch.from_numpy(x), torch.from_numpy(y), k, c)
        assert weight.dtype == torch.float64 and facts["gradient_max"] <= 1e-8
        reference = sklearn_fit(x, y, c)
        np.testing.assert_allclose(probabilities(weight, bias, x), reference.predict_proba(x), atol=1e-6)
        np.testing.assert_allclose(weight.numpy(), reference.coef_, atol=2e-5)
        # intercepts are defined up to a common shift: ours sum to 0, compare both centred
        assert abs(float(bias.sum())) < 1e-12
        np.testing.assert_allclose(bias.numpy(), reference.intercept_ - reference.intercept_.mean(), atol=2e-5)


@pytest.mark.parametrize("n, d", [(40, 5), (30, 50), (120, 12)])
@pytest.mark.parametrize("c", [0.1, 1.0, 10.0])
def test_two_classes_fit_scikit_learns_binary_logistic_regression_with_the_same_c(n, d, c):
    x, y = problem(n, d, 2)
    weight, bias, _ = fit_logistic_regression(torch.from_numpy(x), torch.from_numpy(y), 2, c)
    reference = sklearn_fit(x, y, c)  # one vector d: P(1) = sigmoid(d x + b)
    np.testing.assert_allclose(probabilities(weight, bias, x), reference.predict_proba(x), atol=1e-6)
    np.testing.assert_allclose((weight[1] - weight[0]).numpy(), reference.coef_[0], atol=2e-5)
    np.testing.assert_allclose(float(bias[1] - bias[0]), reference.intercept_[0], atol=2e-5)
    # the rows are -d/2 and d/2: the penalty k ||W||^2 / 2 with k = 2 is scikit-learn's ||d||^2 / 2
    np.testing.assert_allclose(weight[0].numpy(), -weight[1].numpy(), atol=1e-12)


def test_row_weights_count_as_repeated_rows():
    x, y = problem(30, 6, 3, seed=1)
    counts = np.random.default_rng(2).integers(1, 4, size=len(x))
    weight, bias, _ = fit_logistic_regression(torch.from_numpy(x), torch.from_numpy(y), 3, 0.5,
                                              torch.from_numpy(counts).double())
    repeated = sklearn_fit(np.repeat(x, counts, axis=0), np.repeat(y, counts), 0.5)
    np.testing.assert_allclose(probabilities(weight, bias, x), repeated.predict_proba(x), atol=1e-6)
    np.testing.assert_allclose(weight.numpy(), repeated.coef_, atol=2e-5)


def test_a_fit_that_cannot_converge_is_an_error_naming_c():
    x, y = problem(40, 5, 3)
    with pytest.raises(RuntimeError, match=r"did not converge .* --logistic-c \(now 1\)"):
        fit_logistic_regression(torch.from_numpy(x), torch.from_numpy(y), 3, 1.0, max_iter=3)


# ------------------------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A tiny BERT (hidden 32, 2 layers) with a fixed vocabulary, and labelled files: train_a (the first eight
    sentences), train_b (the others and two dev sentences), dev (every text)."""
    root = tmp_path_factory.mktemp("logistic")
    words = save_fixed_bert(root / "bert", hidden=32, layers=2)
    # distinct texts: the sentences with another known word each, so that every row is its own input
    rows = [(f"{' '.join(w)} {words[i]}", "person" if "B-PER" in t else "none")
            for i, (w, t) in enumerate(SENTENCES)] + [(TEXTS[-2], "none"), (TEXTS[-1], "none")]

    def write(name, chosen):
        (root / name).write_text("text\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in chosen), encoding="utf-8")

    write("train_a.tsv", rows[:8])
    write("train_b.tsv", rows[8:] + rows[:2])
    write("train_b2.tsv", (rows[8:] + rows[:2]) * 2)
    write("dev.tsv", rows)
    return root


def run(task, out, train="train_a.tsv", *flags) -> dict:
    assert main(["finetune", "classify", "--model", str(task / "bert"), "--train", str(task / train), "--dev",
                 str(task / "dev.tsv"), "--out", str(out), "--frozen", "--task-model", "logistic", "--layers=-1",
                 "--logistic-c", "0.3", "--quiet", *flags]) == 0
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def head_of(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "task_model.safetensors"))


def test_a_logistic_run_writes_what_a_trained_run_writes_and_predicts_as_its_dev_predictions(task, tmp_path, capsys):
    results = run(task, tmp_path / "run", "train_a.tsv", "--epochs", "7", "--batch-size", "64")  # ignored
    assert results["steps"] == 0 and results["stopped_by"] == "fit" and results["max_steps"] == 0
    assert [e["epoch"] for e in results["epochs"]] == [1] and results["best"] == results["epochs"][0]
    assert 0.0 <= results["best"]["accuracy"] <= 1.0 and results["confusion_matrix"]["labels"] == ["none", "person"]
    assert results["features"]["combine"] == "concat" and results["config"]["combine"] is None
    fit = results["fit"]
    assert fit["rows"] == fit["distinct_rows"] == 8 and fit["repeats"] == 1 and fit["gradient_max"] <= 1e-8
    for name in ("eval.jsonl", "dev_predictions.txt", "confusion_matrix.json", "model/task_model.json"):
        assert (tmp_path / "run" / name).is_file(), name
    head = head_of(tmp_path / "run")
    assert set(head) == {"head.weight", "head.bias", "feature_mean", "feature_scale"}
    assert head["head.weight"].shape == (2, 2 * 32) and head["head.weight"].dtype == torch.float32

    # The buffers are the training rows' pooled mean and population standard deviation; the head is scikit-learn's
    # binary fit with the same C on the rows so standardised.
    model = FeatureTaskModel.from_pretrained(tmp_path / "run" / "model").eval()  # strict loading
    assert torch.equal(model.feature_mean, head["feature_mean"]) and torch.equal(model.head.weight,
                                                                                 head["head.weight"])
    tokenizer = model.tokenizer
    lines = (task / "train_a.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts, labels = [line.split("\t")[0] for line in lines], [line.split("\t")[1] for line in lines]
    pooled = []
    for text in texts:
        ids = torch.tensor([tokenizer.encode_batch([text], max_length=128)[0].input_ids])
        with torch.no_grad():
            pooled.append(model.task_features(ids, torch.ones_like(ids), torch.zeros_like(ids))[0].double())
    pooled = torch.stack(pooled)
    torch.testing.assert_close(model.feature_mean.double(), pooled.mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(model.feature_scale.double(), pooled.std(0, correction=0), atol=1e-6, rtol=1e-5)
    standardised = ((pooled - model.feature_mean.double()) / model.feature_scale.double()).numpy()
    reference = LogisticRegression(C=0.3, max_iter=10000, tol=1e-10).fit(standardised,
                                                                         [lab == "person" for lab in labels])
    np.testing.assert_allclose((model.head.weight[1] - model.head.weight[0]).detach().numpy(), reference.coef_[0],
                               atol=1e-4)  # float32 weights of a float64 fit

    # predict answers as the run's dev predictions
    dev = [line.split("\t")[0] for line in (task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    written = (tmp_path / "run" / "dev_predictions.txt").read_text(encoding="utf-8").split()
    answers = predicted(capsys, "classify", tmp_path / "run" / "model", dev, tmp_path)
    assert [a["label"] for a in answers] == written and len(set(written)) == 2


def test_reruns_a_shared_cache_and_a_repeated_label_set_give_bit_identical_heads(task, tmp_path, monkeypatch):
    import bertkit.features as features

    cache = tmp_path / "cache.safetensors"
    first = run(task, tmp_path / "a", "train_a.tsv", "--feature-cache", str(cache))
    distinct = len((task / "dev.tsv").read_text(encoding="utf-8").splitlines()) - 1
    assert first["features"]["feature_cache_rows_computed"] == distinct  # train and dev rows, into the file
    # another label set of the same task: every row (two were dev rows only) read from the file, none computed, and
    # the encoder reads no text, not even when the saved model is read back to score dev (it shares the run's
    # cache); only the one-token probes of `encoder_shape` (the run's model and the one read back) run it
    calls = []
    encoder_hidden_states = features.encoder_hidden_states
    monkeypatch.setattr(features, "encoder_hidden_states", lambda encoder, ids, *a: calls.append(ids.shape) or
                        encoder_hidden_states(encoder, ids, *a))
    shared = run(task, tmp_path / "b_cache", "train_b.tsv", "--feature-cache", str(cache))
    monkeypatch.undo()
    assert calls == [(1, 1), (1, 1)] and shared["confusion_matrix"]["dev"]
    assert shared["features"]["feature_cache_rows_computed"] == 0 and "feature_cache_load_s" in shared["features"]
    plain = run(task, tmp_path / "b", "train_b.tsv")
    again = run(task, tmp_path / "b_again", "train_b.tsv")
    twice = run(task, tmp_path / "b2", "train_b2.tsv")
    assert twice["fit"]["repeats"] == 2 and twice["fit"]["rows"] == 2 * plain["fit"]["rows"]
    reference = head_of(tmp_path / "b")
    for out in ("b_cache", "b_again", "b2"):
        head = head_of(tmp_path / out)
        assert all(torch.equal(head[k], reference[k]) for k in reference), out
        assert ((tmp_path / out / "dev_predictions.txt").read_bytes()
                == (tmp_path / "b" / "dev_predictions.txt").read_bytes())
    assert shared["best"] == plain["best"] == again["best"] == twice["best"]
    assert shared["fit"]["loss"] == plain["fit"]["loss"] == twice["fit"]["loss"]


def test_a_sentence_pair_task_compares_the_two_sentences(task, tmp_path, capsys):
    # Pairs: a text and another, labelled by whether both name a person.
    lines = [line.split("\t") for line in (task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    rows = [(a, b, "both" if la == lb == "person" else "not") for (a, la), (b, lb) in zip(lines, lines[1:] + lines[:1])]
    for name in ("pairs_train.tsv", "pairs_dev.tsv"):
        (tmp_path / name).write_text("text\tpair\tlabel\n" + "".join(f"{a}\t{b}\t{c}\n" for a, b, c in rows),
                                     encoding="utf-8")
    out = tmp_path / "pairs"
    assert main(["finetune", "classify", "--model", str(task / "bert"), "--train", str(tmp_path / "pairs_train.tsv"),
                 "--dev", str(tmp_path / "pairs_dev.tsv"), "--pair-column", "pair", "--out", str(out), "--frozen",
                 "--task-model", "logistic", "--layers=-1", "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["features"]["pair_features"] is True and results["fit"]["gradient_max"] <= 1e-8
    assert head_of(out)["head.weight"].shape == (2, 6 * 32)  # mean, max, u, v, |u - v|, u * v of width 32
    assert json.loads((out / "model" / "task_model.json").read_text(encoding="utf-8"))["pairs"] is True

    # The features, computed here from the encoder's last layer (read at the cache's float16, as the model does).
    model = FeatureTaskModel.from_pretrained(out / "model").eval()
    assert model.pairs
    a, b, _ = rows[0]
    encoded = model.tokenizer.encode_batch([a], [b], max_length=128)[0]
    ids, types = torch.tensor([encoded.input_ids]), torch.tensor([encoded.token_type_ids])
    with torch.no_grad():
        last = model.encoder(ids, torch.ones_like(ids), types, output_hidden_states=True).hidden_states[-1]
        found = model.task_features(ids, torch.ones_like(ids), types)[0]
    h = last[0].half().float()
    first, second = h[types[0] == 0], h[types[0] == 1]
    u, v = first.mean(0), second.mean(0)
    assert len(first) == len(a.split()) + 2 and len(second) == len(b.split()) + 1  # [CLS] a [SEP] | b [SEP]
    torch.testing.assert_close(found, torch.cat([h.mean(0), h.max(0).values, u, v, (u - v).abs(), u * v]),
                               atol=1e-5, rtol=1e-5)

    # predict reads the pairs and answers as the run's dev predictions
    inputs = tmp_path / "pairs.jsonl"
    inputs.write_text("".join(json.dumps({"text": a, "pair": b}) + "\n" for a, b, _ in rows), encoding="utf-8")
    answers = cli_json(capsys, ["predict", "classify", "--model", str(out / "model"), "--input", str(inputs), "--json"])
    assert [x["label"] for x in answers] == (out / "dev_predictions.txt").read_text(encoding="utf-8").split()


# ------------------------------------------------------------------------------------------------------------------
# Wrong uses
# ------------------------------------------------------------------------------------------------------------------
def test_wrong_uses_are_one_line_errors(task, tmp_path, capsys):
    (tmp_path / "ner.txt").write_text("John X X B-PER\nruns X X O\n", encoding="utf-8")
    classify = ["finetune", "classify", "--model", str(task / "bert"), "--train", str(task / "train_a.tsv"),
                "--dev", str(task / "dev.tsv"), "--quiet", "--task-model", "logistic"]
    cases = [
        (classify + ["--out", str(tmp_path / "a")], "fits a classifier on a frozen encoder: add --frozen"),
        (classify + ["--out", str(tmp_path / "b"), "--frozen", "--regression"], "not for --regression"),
        (classify + ["--out", str(tmp_path / "c"), "--frozen", "--combine", "scalar-mix"], "has no mix to learn"),
        (classify + ["--out", str(tmp_path / "d"), "--frozen", "--logistic-c", "0"], "logistic_c must be positive"),
        (classify + ["--out", str(tmp_path / "e"), "--frozen", "--logistic-c", "-1"], "logistic_c must be positive"),
        (classify + ["--out", str(tmp_path / "f"), "--frozen", "--logistic-c", "nan"], "logistic_c"),
        (["finetune", "ner", "--model", str(task / "bert"), "--train", str(tmp_path / "ner.txt"), "--dev",
          str(tmp_path / "ner.txt"), "--out", str(tmp_path / "g"), "--quiet", "--frozen", "--task-model",
          "logistic"], "(classify, glue), not for ner"),
    ]
    for args, message in cases:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / args[args.index("--out") + 1]).exists()
    # what the config cannot see (a GLUE regression task, another role) the model refuses
    with pytest.raises(ValueError, match="not for regression"):
        FeatureTaskModel(torch.nn.Linear(1, 1), None, "sequence", 1, 3, 4, [-1], "concat", "logistic",
                         regression=True)
    with pytest.raises(ValueError, match="not for token tasks"):
        FeatureTaskModel(torch.nn.Linear(1, 1), None, "token", 2, 3, 4, [-1], "concat", "logistic")
    assert FinetuneConfig(frozen=True, task_model="logistic").layer_combine == "concat"
    assert FinetuneConfig().layer_combine == "scalar-mix" and FinetuneConfig(combine="sum").layer_combine == "sum"


def test_an_unset_combine_matches_its_default_when_a_sweep_checks_a_finished_run(tmp_path):
    from bertkit.tasks.finetune import _same_setting

    wanted = FinetuneConfig(kind="classify", frozen=True).to_dict()
    assert wanted["combine"] is None
    _same_setting(tmp_path, {**wanted, "combine": "scalar-mix"}, wanted)  # written before the default moved
    with pytest.raises(ValueError, match="holds a finished run with combine 'concat', not 'scalar-mix'"):
        _same_setting(tmp_path, {**wanted, "combine": "concat"}, wanted)
    logistic = FinetuneConfig(kind="classify", frozen=True, task_model="logistic").to_dict()
    _same_setting(tmp_path, {**logistic, "combine": "concat"}, logistic)
