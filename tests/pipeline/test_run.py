"""bertkit.pipeline.run: the one-command run, end to end on a tiny corpus and task with a budget of a few seconds:
every stage's files, the report's fields, the curve, fill-mask on held-out text by frequency band, the report page,
the summary printed. (Its parts have their own tests: test_corpus, test_task, test_plan, test_curve.)"""

from __future__ import annotations

import base64
import json
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bertkit.checkpoint import CONFIG_NAME, WEIGHTS_NAME
from bertkit.pipeline import run_pipeline
from bertkit.pipeline.curve import passes_for
from bertkit.pipeline.evaluation import FREQUENCY_BANDS
from bertkit.pipeline.run import print_summary

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


def test_last_line_names_the_page_and_the_serve_command(pipeline_run, capsys):
    out, report = pipeline_run
    print_summary(report)
    printed = capsys.readouterr().out
    last = printed.rstrip("\n").splitlines()[-1]
    assert last == f"report: {out / 'report.html'}   serve: {report['serve']}"
    assert "label-efficiency curve" in printed and "fill-mask on" in printed and "true: " in printed
    assert "top 100" in printed and report["machine"]["summary"] in printed
