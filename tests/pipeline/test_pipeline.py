"""bertkit.pipeline: the one-command run, end to end on a tiny corpus and task with a budget of a few seconds, and
its parts: the built-in task, the vocabulary's normalisation, the precision choice, the label ladder, the budget
plan, fill-mask on held-out text by frequency band, the report page."""

from __future__ import annotations

import base64
import collections
import json
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.checkpoint import CONFIG_NAME, WEIGHTS_NAME
from bertkit.pipeline import (FREQUENCY_BANDS, build_docstring_task, build_word_order_task, build_word_salad_task,
                              choose_normalisation, choose_precision, plain_words, random_words, shuffle_words,
                              cpu_bf16_flags, curve_schedule, curve_verdict, default_corpus, describe_machine,
                              label_ladder, passes_for, plan_budget, prose_sentences, quartiles, run_pipeline,
                              seed_draw_share, stratified_order, write_label_set)

WORDS = ("the cat dog bird sat ran on under a mat log tree big small red blue quickly slowly and then it was "
         "very happy sad home park river day night").split()


def tiny_corpus(path, documents: int = 400, seed: int = 0):
    """Google-format text: one sentence per line, a blank line between documents."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(documents):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
                     for _ in range(rng.randint(2, 4))]
        blocks.append("\n".join(sentences))
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def tiny_task(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """A two-class TSV task whose label is the colour word of the sentence (learnable from one token)."""
    rng = random.Random(seed)
    paths = []
    for split, n in (("train", 64), ("dev", 32)):
        rows = ["sentence\tcolour"]
        for _ in range(n):
            colour = rng.choice(["red", "blue"])
            rows.append(f"the {rng.choice(['cat', 'dog', 'bird'])} sat on the {colour} mat\t{colour}")
        path = folder / f"{split}.tsv"
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    corpus = tiny_corpus(root / "corpus.txt")
    train, dev = tiny_task(root)
    out = root / "out"
    # Label counts 8 (a regression on the frozen encoder, and beside it random initialisation fine-tuned) and all
    # 64 (fine-tuned, at least 32 examples a run), two seeds each: 10 runs of a few steps.
    report = run_pipeline(out, corpus=[str(corpus)], preset="tiny", vocab_size=120, probes=["the [MASK] sat."],
                          progress=False, train_seconds=3.0, task_train=str(train), task_dev=str(dev),
                          text_column="sentence", label_column="colour", finetune_seeds=2, ladder=(8, 40),
                          min_examples=32, fill_mask_prompts=40, frozen_max_labels=8)
    return out, report


# ------------------------------------------------------------------------------------------------------------------
# The whole run
# ------------------------------------------------------------------------------------------------------------------
def test_every_stage_writes_its_files(pipeline_run):
    out, report = pipeline_run
    assert (out / "tokenizer" / "vocab.txt").is_file()
    assert (out / "data" / "manifest.json").is_file()
    for model in (out / "run" / "model", out / "scratch"):
        assert (model / CONFIG_NAME).is_file() and (model / WEIGHTS_NAME).is_file() and (model / "vocab.txt").is_file()
    assert (out / "run" / "metrics.jsonl").is_file() and (out / "run" / "config.yaml").is_file()
    for start in ("pretrained", "scratch"):
        for n in (8, 64):
            for seed in (0, 1):
                ft = out / "finetune" / f"{start}-{n}-seed{seed}"
                assert (ft / "results.json").is_file() and not (ft / "checkpoints").exists()
                # Only the all-labels, first-seed models are kept (the served one and its baseline).
                assert (ft / "model" / WEIGHTS_NAME).is_file() == (n == 64 and seed == 0)
    for seed in (0, 1):  # the frozen count's fine-tuned baseline: random initialisation, nothing kept
        ft = out / "finetune" / f"scratch-finetuned-8-seed{seed}"
        assert (ft / "results.json").is_file() and not (ft / "checkpoints").exists() and not (ft / "model").exists()
    assert not (out / "finetune" / "scratch-finetuned-64-seed0").exists()  # fine-tuned already: no baseline
    assert json.loads((out / "report.json").read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    assert (out / "report.html").is_file() and report["report"] == str(out / "report.html")
    assert len(report["plots"]) == 4 and all(Path(p).is_file() and p.endswith(".png") for p in report["plots"])
    assert any(p.endswith("label_efficiency.png") for p in report["plots"])
    assert report["serve"] == f"bertkit serve --model {report['finetune']['models']['pretrained']}"


def test_report_fields(pipeline_run):
    out, report = pipeline_run
    assert set(report) == {"corpus", "corpus_summary", "tokens", "vocab_size", "normalisation", "machine",
                           "precision", "precision_reason", "measured_tokens_per_s", "recipe", "model_summary", "plan",
                           "speed", "finetune_speed", "steps", "train_tokens", "tokens_per_s", "eval_points",
                           "evaluations", "mlm_accuracy_before", "mlm_accuracy_after", "perplexity_before",
                           "perplexity_after", "finetune", "fill_mask", "probes", "model", "report", "serve",
                           "timings", "commands", "minutes", "plots"}
    manifest = json.loads((out / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert report["tokens"] == manifest["splits"]["train"]["tokens"] > 0
    assert report["corpus_summary"]["eval"]["documents"] == manifest["splits"]["eval"]["documents"] >= 2
    assert report["vocab_size"] <= 120
    assert report["normalisation"]["lowercase"] and report["normalisation"]["strip_accents"]  # English text
    assert report["machine"]["summary"].startswith(report["machine"]["cpu"])
    assert report["steps"] >= 1 and report["train_tokens"] > 0 and report["tokens_per_s"] > 0
    for key in ("mlm_accuracy_before", "mlm_accuracy_after"):
        assert 0.0 <= report[key] <= 1.0
    assert report["perplexity_after"] < report["perplexity_before"]  # a few seconds of masked LM already help
    result = json.loads((out / "run" / "result.json").read_text(encoding="utf-8"))
    assert result["step"] == report["steps"] and result["stopped_by"] == "max_time"
    assert set(report["timings"]) == {"corpus", "vocabulary", "shards", "plan", "pretraining", "finetuning",
                                      "evaluation"}
    (probe, candidates), = report["probes"].items()
    assert probe == "the [MASK] sat." and len(candidates) == 5


def test_heldout_evaluation_at_regular_points(pipeline_run):
    out, report = pipeline_run
    evals = report["evaluations"]
    every = report["plan"]["eval_every"]
    # How many fit in the time budget depends on the machine's speed (the plan aims at EVAL_POINTS); what does not:
    # one at step 0, one at every multiple of the interval, and one at the end.
    total = report["steps"]
    assert report["eval_points"] == len(evals) == total // every + 1 + (total % every != 0) >= 2
    steps = [e["step"] for e in evals]
    assert steps[0] == 0 and steps[-1] == report["steps"]
    # Every evaluation but the last (at the end of the time budget) falls on a multiple of the interval.
    assert steps[:-1] == list(range(0, every * (len(steps) - 1), every))
    assert all(e["eval_perplexity"] > 0 and 0 <= e["eval_mlm_accuracy"] <= 1 for e in evals)


def test_label_efficiency_curve_compares_like_with_like(pipeline_run):
    out, report = pipeline_run
    ft = report["finetune"]
    assert ft["train_examples"] == 64 and ft["dev_examples"] == 32 and ft["labels"] == ["blue", "red"]
    assert [p["labels"] for p in ft["curve"]] == [8, 64]  # 40 is more than half the training set
    # 8 labels: a logistic regression on the frozen encoder, each example once; all 64: fine-tuned, 3 passes.
    assert [p["passes"] for p in ft["curve"]] == [1, 3]
    assert [p["frozen"] for p in ft["curve"]] == [True, False]
    assert ft["config"]["frozen_max_labels"] == 8 and ft["config"]["frozen_task_model"] == "logistic"
    # The same architecture from both starting points, both classifying from the mean of the tokens.
    architecture = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size", "pad_token_id",
                    "classifier_pooling")
    configs = [json.loads((d / CONFIG_NAME).read_text()) for d in (out / "run" / "model", out / "scratch")]
    assert {k: configs[0].get(k) for k in architecture} == {k: configs[1].get(k) for k in architecture}
    assert configs[0]["classifier_pooling"] == "mean"
    train_rows = [line.split("\t") for line in (out.parent / "train.tsv").read_text().splitlines()[1:]]
    for point in ft["curve"]:
        n = point["labels"]
        for seed in (0, 1):
            rows = [json.loads(line) for line in
                    (out / "finetune" / "sets" / f"train-{n}-seed{seed}.jsonl").read_text().splitlines()]
            assert len(rows) == n * point["passes"] and rows[:n] * point["passes"] == rows
            labels = [r["label"] for r in rows[:n]]
            if n < 64:  # a label set short of the training set is balanced as far as the classes allow
                assert abs(labels.count("red") - labels.count("blue")) <= 1
            assert all([r["text"], r["label"]] in [[t, c] for t, c in train_rows] for r in rows[:n])
            runs = [json.loads((out / "finetune" / f"{s}-{n}-seed{seed}" / "results.json").read_text())
                    for s in ("pretrained", "scratch")]
            # The same recipe; a frozen encoder's layers kept in one cache file per starting point.
            differ = {k for k in runs[0]["config"] if runs[0]["config"][k] != runs[1]["config"][k]}
            assert differ == ({"feature_cache"} if point["frozen"] else set()) and runs[0]["config"]["seed"] == seed
            assert runs[0]["config"]["frozen"] is point["frozen"]
            assert runs[0]["config"]["task_model"] == ("logistic" if point["frozen"] else "linear")
            assert runs[0]["max_steps"] == runs[1]["max_steps"] and len(runs[0]["epochs"]) == 1  # dev scored once
            for run, start in zip(runs, ("pretrained", "scratch")):
                assert point[start]["values"][seed] == run["epochs"][-1]["accuracy"]
        for start in ("pretrained", "scratch"):
            assert point[start]["median"] == pytest.approx(sum(point[start]["values"]) / 2)  # two seeds
        assert point["gap"] == pytest.approx(point["pretrained"]["median"] - point["scratch"]["median"])
    small = [set(map(json.dumps, [json.loads(x) for x in (out / "finetune" / "sets" / f"train-{n}-seed0.jsonl")
                                  .read_text().splitlines()])) for n in (8, 64)]
    assert small[0] <= small[1]  # one seed's smaller label set is part of its larger one
    # Beside the frozen point, the baseline a reader expects: random initialisation fine-tuned on the same label
    # sets, with the recipe of the fine-tuned points (at least 32 examples: 4 passes over 8 labels).
    frozen, tuned = ft["curve"]
    assert "scratch_finetuned" not in tuned and frozen["scratch_finetuned"]["passes"] == passes_for(8, 32) == 4
    for seed in (0, 1):
        sets = out / "finetune" / "sets"
        once = (sets / f"train-8-seed{seed}.jsonl").read_text().splitlines()
        assert (sets / f"train-8-seed{seed}-finetuned.jsonl").read_text().splitlines() == once * 4
        run = json.loads((out / "finetune" / f"scratch-finetuned-8-seed{seed}" / "results.json").read_text())
        full = json.loads((out / "finetune" / f"scratch-64-seed{seed}" / "results.json").read_text())
        assert run["model_dir"] == full["model_dir"] == str(out / "scratch")
        assert {k for k in run["config"] if run["config"][k] != full["config"][k]} == set()  # the same recipe
        assert len(run["epochs"]) == 1 and frozen["scratch_finetuned"]["values"][seed] == run["epochs"][-1]["accuracy"]
        assert run["max_steps"] == -(-8 * 4 // 16)  # 32 examples, batch 16
    assert frozen["finetuned_gap"] == pytest.approx(frozen["pretrained"]["median"]
                                                    - frozen["scratch_finetuned"]["median"])
    assert frozen["finetuned_seeds"] == 2 and not frozen["finetuned_beyond_spread"]  # two seeds: no spread
    dev_labels = [line.split("\t")[1] for line in (out.parent / "dev.tsv").read_text().splitlines()[1:]]
    train_labels = [c for _, c in train_rows]
    majority = max(("blue", "red"), key=train_labels.count)  # ties: the first found, as Counter.most_common
    assert ft["majority_label"] == majority
    assert ft["majority_accuracy"] == pytest.approx(dev_labels.count(majority) / 32)


def test_fill_mask_on_heldout_text(pipeline_run):
    from bertkit.inference import fill_mask

    out, report = pipeline_run
    fill = report["fill_mask"]
    assert 1 <= fill["prompts"] <= 40 and fill["examples"]
    assert 0 <= fill["top1_accuracy"] <= fill["top5_accuracy"] <= 1
    assert fill["baseline_word"].isalpha() and 0 <= fill["baseline_accuracy"] <= 1
    bands = fill["bands"]
    assert [b["band"] for b in bands] == [name for name, _, _ in FREQUENCY_BANDS]
    assert sum(b["prompts"] for b in bands) == fill["prompts"]
    # The bands' accuracies add up to the overall ones (weighted by their prompts).
    for key in ("top1_accuracy", "top5_accuracy"):
        assert sum(b[key] * b["prompts"] for b in bands if b["prompts"]) == pytest.approx(fill[key] * fill["prompts"])
    assert bands[0]["baseline_top1"] == pytest.approx(fill["baseline_accuracy"] * fill["prompts"]
                                                      / bands[0]["prompts"])
    for example in fill["examples"]:
        assert example["prompt"].count("[MASK]") == 1 and example["answer"].isalpha()
        # The batched evaluation gives what `bertkit fill-mask` gives for the same sentence.
        (found,) = fill_mask(out / "run" / "model", example["prompt"], top_k=5)
        assert [c["token"] for c in found] == [t for t, _ in example["candidates"]]
        assert [round(c["probability"], 4) for c in found] == pytest.approx([p for _, p in example["candidates"]],
                                                                              abs=2e-4)
        assert example["correct"] == (found[0]["token"] == example["answer"])


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tables, self.links, self.scripts, self.headings = [], [], [], [], []
        self._heading = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        elif tag == "table":
            self.tables.append(attrs.get("id"))
        elif tag == "link" or (tag == "a" and attrs.get("href", "").startswith("http")):
            self.links.append(attrs)
        elif tag == "script":
            self.scripts.append(attrs)
        elif tag == "h2":
            self._heading = attrs.get("id")

    def handle_endtag(self, tag):
        if tag == "h2" and self._heading:
            self.headings.append(self._heading)
            self._heading = None


def test_report_names_the_largest_label_count_that_ran(pipeline_run):
    from bertkit.pipeline.report import render_html

    out, report = pipeline_run
    assert "with all 64 labels the gap is" in (out / "report.html").read_text(encoding="utf-8")
    # All labels skipped at the deadline: the page says which count is the last and why.
    cut = {**report, "finetune": {**report["finetune"], "curve": report["finetune"]["curve"][:-1]}}
    text = render_html(cut, {})
    assert "with 8 labels (all 64: skipped, out of time) the gap is" in text and "with all 8 labels" not in text


def test_report_page_is_self_contained(pipeline_run):
    out, report = pipeline_run
    text = (out / "report.html").read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    assert len(page.images) == len(report["plots"]) == 4
    prefix = "data:image/png;base64,"
    for src, path in zip(page.images, report["plots"]):
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix):], validate=True) == Path(path).read_bytes()
    assert not page.links and not page.scripts  # nothing fetched from anywhere
    assert {"label-efficiency-table", "fill-mask-bands", "fill-mask-table"} <= set(page.tables)
    assert page.headings == ["label-efficiency", "machine", "corpus", "model", "pretraining", "fill-mask",
                             "reproduce", "files"]
    table = text[text.index('id="label-efficiency-table"'):]
    table = table[:table.index("</table>")]
    for point in report["finetune"]["curve"]:
        for start in ("pretrained", "scratch"):
            assert f"{point[start]['median']:.3f} [{point[start]['q1']:.3f}" in table
    assert ">8 (frozen encoder)</td>" in table and ">64</td>" in table  # which points read a frozen encoder
    assert "Label sets of at most 8 examples fit a logistic regression" in text
    tuned = report["finetune"]["curve"][0]["scratch_finetuned"]
    assert "random init fine-tuned: median [IQR], gap" in table
    assert "random init fine-tuned on the same 8 labels<b>" in text  # and in the key figures at the top
    assert f"{tuned['median']:.3f} [{tuned['q1']:.3f}" in table  # the baseline beside the frozen point
    assert "at chance by construction" in text and "not the baseline a reader expects" in text
    assert any("random initialisation fine-tuned on the same label set" in stage
               and "train-N-seedS-finetuned.jsonl" in command for stage, command in report["commands"])
    assert report["machine"]["summary"] in text
    for stage, command in report["commands"]:
        assert command.split()[0] in ("bertkit", "python") and stage
    assert any(c.startswith("bertkit pretrain ") and "--config mini-fast" in c for _, c in report["commands"])


def test_task_flags_come_in_pairs(tmp_path):
    with pytest.raises(ValueError, match="--task-train and --task-dev"):
        run_pipeline(tmp_path, corpus=["x"], task_train=str(tmp_path / "t.tsv"), progress=False)


# ------------------------------------------------------------------------------------------------------------------
# Parts
# ------------------------------------------------------------------------------------------------------------------
def test_precision_follows_the_cpu_flags():
    line = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {}\n"
    assert cpu_bf16_flags(line.format("avx512_bf16")) == ["avx512_bf16"]
    assert cpu_bf16_flags(line.format("amx_bf16 amx_tile avx512_bf16")) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16_flags(line.format("")) == [] and cpu_bf16_flags("") == []
    assert choose_precision("cpu", line.format("avx512_bf16"))[0] == "bf16"
    precision, why = choose_precision("cpu", line.format("avx512_vnni"))
    assert precision == "fp32" and "no native bf16" in why
    assert choose_precision("cuda", line.format(""))[0] == "auto"
    machine = describe_machine(cpuinfo=line.format("avx512_bf16"))
    assert machine["flags"] == ["avx2", "avx512f", "avx512_bf16"] and machine["gpu"] is None
    assert "flags avx2 avx512f avx512_bf16; no GPU" in machine["summary"]


KOREAN = ("비행기가 이륙하고 있다. 한 남자가 큰 플루트를 연주하고 있다. 남자가 피자에 치즈를 뿌리고 있다. "
          "세 남자가 체스를 하고 있다. 한 여성이 양파를 자르고 있다.")


def test_normalisation_keeps_hangul_syllables_whole():
    from bertkit.tokenizers import WordPieceTokenizer

    assert choose_normalisation(["The café serves crème brûlée.", "Plain English text."])[:2] == (True, True)
    lowercase, strip, why = choose_normalisation([KOREAN] * 3)
    assert (lowercase, strip) == (True, False) and "Hangul" in why
    # A little Korean inside English text (a name, under 0.1% of the letters) does not turn stripping off.
    assert choose_normalisation(["English words " * 400 + "한"])[1] is True
    tokenizer = WordPieceTokenizer.train([KOREAN] * 20, vocab_size=200, lowercase=lowercase, strip_accents=strip,
                                         show_progress=False)
    pieces = tokenizer.tokenize(KOREAN)
    hangul = [c for p in pieces for c in p.lstrip("#")]
    assert hangul and all(0xAC00 <= ord(c) <= 0xD7A3 or not c.isalpha() for c in hangul)  # syllables, no jamo
    assert tokenizer.decode(tokenizer.encode("비행기가 이륙하고 있다.").input_ids, skip_special_tokens=True) \
        .replace(" ", "") == "비행기가이륙하고있다."


def test_label_ladder_and_label_sets(tmp_path):
    assert label_ladder(2770, 8) == [64, 128, 256, 512, 2770]  # 2,048 is more than half of 2,770
    assert label_ladder(5749, 3) == [64, 128, 256, 512, 2048, 5749]
    assert label_ladder(100, 40) == [100]  # 64 labels would give fewer than two per class
    assert label_ladder(100, 2, (8, 32, 64)) == [8, 32, 100]
    labels = ["a"] * 10 + ["b"] * 3 + ["c"] * 7
    order = stratified_order(labels, seed=1)
    assert sorted(order) == list(range(20))
    assert [labels[i] for i in order[:9]] == ["a", "b", "c"] * 3  # one of each class in turn
    assert [labels[i] for i in order[9:13]] == ["a", "c", "a", "c"]  # b ran out
    assert stratified_order(labels, seed=1) == order and stratified_order(labels, seed=2) != order
    assert (passes_for(32, 2000, 3), passes_for(512, 2000, 3), passes_for(2770, 2000, 3)) == (63, 4, 3)

    class E:
        def __init__(self, text, pair, label):
            self.text, self.pair, self.label = text, pair, label

    rows = [E("x", "y", "a"), E("z", None, "b")]
    path = write_label_set(rows, [1, 0], 2, tmp_path / "set.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"text": "z", "label": "b"}, {"text": "x", "label": "a", "pair": "y"}] * 2


def test_quartiles_and_the_verdict():
    q = quartiles([0.1, 0.5, 0.2, 0.4, 0.3])
    assert (q["median"], q["q1"], q["q3"], q["min"], q["max"]) == pytest.approx((0.3, 0.2, 0.4, 0.1, 0.5))
    assert q["iqr"] == pytest.approx(0.2)
    point = {"pretrained": quartiles([0.50, 0.52, 0.55]), "scratch": quartiles([0.30, 0.31, 0.35])}
    verdict = curve_verdict(point)
    assert verdict["gap"] == pytest.approx(0.21) and verdict["beyond_spread"] and verdict["wins"] == 3
    close = {"pretrained": quartiles([0.30, 0.40, 0.50]), "scratch": quartiles([0.30, 0.35, 0.36])}
    assert not curve_verdict(close)["beyond_spread"]  # a gap of 0.05 inside the pretrained IQR of 0.10
    one = {"pretrained": quartiles([0.5]), "scratch": quartiles([0.3])}
    assert curve_verdict(one)["gap"] == pytest.approx(0.2) and not curve_verdict(one)["beyond_spread"]  # no spread
    assert "finetuned_gap" not in verdict  # no baseline at this point
    # Against the fine-tuned baseline: its own gap, spread and wins, over the seeds both ran (the first three).
    tuned = curve_verdict({**point, "scratch_finetuned": quartiles([0.40, 0.53, 0.45])})
    assert tuned["finetuned_gap"] == pytest.approx(0.52 - 0.45) and tuned["finetuned_wins"] == 2
    assert tuned["finetuned_seeds"] == 3 and tuned["finetuned_beyond_spread"]  # 0.07 beyond its IQR of 0.065
    inside = curve_verdict({**point, "scratch_finetuned": quartiles([0.40, 0.56, 0.45])})
    assert inside["finetuned_gap"] == pytest.approx(0.07) and not inside["finetuned_beyond_spread"]  # IQR 0.08
    wide = curve_verdict({"pretrained": quartiles([0.50, 0.52, 0.55, 0.56]), "scratch": quartiles([0.3] * 4),
                          "scratch_finetuned": quartiles([0.45, 0.47])})
    assert wide["finetuned_seeds"] == 2 and not wide["finetuned_beyond_spread"] and wide["finetuned_wins"] == 2


def test_seed_draw_share_counts_the_draws_beyond_both_spreads():
    # Four seeds at 0.6 and one at 0.4 against 0.5 everywhere: a draw of three is beyond both spreads only without
    # the 0.4 seed (its IQR 0.1 then equals the gap): 4 of the 10 subsets.
    pre, scr = [0.6, 0.6, 0.6, 0.6, 0.4], [0.5] * 5
    assert seed_draw_share(pre, scr, 3) == pytest.approx(0.4)
    # Sampled: 4,000 draws, within 4 binomial standard deviations (0.0077 each) of the exact share.
    assert abs(seed_draw_share(pre, scr, 3, draws=4000) - 0.4) < 0.031
    assert seed_draw_share(pre, scr, 3, draws=500, seed=1) == seed_draw_share(pre, scr, 3, draws=500, seed=1)
    assert seed_draw_share(pre, scr, 4) == 1.0  # with four, the 0.4 seed moves the first quartile only (IQR 0.05)
    assert seed_draw_share([0.6] * 5, scr, 5) == 1.0 and seed_draw_share([0.6] * 5, scr, 2) == 0.0  # 2: no spread
    with pytest.raises(ValueError):
        seed_draw_share(pre, scr, 6)


def test_curve_schedule_runs_the_fewest_labels_first_then_the_curve_then_what_time_allows():
    # Planned: 3 seeds at the fewest labels, one at the others; room allowing, up to 5, 3 and 1.
    assert curve_schedule([3, 1, 1], [5, 3, 1]) == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0),  # the planned runs
                                                    (0, 3), (0, 4), (1, 1), (1, 2)]  # the extra ones
    assert curve_schedule([2, 2, 2], [2, 2, 2]) == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1), (2, 1)]
    assert curve_schedule([1], [1]) == [(0, 0)]
    # With the baseline's entries after the curve's (here entry 3, the fewest labels fine-tuned from random
    # initialisation, and entry 4): the fewest labels' seeds of both first, before the expensive all-labels run.
    assert curve_schedule([3, 1, 1, 2, 0], [3, 3, 1, 3, 3], (0, 3)) == [
        (0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (1, 0), (2, 0),  # planned
        (3, 2), (1, 1), (1, 2), (4, 0), (4, 1), (4, 2)]  # with time left: the leading entries' first


def test_plan_budget_splits_the_time():
    ladder = [32, 128, 512, 2770]  # passes 63, 16, 4, 3: about 2,000 examples a run, 8,310 for all
    # The default passes: at least FINETUNE_MIN_EXAMPLES (1,000) examples a run, 3 passes over a large set.
    assert plan_budget(1500.0, seeds=[1, 1, 1, 1], step_s=0.15, eval_row_s=0.0015, ladder=ladder, example_s=0.005,
                       fixed_s=1.0).passes == (32, 8, 3, 3)
    cost = dict(step_s=0.15, eval_row_s=0.0015, ladder=ladder, example_s=0.005, fixed_s=1.0, passes=[63, 16, 4, 3])
    run_s = [n * p * 0.005 + 1.0 for n, p in zip(ladder, (63, 16, 4, 3))]
    # Roomy: every seed; pretraining gets the rest, 30 evaluations of 500 rows.
    plan = plan_budget(1500.0, seeds=[5, 5, 3, 3], **cost)
    assert plan.seeds == (5, 5, 3, 3) and plan.passes == (63, 16, 4, 3) and plan.eval_rows == 500
    assert plan.run_s == pytest.approx(run_s)
    assert plan.finetune_s == pytest.approx(2 * sum(k * r for k, r in zip((5, 5, 3, 3), run_s)))
    assert plan.pretrain_s == pytest.approx(1500.0 - plan.finetune_s) and not plan.short
    assert plan.expected_steps == int((plan.pretrain_s - 30 * 500 * 0.0015) / 0.15)
    assert plan.eval_every == plan.expected_steps // 30
    # Tighter: the largest label counts lose seeds first, the smallest keeps its five longest.
    mid = plan_budget(600.0, seeds=[5, 5, 3, 3], **cost)
    assert mid.seeds == (5, 2, 1, 1) and mid.finetune_s <= 0.45 * 600.0
    # Tight: one seed everywhere is still too much, so the passes shrink (pretraining keeps its share).
    tight = plan_budget(300.0, seeds=[5, 5, 3, 3], **cost)
    assert tight.seeds == (1, 1, 1, 1) and tight.passes == (55, 14, 3, 2)  # x (135 - 8) / 144.2
    assert tight.finetune_s <= 0.45 * 300.0 and tight.pretrain_s == pytest.approx(300.0 - tight.finetune_s)
    starved = plan_budget(100.0, seeds=[5, 5, 3, 3], **cost)  # even one pass each is over the share
    assert starved.passes == (16, 4, 1, 1) and starved.pretrain_s == pytest.approx(55.0)  # not 100 - 51
    floor = plan_budget(20.0, seeds=[5, 5, 3, 3], **cost)
    assert floor.seeds == (1, 1, 1, 1) and floor.passes == (1, 1, 1, 1) and floor.short and floor.pretrain_s == 30.0
    # A slow machine: evaluations shrink to keep within 12% of pretraining (not below 64 rows).
    slow = plan_budget(540.0, seeds=[1, 1, 1, 1], **{**cost, "step_s": 3.5, "eval_row_s": 0.06})
    assert slow.eval_rows == 64
    # A fixed pretraining time: every seed and pass, whatever they cost.
    fixed = plan_budget(0.0, seeds=[2, 2, 2, 2], pretrain_s=3.0, **{**cost, "example_s": 60.0})
    assert (fixed.pretrain_s, fixed.seeds, fixed.passes, fixed.short) == (3.0, (2, 2, 2, 2), (63, 16, 4, 3), False)
    # A cost per example and a fixed cost for each label count (a frozen encoder's rungs: one pass, forward only).
    per_rung = plan_budget(1500.0, seeds=[5, 5, 3, 3], **{**cost, "example_s": [0.0001, 0.005, 0.005, 0.005],
                                                           "fixed_s": [0.5, 1.0, 1.0, 1.0]})
    assert per_rung.run_s == pytest.approx([32 * 63 * 0.0001 + 0.5] + run_s[1:])
    assert per_rung.pretrain_s == pytest.approx(plan.pretrain_s + 10 * (run_s[0] - per_rung.run_s[0]))
    tight_rungs = plan_budget(300.0, seeds=[1, 1, 1, 1], **{**cost, "fixed_s": [0.5, 1.0, 1.0, 2.0]})
    assert tight_rungs.passes == (55, 13, 3, 2)  # the training part x (135 - 9) / (153.22 - 9): fixed costs kept
    # The baseline's entries after the curve's: one starting point each (starts 1), the first seeds cut.
    arms = {**cost, "ladder": ladder + [32, 128], "passes": [63, 16, 4, 3, 32, 8], "starts": [2, 2, 2, 2, 1, 1]}
    both = plan_budget(1500.0, seeds=[5, 5, 3, 3, 3, 3], **arms)
    arm_s = [n * p * 0.005 + 1.0 for n, p in zip(arms["ladder"], arms["passes"])]
    assert both.starts == (2, 2, 2, 2, 1, 1) and both.seeds == (5, 5, 3, 3, 3, 3)
    assert both.finetune_s == pytest.approx(sum(k * m * r for k, m, r in zip(both.seeds, both.starts, arm_s)))
    assert both.finetune_s == pytest.approx(plan.finetune_s + 3 * (arm_s[4] + arm_s[5]))
    # Cut in stages: the baseline's entries but the smallest count's (to none), the curve's but the smallest
    # count's (to one), the curve's smallest count (to min_first_seeds), the baseline's smallest count (to one).
    cut = plan_budget(600.0, seeds=[5, 5, 3, 3, 3, 3], **arms)
    assert cut.seeds == (5, 1, 1, 1, 3, 0) and cut.finetune_s <= 0.45 * 600.0
    assert 2 * sum(k * r for k, r in zip((5, 2, 1, 1), arm_s)) + 3 * arm_s[4] > 0.45 * 600.0  # one more: over
    # Tighter: the curve's smallest count at 3, the baseline's at 1, then the smallest count below 3.
    assert plan_budget(450.0, seeds=[5, 5, 3, 3, 3, 3], **arms).seeds == (2, 1, 1, 1, 1, 0)
    assert plan_budget(400.0, seeds=[5, 5, 3, 3, 3, 3], **arms).seeds == (1, 1, 1, 1, 1, 0)
    assert plan_budget(100.0, seeds=[1, 1, 1, 1], **cost).starts == (2, 2, 2, 2)  # default: both starting points
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "starts": [2, 2, 3, 2]})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "starts": [2, 2, 2]})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "step_s": 0.0})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "example_s": [0.005, 0.005]})  # one per label count
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "fixed_s": [1.0, 1.0, 1.0]})


def _fake_stdlib(root: Path) -> Path:
    """alpha/ (two files) and beta.py with enough prose each, gamma/ with too little; one sentence in both."""
    def module(path: Path, topic: str, n: int, shared: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        sentences = [f"The {topic} helper number {i} returns a {topic} value for the caller." for i in range(n)]
        if shared:
            sentences.append("This sentence is written in two packages at once.")
        path.write_text('"""' + " ".join(sentences) + '"""\n', encoding="utf-8")

    module(root / "alpha" / "__init__.py", "alpha", 30, shared=True)
    module(root / "alpha" / "sub.py", "alphasub", 30)
    module(root / "alpha" / "tests" / "test_x.py", "ignored", 30)  # test folders are not read
    module(root / "beta.py", "beta", 40, shared=True)
    module(root / "gamma" / "__init__.py", "gamma", 5)
    return root


def test_builtin_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_docstring_task(tmp_path / "task", seed=3, stdlib=root, packages=("alpha", "beta", "gamma"),
                                train_per_class=30, dev_per_class=10, min_per_class=20)
    assert info["labels"] == ["alpha", "beta"]  # gamma has too few sentences
    assert info["per_class"] == {"alpha": [30, 10], "beta": [30, 8]}  # beta: a fifth of its 40 for dev
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    assert len(train) == info["train_examples"] == 60 and len(dev) == info["dev_examples"] == 18
    texts = [r["text"] for r in train + dev]
    assert len(set(texts)) == len(texts)  # no sentence twice, none in both splits
    assert not any("two packages" in t or "ignored" in t for t in texts)
    assert all(r["text"].split()[1].startswith(r["label"]) for r in train + dev)  # labelled by where it lives
    assert info["dev_sentences"] == [r["text"] for r in dev]
    again = build_docstring_task(tmp_path / "again", seed=3, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_per_class=30, dev_per_class=10, min_per_class=20)
    assert Path(again["dev"]).read_text() == Path(info["dev"]).read_text()  # seeded
    from bertkit.tasks.finetune import FinetuneConfig
    from bertkit.tasks.classify import ClassificationFamily

    family = ClassificationFamily(FinetuneConfig(kind="classify"))
    assert [e.label for e in family.read(info["train"], training=True)] == [r["label"] for r in train]

    # The pretraining corpus keeps the task's training sentences and leaves its dev sentences out.
    corpus = default_corpus(tmp_path / "corpus.txt", progress=False, exclude=set(info["dev_sentences"]), roots=[root])
    lines = set(corpus.read_text().splitlines())
    assert not lines & set(info["dev_sentences"])
    assert {r["text"] for r in train} <= lines
    assert len(lines - {""}) == sum(len(prose_sentences(p)) for p in root.rglob("*.py")
                                    if "tests" not in p.parts) - len(dev) - 1  # the shared sentence: one line
    # Parsed in one process or in several, the corpus is the same file (written in the files' order).
    alone = default_corpus(tmp_path / "alone.txt", progress=False, exclude=set(info["dev_sentences"]), roots=[root],
                           processes=1)
    pooled = default_corpus(tmp_path / "pooled.txt", progress=False, exclude=set(info["dev_sentences"]),
                            roots=[root], processes=3)
    assert alone.read_bytes() == pooled.read_bytes() == corpus.read_bytes()
    # Out of time: it stops once it has two documents (modules), whatever is left.
    quick = default_corpus(tmp_path / "quick.txt", progress=False, roots=[root], max_seconds=0.0)
    assert quick.read_text().count("\n\n") == 2 and len(quick.read_text()) < len(corpus.read_text())


def test_word_order_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_word_order_task(tmp_path / "task", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_max=60, dev_count=30)
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    # 106 distinct sentences of 6 to 40 words (alpha 30 + 30, beta 40, gamma 5, the shared one once; the 30 under
    # tests/ are not read): dev takes 30 of them (each as written and shuffled), training the next 60.
    assert (len(train), len(dev)) == (info["train_examples"], info["dev_examples"]) == (60, 60)
    for rows in (train, dev):
        assert sorted(collections.Counter(r["label"] for r in rows).values()) == [len(rows) // 2] * 2
        assert all(r["text"][-1].isalnum() and r["text"][0].isalnum() for r in rows)  # no mark of the end
    # Paired dev: each sentence as written, then its shuffled copy.
    assert [r["label"] for r in dev] == ["original", "shuffled"] * 30
    assert all(sorted(a["text"].split()) == sorted(b["text"].split()) for a, b in zip(dev[::2], dev[1::2]))
    written = {" ".join(plain_words(s)): s for p in root.rglob("*.py") if "tests" not in p.parts
               for s in prose_sentences(p)}
    for r in train + dev:
        if r["label"] == "original":
            assert r["text"] in written
        else:  # the same words as a sentence of the packages, in another order
            assert r["text"] not in written
            assert any(sorted(r["text"].split()) == sorted(k.split()) for k in written)
    originals = [written.get(r["text"]) for r in dev]
    assert set(info["dev_sentences"]) >= {o for o in originals if o}  # kept out of pretraining as written
    assert not set(info["dev_sentences"]) & {written[r["text"]] for r in train if r["label"] == "original"}
    again = build_word_order_task(tmp_path / "again", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(again["train"]).read_text() == Path(info["train"]).read_text()  # seeded
    with pytest.raises(RuntimeError, match="fewer than 100"):
        build_word_order_task(tmp_path / "few", stdlib=root, packages=("gamma",))


def test_word_salad_task_from_docstrings(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    info = build_word_salad_task(tmp_path / "task", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                 train_max=60, dev_count=30)
    assert info["name"] == "word-salad" and info["labels"] == ["random", "written"]
    train = [json.loads(line) for line in Path(info["train"]).read_text().splitlines()]
    dev = [json.loads(line) for line in Path(info["dev"]).read_text().splitlines()]
    # 106 distinct sentences of 6 to 40 words (alpha 30 + 30, beta 40, gamma 5, the shared one once; the 30 under
    # tests/ are not read): dev takes 30 of them (each as written and as a random row), training the next 60.
    assert (len(train), len(dev)) == (info["train_examples"], info["dev_examples"]) == (60, 60)
    for rows in (train, dev):
        assert sorted(collections.Counter(r["label"] for r in rows).values()) == [len(rows) // 2] * 2
    assert [r["label"] for r in dev] == ["written", "random"] * 30  # paired: a sentence, then its random row
    # A random row is as long as the sentence it replaces.
    assert all(len(a["text"].split()) == len(b["text"].split()) for a, b in zip(dev[::2], dev[1::2]))
    written = {" ".join(plain_words(s)): s for p in root.rglob("*.py") if "tests" not in p.parts
               for s in prose_sentences(p)}
    dev_sentences = set(info["dev_sentences"])
    assert len(dev_sentences) == 30 and dev_sentences <= set(written.values())
    assert {written[r["text"]] for r in dev if r["label"] == "written"} == dev_sentences  # dev rows: dev sentences
    assert not dev_sentences & {written[r["text"]] for r in train if r["label"] == "written"}
    # A random row's words are drawn from its own split's sentences: dev ones only from the dev sentences, which
    # pretraining never sees, training ones never from them (the numbers 0-39 tell the sentences apart here).
    dev_words = {w for s in dev_sentences for w in plain_words(s)}
    train_words = {w for s in set(written.values()) - dev_sentences for w in plain_words(s)}
    for r in dev:
        if r["label"] == "random":
            assert r["text"] not in written and set(r["text"].split()) <= dev_words
    for r in train:
        if r["label"] == "random":
            assert r["text"] not in written and set(r["text"].split()) <= train_words
    # The pipeline's corpus leaves the dev sentences out and keeps the training ones.
    corpus = default_corpus(tmp_path / "corpus.txt", progress=False, exclude=dev_sentences, roots=[root])
    lines = set(corpus.read_text().splitlines())
    assert not lines & dev_sentences
    assert {written[r["text"]] for r in train if r["label"] == "written"} <= lines
    again = build_word_salad_task(tmp_path / "again", seed=5, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(again["train"]).read_text() == Path(info["train"]).read_text()  # seeded
    other = build_word_salad_task(tmp_path / "other", seed=6, stdlib=root, packages=("alpha", "beta", "gamma"),
                                  train_max=60, dev_count=30)
    assert Path(other["train"]).read_text() != Path(info["train"]).read_text()
    with pytest.raises(RuntimeError, match="fewer than 100"):
        build_word_salad_task(tmp_path / "few", stdlib=root, packages=("alpha", "gamma"))


def test_word_salad_and_word_order_tasks_share_their_sentences(tmp_path):
    # The same seed gives both tasks the same split, so a run's kept models (whose pretraining left out one task's
    # dev sentences) can be screened on the other (bench/experiments/task_candidates.py relies on it).
    root = _fake_stdlib(tmp_path / "lib")
    kw = dict(seed=2, stdlib=root, packages=("alpha", "beta", "gamma"), train_max=60, dev_count=30)
    assert (build_word_salad_task(tmp_path / "s", **kw)["dev_sentences"]
            == build_word_order_task(tmp_path / "o", **kw)["dev_sentences"])


def test_random_words_draw_by_frequency_from_other_sentences():
    # Sentence 0 owns "c" x4, sentence 1 owns "a" x3 and "b" x1: drawing for sentence 0 gives "a" with probability
    # 3/4. Over 4,000 draws the binomial standard deviation of the share is sqrt(0.75 * 0.25 / 4000) = 0.0068;
    # the bound is four of them.
    pool, owner = ["c"] * 4 + ["a", "a", "b", "a"], [0] * 4 + [1] * 4
    drawn = random_words(4000, pool, owner, 0, random.Random(0))
    assert set(drawn) == {"a", "b"} and abs(drawn.count("a") / 4000 - 0.75) < 4 * 0.0068
    assert random_words(3, pool, owner, 7, random.Random(0)) == random_words(3, pool, owner, 7, random.Random(0))
    with pytest.raises(ValueError, match="another sentence"):
        random_words(1, ["x", "y"], [3, 3], 3, random.Random(0))


@given(st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(0, 3), st.integers(0, 20), st.integers(0, 1000))
@settings(max_examples=200, deadline=None)
def test_random_words_never_take_a_sentences_own_words(occurrences, own, count, seed):
    pool, owner = [w for w, _ in occurrences], [o for _, o in occurrences]
    allowed = {w for w, o in occurrences if o != own}
    if not allowed:
        with pytest.raises(ValueError):
            random_words(count, pool, owner, own, random.Random(seed))
        return
    drawn = random_words(count, pool, owner, own, random.Random(seed))
    assert len(drawn) == count and set(drawn) <= allowed


def test_plain_words_and_shuffle_words():
    assert plain_words("(See below). Then: it's done -- e.g. x_y!") == ["See", "below", "Then", "it's", "done",
                                                                         "e.g", "x_y"]
    rng = random.Random(0)
    words = "a b c d".split()
    for _ in range(50):
        shuffled = shuffle_words(words, rng)
        assert shuffled != words and sorted(shuffled) == words
    assert shuffle_words(["a", "a", "b"], rng) != ["a", "a", "b"]
    with pytest.raises(ValueError):
        shuffle_words(["a", "a"], rng)


def test_last_line_names_the_page_and_the_serve_command(pipeline_run, capsys):
    from bertkit.pipeline import print_summary

    out, report = pipeline_run
    print_summary(report)
    printed = capsys.readouterr().out
    last = printed.rstrip("\n").splitlines()[-1]
    assert last == f"report: {out / 'report.html'}   serve: {report['serve']}"
    assert "label-efficiency curve" in printed and "fill-mask on" in printed and "true: " in printed
    assert "top 100" in printed and report["machine"]["summary"] in printed
