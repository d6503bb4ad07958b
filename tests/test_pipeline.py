"""bertkit.pipeline: the one-command run, end to end on a tiny corpus and task with a budget of a few seconds, and
its parts: the built-in task, the precision choice, the budget plan, fill-mask on held-out text, the report page."""

from __future__ import annotations

import base64
import json
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bertkit.checkpoint import CONFIG_NAME, WEIGHTS_NAME
from bertkit.pipeline import (build_docstring_task, choose_precision, cpu_bf16_flags, default_corpus, plan_budget,
                              prose_sentences, run_pipeline)

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
    report = run_pipeline(out, corpus=[str(corpus)], preset="tiny", vocab_size=120, probes=["the [MASK] sat."],
                          progress=False, train_seconds=3.0, task_train=str(train), task_dev=str(dev),
                          text_column="sentence", label_column="colour", finetune_epochs=2, finetune_seeds=2,
                          fill_mask_prompts=40)
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
        for seed in (0, 1):
            ft = out / "finetune" / f"{start}-seed{seed}"
            assert (ft / "results.json").is_file() and (ft / "model" / WEIGHTS_NAME).is_file()
    assert json.loads((out / "report.json").read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    assert (out / "report.html").is_file() and report["report"] == str(out / "report.html")
    assert len(report["plots"]) == 4 and all(Path(p).is_file() and p.endswith(".png") for p in report["plots"])
    assert report["serve"] == f"bertkit serve --model {report['finetune']['pretrained']['model']}"


def test_report_fields(pipeline_run):
    out, report = pipeline_run
    assert set(report) == {"corpus", "corpus_summary", "tokens", "vocab_size", "machine", "precision",
                           "precision_reason", "measured_tokens_per_s", "recipe", "model_summary", "plan", "speed",
                           "finetune_speed", "steps", "train_tokens", "tokens_per_s", "eval_points", "evaluations",
                           "mlm_accuracy_before", "mlm_accuracy_after", "perplexity_before", "perplexity_after",
                           "finetune", "fill_mask", "probes", "model", "report", "serve", "timings", "commands",
                           "minutes", "plots"}
    manifest = json.loads((out / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert report["tokens"] == manifest["splits"]["train"]["tokens"] > 0
    assert report["corpus_summary"]["eval"]["documents"] == manifest["splits"]["eval"]["documents"] >= 2
    assert report["vocab_size"] <= 120
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
    assert report["eval_points"] == len(evals) >= 10
    steps = [e["step"] for e in evals]
    assert steps[0] == 0 and steps[-1] == report["steps"]
    # Every evaluation but the last (at the end of the time budget) falls on a multiple of the interval.
    assert steps[:-1] == list(range(0, every * (len(steps) - 1), every))
    assert all(e["eval_perplexity"] > 0 and 0 <= e["eval_mlm_accuracy"] <= 1 for e in evals)


def test_finetuning_compares_like_with_like(pipeline_run):
    out, report = pipeline_run
    ft = report["finetune"]
    assert ft["seeds"] == [0, 1] and ft["train_examples"] == 64 and ft["dev_examples"] == 32
    assert ft["labels"] == ["blue", "red"] and ft["epochs"] == 2
    # The same architecture from both starting points (dropout aside: fine-tuning sets it for both).
    architecture = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size", "pad_token_id")
    configs = [json.loads((d / CONFIG_NAME).read_text()) for d in (out / "run" / "model", out / "scratch")]
    assert [{k: c.get(k) for k in architecture} for c in configs][0] == {k: configs[1].get(k) for k in architecture}
    # The same recipe, budget and seed for each pair, and the summary is the mean of the runs' best epochs.
    for seed in (0, 1):
        runs = [json.loads((out / "finetune" / f"{s}-seed{seed}" / "results.json").read_text())
                for s in ("pretrained", "scratch")]
        assert runs[0]["config"] == runs[1]["config"] and runs[0]["config"]["seed"] == seed
        assert runs[0]["max_steps"] == runs[1]["max_steps"] == 2 * runs[0]["steps_per_epoch"]
        for run, start in zip(runs, ("pretrained", "scratch")):
            assert ft[start]["accuracies"][seed] == run["best"]["accuracy"]
    for start in ("pretrained", "scratch"):
        assert ft[start]["accuracy"] == pytest.approx(sum(ft[start]["accuracies"]) / 2)
        assert [e for e, _ in ft[start]["curve"]] == [1.0, 2.0]
    train_labels, dev_labels = ([line.split("\t")[1] for line in (out.parent / f"{split}.tsv").read_text().splitlines()
                                 [1:]] for split in ("train", "dev"))
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
    assert {"finetune-table", "fill-mask-table"} <= set(page.tables)
    assert page.headings == ["machine", "corpus", "model", "pretraining", "finetuning", "fill-mask", "reproduce",
                             "files"]
    table = text[text.index('id="finetune-table"'):]
    table = table[:table.index("</table>")]
    scratch = f"{report['finetune']['scratch']['accuracy']:.3f}"
    for cell in ("pretrained", "random initialisation", "majority class", scratch):
        assert cell in table
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


def test_plan_budget_splits_the_time():
    # Roomy: three epochs for every seed, pretraining gets the rest, 30 evaluations of 500 rows.
    plan = plan_budget(540.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3, max_epochs=3)
    assert (plan.finetune_seeds, plan.finetune_epochs, plan.eval_rows) == (3, 3.0, 500)
    assert plan.finetune_run_s == pytest.approx(19.5)
    assert plan.pretrain_s == pytest.approx(540.0 - 6 * 19.5) and not plan.short
    assert plan.expected_steps == int((plan.pretrain_s - 30 * 500 * 0.0015) / 0.15)
    assert plan.eval_every == plan.expected_steps // 30
    # Tight: fewer seeds first, then fewer whole epochs, then a fraction of one; within fine-tuning's share.
    fewer = plan_budget(250.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3, max_epochs=3)
    assert (fewer.finetune_seeds, fewer.finetune_epochs) == (1, 3.0)
    tight = plan_budget(100.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3, max_epochs=3)
    assert (tight.finetune_seeds, tight.finetune_epochs) == (1, 2.0) and 2 * tight.finetune_run_s <= 0.3 * 100.0
    tiny = plan_budget(20.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=25.0, ft_eval_s=0.5, seeds=1, max_epochs=3)
    assert tiny.finetune_epochs == pytest.approx((0.3 * 20.0 / 2 - 0.5) / 25.0)  # a tenth of an epoch
    assert tiny.short and tiny.pretrain_s == 30.0
    assert plan_budget(20.0, 0.15, 0.0015, ft_epoch_s=600.0, ft_eval_s=0.5).finetune_epochs == 0.05  # the floor
    # A slow machine: evaluations shrink to keep within 12% of pretraining (not below 64 rows).
    slow = plan_budget(540.0, step_s=3.5, eval_row_s=0.06, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3, max_epochs=3)
    assert slow.eval_rows == 64  # 12% would allow 28 rows
    mid = plan_budget(540.0, step_s=1.0, eval_row_s=0.01, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3, max_epochs=3)
    assert mid.eval_rows == int(0.12 * mid.pretrain_s / 30 / 0.01) and 64 < mid.eval_rows < 500
    # The fixed cost of a run counts once per run.
    overhead = plan_budget(540.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=6.0, ft_eval_s=0.5, seeds=3,
                           max_epochs=3, ft_overhead_s=3.0)
    assert overhead.finetune_run_s == pytest.approx(22.5)
    assert overhead.pretrain_s == pytest.approx(540.0 - 6 * 22.5)
    # A fixed pretraining time: every seed and epoch, whatever they cost.
    fixed = plan_budget(0.0, step_s=0.15, eval_row_s=0.0015, ft_epoch_s=600.0, ft_eval_s=0.5, seeds=2, pretrain_s=3.0)
    assert (fixed.pretrain_s, fixed.finetune_seeds, fixed.finetune_epochs, fixed.short) == (3.0, 2, 5.0, False)
    with pytest.raises(ValueError):
        plan_budget(100.0, step_s=0.0, eval_row_s=1.0, ft_epoch_s=1.0, ft_eval_s=0.1)


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
    from bertkit.finetune import FinetuneConfig
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


def test_last_line_names_the_page_and_the_serve_command(pipeline_run, capsys):
    from bertkit.pipeline import print_summary

    out, report = pipeline_run
    print_summary(report)
    printed = capsys.readouterr().out
    last = printed.rstrip("\n").splitlines()[-1]
    assert last == f"report: {out / 'report.html'}   serve: {report['serve']}"
    assert "gain from pretraining" in printed and "fill-mask on" in printed and "true: " in printed
