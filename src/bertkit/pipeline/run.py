"""The main job in one call, `run_pipeline`: raw text -> vocabulary -> shards -> pretraining -> label-efficiency
curve -> report, each stage a named step below; and what it prints and offers to redo by hand."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import shutil
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Callable

import torch

from bertkit.data.corpus import CorpusLines
from bertkit.data.prepare import prepare
from bertkit.inference import fill_mask
from bertkit.models import ModelDir
from bertkit.pipeline.corpus import choose_normalisation, default_corpus
from bertkit.pipeline.curve import (BASELINE_SEEDS, FINETUNE, FINETUNE_MIN_EXAMPLES, FINETUNE_MIN_PASSES,
                                    FINETUNE_SEEDS, FINETUNED_MORE_SEEDS, FINETUNED_SEEDS, FROZEN, FROZEN_MAX_LABELS,
                                    FROZEN_SEEDS, LABEL_LADDER, START_NAMES, curve_schedule, curve_verdict,
                                    label_ladder, label_set_name, passes_for, quartiles, stratified_order,
                                    write_label_set)
from bertkit.pipeline.evaluation import FILL_MASK_PROMPTS, fill_mask_evaluation
from bertkit.pipeline.plan import (EVAL_INSTANCES, FINETUNE_OVERHEAD_S, FROZEN_OVERHEAD_S, Plan, choose_precision,
                                   describe_machine, finetune_cost, measure_pretraining_step, plan_budget)
from bertkit.pipeline.report import write_report
from bertkit.pipeline.task import build_word_salad_task
from bertkit.tasks.classify import ClassificationFamily
from bertkit.tasks.finetune import FinetuneConfig, finetune
from bertkit.tokenizers import WordPieceTokenizer
from bertkit.training.pretrain import init_model_dir, pretrain, resolve_config
from bertkit.training.trainer import setup_distributed

# The pretraining recipe: `mini-fast` plus the settings of the pretrain-vs-scratch experiment
# (docs/experiments/finetuning.md, "Measured: does a short CPU pretraining help fine-tuning?"): masked LM on packed
# rows of isolated documents, 20% of the tokens predicted. It gave the best held-out masked-token accuracy per CPU
# minute there: 0.290 at the tiny size (L2/H128, Google's BERT-Tiny shape) and 0.282 at the mini size (L4/H256) after
# 29 one-thread minutes on WikiText-2, where the `mini` recipe (MLM + NSP at length 128, fp32) stands at 0.107 after
# 20 two-thread minutes. The tiny size is the default: it runs three times the steps of the mini one, and over three
# minutes on this corpus (one thread each, side by side) it reached held-out accuracy 0.202 against the mini model's
# 0.170.
RECIPE = "mini-fast"
RECIPE_OVERRIDES = {"isolate_documents": True, "mask_prob": 0.2, "max_predictions_per_seq": 13,
                    "classifier_pooling": "mean"}
POOLING = RECIPE_OVERRIDES["classifier_pooling"]  # both starting points classify from the mean of the tokens
PRESET = "tiny"
# Peak learning rates by preset where the recipe's (1e-3) is not the best for the minutes of the main job: the tiny
# model after 1,355 one-thread steps on the docstring corpus (the same shards and steps for each, batch 32) reached
# held-out masked-token accuracy 0.194 at 1e-3, 0.218 at 2e-3 and 0.156 at 4e-3; a linear probe on its frozen mean
# and maximum separated the word salad at 32 labels (20 label sets) with 0.521 and 0.535 at 1e-3 and 2e-3.
PRESET_LEARNING_RATES = {"tiny": 2e-3}
GPU_PRESET = "small"  # on a CUDA GPU: L4/H512, whose steps a GPU runs about as fast as the CPU runs the tiny one's
EVAL_FRACTION = 0.03  # documents held out of pretraining
# At most this share of the budget assembles the built-in corpus (48 s of 10 minutes; parsed by one process per
# core). 30 s was tried: on a loaded machine (load 2.5, the pool's second process sharing a core) it gave 0.63M
# tokens instead of 1.14M, and the tiny model trained on them stood lower on its own held-out documents at the
# same step (masked-token accuracy 0.172 against 0.196 at step 1,000).
CORPUS_SHARE = 0.08


def _check_arguments(task_train: str | None, task_dev: str | None, precision: str, finetune_seeds: int,
                     preset: str | None, ladder: tuple[int, ...], min_examples: int) -> None:
    """ValueError (FileNotFoundError for a task file that is not there) naming the argument that is off."""
    if (task_train is None) != (task_dev is None):
        raise ValueError("give both --task-train and --task-dev (or neither, for the built-in task)")
    for path in (task_train, task_dev):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such task file")
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision must be auto, bf16 or fp32, got {precision!r}")
    if finetune_seeds < 1:
        raise ValueError(f"finetune_seeds must be at least 1, got {finetune_seeds}")
    if preset not in (None, "tiny", "mini", "small"):
        raise ValueError(f"preset must be tiny, mini or small, got {preset!r}")
    if not ladder or min(ladder) < 1 or min_examples < 1:
        raise ValueError("the ladder needs label counts of at least 1, and min_examples must be at least 1")


class _Clock:
    """The run's time: its start, the load average then, its budget and deadline (`minutes` after the start), the
    seconds of each stage (`lap` ends one), and the progress lines (`say`: print, or nothing without progress)."""

    def __init__(self, progress: bool, minutes: float):
        self.load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.started = self.last = time.perf_counter()
        self.minutes = minutes  # the budget
        self.deadline = self.started + minutes * 60.0
        self.timings: dict[str, float] = {}
        self.say: Callable[..., None] = print if progress else (lambda *a, **k: None)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 1)
        self.last = now


def _corpus_and_task(out: Path, corpus: list[str] | None, task_train: str | None, task_dev: str | None, seed: int,
                     minutes: float, progress: bool,
                     say: Callable[..., None]) -> tuple[dict[str, Any], list[str], bool]:
    """Stage 1: (the task's task.json content, or the user's task described; the corpus files; whether the corpus
    was written now). Without `corpus`, the docstrings corpus is assembled without the built-in task's dev
    sentences, or reused when OUT/corpus/corpus.json says it was assembled for the same task and seed."""
    if task_train is None:
        task_info = build_word_salad_task(out / "task", seed=seed)
    else:
        task_info = {"name": "user", "description": f"your task ({task_train}, dev {task_dev})",
                     "train": str(task_train), "dev": str(task_dev)}
    if corpus:
        say(f"1/7 corpus: {', '.join(corpus)}")
        return task_info, list(corpus), True
    held_out = task_info.get("dev_sentences", [])
    target = out / "corpus" / "docstrings.txt"
    stamp = out / "corpus" / "corpus.json"
    want = {"held_out_task_sentences": len(held_out), "seed": seed, "version": 4}
    if target.is_file() and stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == want:
        say(f"1/7 corpus: reusing {target}")
        return task_info, [str(target)], False
    say("1/7 corpus: assembling docstrings of the installed Python sources (parsed, not imported), "
        f"without the built-in task's {len(held_out):,} dev sentences")
    default_corpus(target, progress=progress, exclude=set(held_out), max_seconds=CORPUS_SHARE * minutes * 60.0)
    stamp.write_text(json.dumps(want) + "\n", encoding="utf-8")
    return task_info, [str(target)], True


def _vocabulary(tok_dir: Path, paths: list[str], fresh_corpus: bool, vocab_size: int, progress: bool,
                say: Callable[..., None]) -> tuple[WordPieceTokenizer, str]:
    """Stage 2: (the WordPiece tokenizer, saved in `tok_dir`; why its normalisation); an earlier run's is reused
    when the corpus was too."""
    lowercase, strip_accents, normalisation = choose_normalisation(CorpusLines(paths))
    if not fresh_corpus and (tok_dir / "vocab.txt").is_file():
        say(f"2/7 vocabulary: reusing {tok_dir}")
        return WordPieceTokenizer.from_pretrained(tok_dir), normalisation
    say(f"2/7 vocabulary: training a {vocab_size:,}-token WordPiece vocabulary, {normalisation}")
    tokenizer = WordPieceTokenizer.train(CorpusLines(paths), vocab_size=vocab_size, lowercase=lowercase,
                                         strip_accents=strip_accents, show_progress=progress)
    tokenizer.save(tok_dir)
    return tokenizer, normalisation


def _shards(paths: list[str], tok_dir: Path, data_dir: Path, seed: int, progress: bool,
            say: Callable[..., None]) -> tuple[Path, dict[str, Any]]:
    """Stage 3: `bertkit prepare` into `data_dir`, `EVAL_FRACTION` of the documents held out; (data_dir, its
    summary per split)."""
    say(f"3/7 shards: tokenising into memory-mapped shards ({EVAL_FRACTION:.0%} of the documents held out)")
    manifest = prepare(paths, tok_dir, data_dir, eval_fraction=EVAL_FRACTION, progress=progress, seed=seed)
    return data_dir, manifest.summary()["splits"]


def _machine(device: str, preset: str | None, precision: str,
             load_at_start: float | None) -> tuple[torch.device, str, dict[str, Any], str, str, str, str]:
    """Stage 4's machine: (torch device, a note when other work fills the cores, `describe_machine`, the preset,
    the precision asked for, the precision chosen, why)."""
    _, torch_device = setup_distributed(device)
    threads_note = ""
    if torch_device.type == "cpu" and load_at_start is not None and load_at_start > (os.cpu_count() or 1) > 1:
        # Other work already fills the cores: threads of one operation that wait for each other then lose most of
        # their time (measured: a tiny model's step 3x slower on 2 threads than on 1 at a load of 14 on 2 cores).
        torch.set_num_threads(1)
        threads_note = f"; one thread (load {load_at_start:.1f} on {os.cpu_count()} cores)"
    machine = {**describe_machine(torch_device), "load_average_at_start": load_at_start}
    if preset is None:
        preset = GPU_PRESET if torch_device.type == "cuda" else PRESET
    if precision == "auto":
        return torch_device, threads_note, machine, preset, precision, *choose_precision(torch_device.type)
    return torch_device, threads_note, machine, preset, precision, precision, "asked for on the command line"


def _recipe(preset: str, seed: int, progress: bool, device: str, precision: str, **more: Any):
    """The pretraining config: `RECIPE` with `RECIPE_OVERRIDES`, the preset's learning rate and `more`."""
    rate = {"learning_rate": PRESET_LEARNING_RATES[preset]} if preset in PRESET_LEARNING_RATES else {}
    return resolve_config(RECIPE, {"preset": preset, "seed": seed, "progress": progress, "precision": precision,
                                   "device": device, "eval_instances": EVAL_INSTANCES, **RECIPE_OVERRIDES, **rate,
                                   **more})


def _speed(data_dir: Path, recipe: Callable[..., Any], torch_device: torch.device, precision: str, asked: str,
           why: str) -> tuple[str, str, dict[str, float], dict[str, float]]:
    """Stage 4's timed steps: (precision, why, `measure_pretraining_step`'s figures at it, tokens per second by
    precision measured). On a CPU with native bf16 fp32 is timed too, and kept when clearly faster."""
    speed = measure_pretraining_step(data_dir, recipe(precision=precision))
    speeds = {precision: speed["tokens_per_s"]}
    if torch_device.type == "cpu" and precision == "bf16":
        # Native bf16 makes the large matrix products faster, but autocast casts every operand: on a small model
        # the casts can cost more than they save. Both are measured; fp32 is kept when clearly faster.
        fp32 = measure_pretraining_step(data_dir, recipe(precision="fp32"))
        speeds["fp32"] = fp32["tokens_per_s"]
        measured = (f"{speeds['bf16']:,.0f} tokens/s measured here per pretraining step in bf16, "
                    f"{speeds['fp32']:,.0f} in fp32")
        if asked == "auto" and speeds["fp32"] > 1.1 * speeds["bf16"]:
            precision, speed = "fp32", fp32
            why = why.replace(", so bf16 autocast", "") + f", but fp32 is faster for this model: {measured}"
        else:
            why += f": {measured}"
    return precision, why, speed, speeds


@dataclasses.dataclass(frozen=True)
class _Task:
    """The curve's task, read once: its examples, labels and files, and the fine-tuning configs that read it."""

    info: dict[str, Any]  # task.json's content (the built-in task) or the user's task described
    train: list  # training examples (`ClassificationFamily.read`)
    dev: list  # dev examples
    classes: list[str]  # the labels, sorted
    majority: str  # the most frequent training label
    length: int  # max_seq_length (the pretraining recipe's)
    user_config: FinetuneConfig  # reads the user's files, with their columns
    config: FinetuneConfig  # fine-tunes on the curve's files (text, pair?, label)
    sets_dir: Path  # the label sets and dev.jsonl
    dev_file: Path  # the dev set in the curve's JSON Lines form

    @property
    def labels(self) -> list[str]:
        return [str(e.label) for e in self.train]


def _read_task(out: Path, info: dict[str, Any], task_train: str, task_dev: str, text_column: str,
               pair_column: str | None, label_column: str, length: int, seed: int, precision: str,
               device: str) -> _Task:
    """The task's examples read, its dev set written as OUT/finetune/sets/dev.jsonl, the curve's fine-tuning
    config (`FINETUNE`, one epoch over a label set's file)."""
    user_config = FinetuneConfig(kind="classify", max_seq_length=length, text_column=text_column,
                                 pair_column=pair_column, label_column=label_column, progress=False)
    family = ClassificationFamily(user_config)
    train, dev = family.read(task_train, training=True), family.read(task_dev, training=False)
    labels = [str(e.label) for e in train]
    # The curve's files: the label sets (written per run) and the dev set, in one JSON Lines form.
    sets_dir = out / "finetune" / "sets"
    dev_file = write_label_set(dev, list(range(len(dev))), 1, sets_dir / "dev.jsonl")
    config = FinetuneConfig(kind="classify", max_seq_length=length, epochs=1.0, seed=seed, precision=precision,
                            device=device, progress=False, text_column="text",
                            pair_column="pair" if dev[0].pair is not None else None, label_column="label", **FINETUNE)
    return _Task(info, train, dev, sorted(set(labels)), collections.Counter(labels).most_common(1)[0][0], length,
                 user_config, config, sets_dir, dev_file)


@dataclasses.dataclass(frozen=True)
class _Arms:
    """The curve's runs planned as entries ("arms"): the curve's label counts (`rungs`), each for both starting
    points, then the baseline at each frozen count, random initialisation fine-tuned (one starting point)."""

    rungs: list[int]  # the curve's label counts
    rung_configs: list[FinetuneConfig]  # their recipe: a regression on the frozen encoder, or fine-tuning
    baseline: list[int]  # indices of the frozen rungs, each with a baseline entry after the rungs
    labels: list[int]  # label count of every entry
    configs: list[FinetuneConfig]  # recipe of every entry
    starts: list[int]  # starting points of every entry: 2, or 1 for the baseline's
    passes: list[int]  # passes over the label set of every entry


def _arms(task: _Task, ladder: tuple[int, ...], frozen_max_labels: int, min_examples: int) -> _Arms:
    """The curve's entries for this task (`label_ladder`): a logistic regression on the frozen encoder up to
    `frozen_max_labels` labels (one pass: the encoder's layers are computed once per example and starting point,
    a cache file each), fine-tuning above (`passes_for`); the baseline's entries fine-tuned."""
    rungs = label_ladder(len(task.train), len(task.classes), tuple(ladder))
    rung_configs = [dataclasses.replace(task.config, **FROZEN) if n <= frozen_max_labels else task.config
                    for n in rungs]
    baseline = [i for i, c in enumerate(rung_configs) if c.frozen]
    labels = rungs + [rungs[i] for i in baseline]
    configs = rung_configs + [task.config] * len(baseline)
    passes = [1 if c.frozen else passes_for(n, min_examples) for n, c in zip(labels, configs)]
    return _Arms(rungs, rung_configs, baseline, labels, configs, [2] * len(rungs) + [1] * len(baseline), passes)


def _plan(arms: _Arms, task: _Task, ft_speed: dict[str, float], speed: dict[str, float], finetune_seeds: int,
          train_seconds: float | None, clock: _Clock) -> tuple[Plan, list[int]]:
    """Stage 4's plan (`plan_budget`) for the time left before the deadline, or for `train_seconds` of
    pretraining (every seed runs, no deadline); and the seeds wanted at each entry."""
    per_example_s = ft_speed["epoch_s"] / len(task.train)
    # A frozen encoder reads each new example once, forward only (a third of a training step), and the regression
    # on the cached features costs little; a fine-tuned run also scores the dev set with the model it trained.
    example_s = [per_example_s / 3 if c.frozen else per_example_s for c in arms.configs]
    fixed_s = [ft_speed["eval_s"] + (FROZEN_OVERHEAD_S if c.frozen else FINETUNE_OVERHEAD_S) for c in arms.configs]
    # The fewest labels, where the spread is widest and the claim is made, get the most seeds; the other frozen
    # counts cost little; the fine-tuned ones one planned seed (more with the time left at the end), so that the
    # minutes go to pretraining, which the whole curve stands on. With a given pretraining time every seed runs.
    tuned_seeds = FINETUNED_SEEDS if train_seconds is None else FINETUNED_MORE_SEEDS
    wanted = [finetune_seeds if i == 0 else min(finetune_seeds, FROZEN_SEEDS if c.frozen else tuned_seeds)
              for i, c in enumerate(arms.rung_configs)]
    wanted += [min(finetune_seeds, BASELINE_SEEDS if j == 0 else tuned_seeds) for j in range(len(arms.baseline))]
    if train_seconds is not None:  # a given pretraining time: every seed runs
        clock.deadline = math.inf  # a test's budget is in steps and seconds, not minutes
        return plan_budget(0.0, speed["step_s"], speed["eval_row_s"], arms.labels, example_s, fixed_s, wanted,
                           passes=arms.passes, starts=arms.starts, pretrain_s=train_seconds), wanted
    # Pretraining's last evaluation and save, fill-mask, the report.
    end_reserve = 15.0 + EVAL_INSTANCES * speed["eval_row_s"]
    remaining = clock.deadline - time.perf_counter() - end_reserve
    return plan_budget(remaining, speed["step_s"], speed["eval_row_s"], arms.labels, example_s, fixed_s, wanted,
                       passes=arms.passes, starts=arms.starts), wanted


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What stage 4 decided: the machine, the model size and precision, the speeds, the task, the curve's entries
    and the plan."""

    torch_device: torch.device
    machine: dict[str, Any]  # `describe_machine` (the report adds the load averages)
    preset: str
    precision: str
    why: str  # why that precision
    speed: dict[str, float]  # `measure_pretraining_step` at that precision
    speeds: dict[str, float]  # tokens per second by precision measured
    recipe: Callable[..., Any]  # `_recipe` with this run's preset, seed, progress and device
    task: _Task
    arms: _Arms
    ft_speed: dict[str, float]  # `finetune_cost`
    plan: Plan
    wanted: list[int]  # seeds wanted at each entry of `arms`


def _setup(out: Path, data_dir: Path, tok_dir: Path, task_info: dict[str, Any], task_files: tuple[str, str],
           columns: tuple[str, str | None, str], device: str, preset: str | None, precision: str, seed: int,
           progress: bool, load_at_start: float | None, normalisation: str,
           curve_settings: tuple[tuple[int, ...], int, int, int, float | None], clock: _Clock) -> _Setup:
    """Stage 4: the machine, precision and model size, a few timed steps, the randomly initialised model
    (OUT/scratch), the task read, the curve's entries and the plan, said in a progress line. task_files: (train,
    dev); columns: (text, pair, label); curve_settings: (ladder, frozen_max_labels, min_examples, finetune_seeds,
    train_seconds) as `run_pipeline` takes them."""
    ladder, frozen_max_labels, min_examples, finetune_seeds, train_seconds = curve_settings
    torch_device, threads_note, machine, preset, asked, precision, why = _machine(device, preset, precision,
                                                                                  load_at_start)
    recipe = functools.partial(_recipe, preset=preset, seed=seed, progress=progress, device=device)
    precision, why, speed, speeds = _speed(data_dir, recipe, torch_device, precision, asked, why)
    init_model_dir(out / "scratch", tok_dir, preset=preset, seed=seed, classifier_pooling=POOLING)
    task = _read_task(out, task_info, *task_files, *columns, recipe(precision=precision).data.max_seq_length, seed,
                      precision, device)
    arms = _arms(task, ladder, frozen_max_labels, min_examples)
    ft_speed = finetune_cost(*task_files, task.user_config, tok_dir, speed["tokens_per_s"])
    plan, wanted = _plan(arms, task, ft_speed, speed, finetune_seeds, train_seconds, clock)
    clock.say(_plan_line(plan, arms, machine, torch_device, preset, task.length, precision, why, threads_note,
                         normalisation))
    if plan.short:
        clock.say(f"   {clock.minutes:g} minutes are too few for every stage: pretraining gets its minimum of "
                  f"{plan.pretrain_s:.0f} s anyway")
    return _Setup(torch_device, machine, preset, precision, why, speed, speeds, recipe, task, arms, ft_speed, plan,
                  wanted)


def _plan_line(plan: Plan, arms: _Arms, machine: dict[str, Any], torch_device: torch.device, preset: str,
               length: int, precision: str, why: str, threads_note: str, normalisation: str) -> str:
    """The progress line that says what stage 4 decided."""
    size_why = ("a CUDA GPU: the larger model" if torch_device.type == "cuda"
                else "the size with the most held-out accuracy per CPU minute")
    rungs = len(arms.rungs)
    return (f"4/7 plan on {machine['summary']}: {preset} BERT ({size_why}), length {length}, {precision} ({why})"
            f"{threads_note}; vocabulary {normalisation}; pretraining "
            f"{plan.pretrain_s / 60:.1f} min (~{plan.expected_steps:,} steps, {plan.eval_rows} held-out rows "
            f"evaluated every {plan.eval_every:,}); then the label-efficiency curve: "
            + ", ".join(f"{n:,} labels x {k} seed{'s' if k > 1 else ''}"
                        for n, k in zip(plan.ladder[:rungs], plan.seeds))
            + ", each for both starting points"
            + ("; beside the frozen points random initialisation fine-tuned: "
               + (", ".join(f"{n:,} labels x {k}" for n, k in zip(plan.ladder[rungs:], plan.seeds[rungs:]) if k)
                  or "none planned") + " (more with time left at the end)"
               if arms.baseline else "")
            + f" (~{plan.finetune_s / 60:.1f} min)"
            + ("" if list(plan.passes) == arms.passes
               else f"; passes cut to {', '.join(map(str, plan.passes))} to fit"))


def _pretraining(data_dir: Path, run_dir: Path, setup: _Setup, say: Callable[..., None]) -> tuple[Any, Any,
                                                                                                list[dict[str, Any]]]:
    """Stage 5: (the pretraining config, `pretrain`'s result, the held-out evaluations of RUN/metrics.jsonl)."""
    plan = setup.plan
    # Training lines at least as often as evaluations (a short run logs too, every 20 steps otherwise).
    config = setup.recipe(precision=setup.precision, max_time=plan.pretrain_s, eval_every=plan.eval_every,
                          log_every=min(20, plan.eval_every), eval_instances=plan.eval_rows)
    say(f"5/7 pretraining a {setup.preset} BERT for {plan.pretrain_s / 60:.1f} minutes (recipe {RECIPE}: masked LM, "
        f"length {setup.task.length}, {config.data.mask_prob:.0%} of the tokens predicted, {setup.precision})")
    result = pretrain(data_dir, run_dir, config, eval_at_start=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    return config, result, [r for r in records if "eval_mlm_accuracy" in r]


def _curve(out: Path, setup: _Setup, pretrained: Path, seed: int, min_examples: int, frozen_max_labels: int,
           train_seconds: float | None, clock: _Clock) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Stage 6: the curve's runs (`_run_curve`), then its points (`_curve_points`); and the fine-tuned models
    kept."""
    task, arms, plan = setup.task, setup.arms, setup.plan
    clock.say(f"6/7 label-efficiency curve on {task.info['description']}: {len(task.train):,} training and "
              f"{len(task.dev):,} dev examples, {len(task.classes)} classes; pretrained and from random "
              f"initialisation, lr {FINETUNE['learning_rate']:g}, at least {min_examples:,} examples seen per run"
              + (f"; up to {frozen_max_labels:,} labels a logistic regression on the frozen encoder's last layer"
                 + ", and beside it random initialisation fine-tuned" if arms.baseline else ""))
    more = ([max(w, 0 if c.frozen else FINETUNED_MORE_SEEDS) for w, c in zip(setup.wanted, arms.configs)]
            if train_seconds is None else list(plan.seeds))
    results, kept = _run_curve(out, arms, task, plan, more, pretrained, out / "scratch", seed, clock)
    return _curve_points(arms, plan, results), kept


def _run_curve(out: Path, arms: _Arms, task: _Task, plan: Plan, more: list[int], pretrained: Path, scratch: Path,
               seed: int, clock: _Clock) -> tuple[list[dict[str, list[dict[str, Any]]]], dict[str, Path]]:
    """Stage 6's runs in `curve_schedule`'s order, each skipped that would end past the deadline: ([per entry,
    {starting point: [{"seed", "accuracy", "macro_f1", "seconds"}, ...]}], {starting point: the fine-tuned model
    kept, all labels and the first seed})."""
    orders = {}
    # The starting points each entry runs: the curve's both, the baseline's random initialisation fine-tuned.
    rungs = len(arms.rungs)
    named = [(("pretrained", pretrained), ("scratch", scratch))] * rungs + [(("scratch_finetuned", scratch),)] * (
        len(arms.baseline))
    results: list[dict[str, list[dict[str, Any]]]] = [{name: [] for name, _ in starts} for starts in named]
    # The fewest labels first, for the curve and for its fine-tuned baseline: the claim is made there.
    schedule = curve_schedule(list(plan.seeds), more, (0, rungs) if arms.baseline else (0,))
    planned_runs = sum(plan.seeds)
    kept: dict[str, Path] = {}
    # Estimated and measured seconds of the pairs run so far, for the frozen and the fine-tuned recipe apart: each
    # corrects its own estimates (a regression's fixed costs say nothing of a fine-tuning run's).
    planned, spent = {True: 0.0, False: 0.0}, {True: 0.0, False: 0.0}
    for at, (i, k) in enumerate(schedule):
        n, run_seed = arms.labels[i], seed + k
        left = clock.deadline - time.perf_counter() - 15.0
        kind = arms.configs[i].frozen
        pair_s = plan.starts[i] * plan.run_s[i] * (spent[kind] / planned[kind] if planned[kind] else 1.0)
        if (i, k) != (0, 0) and left < pair_s:
            if at < planned_runs:  # an extra seed that does not fit is simply not run
                clock.say(f"   {n:,} labels, seed {run_seed}: skipped ({max(left, 0):.0f} s left, a pair of runs "
                          f"takes ~{pair_s:.0f} s here)")
            continue
        began_pair = time.perf_counter()
        if run_seed not in orders:
            orders[run_seed] = stratified_order(task.labels, run_seed)
        # The baseline's label set is the curve's, repeated for its passes (`label_set_name`).
        train_file = write_label_set(task.train, orders[run_seed][:n], plan.passes[i],
                                     task.sets_dir / label_set_name(n, run_seed, i >= rungs))
        line = []
        for name, start in named[i]:
            began = time.perf_counter()
            keep = i == rungs - 1 and k == 0  # all labels, first seed: the fine-tuned models kept
            run, model = _run_point(out, name, start, n, run_seed, arms.configs[i], train_file, task.dev_file, keep)
            results[i][name].append({**run, "seconds": round(time.perf_counter() - began, 1)})
            if keep:
                kept[name] = model
            line.append(f"{START_NAMES[name]} {run['accuracy']:.3f}")
        clock.say(f"   {n:>6,} labels, seed {run_seed}: dev accuracy " + ", ".join(line)
                  + f" ({time.perf_counter() - began:.0f} s a run)")
        planned[kind] += plan.starts[i] * plan.run_s[i]
        spent[kind] += time.perf_counter() - began_pair
    return results, kept


def _run_point(out: Path, name: str, start: Path, labels: int, seed: int, config: FinetuneConfig, train_file: Path,
               dev_file: Path, keep: bool) -> tuple[dict[str, Any], Path]:
    """One run of the curve, from starting point `start` (named `name`) on a label set, in a fresh
    OUT/finetune/NAME-N-seedS (its log there): ({"seed", "accuracy", "macro_f1"} at its end, its model's
    directory). Its resume state is removed, and its model unless `keep`."""
    ft_dir = out / "finetune" / f"{name.replace('_', '-')}-{labels}-seed{seed}"
    if ft_dir.exists():
        shutil.rmtree(ft_dir)  # a fresh run: no checkpoint or evaluation of an earlier one mixes in
    ft_dir.mkdir(parents=True)
    run_config = dataclasses.replace(config, seed=seed)
    if run_config.frozen:
        run_config = dataclasses.replace(run_config, feature_cache=str(out / "finetune" / f"{name}.features"))
    with open(ft_dir / "log.txt", "w", encoding="utf-8") as log, redirect_stdout(log):
        got = finetune("classify", start, train_file, dev_file, ft_dir, run_config, new_heads=True)
    last = got["epochs"][-1]
    shutil.rmtree(ft_dir / "checkpoints", ignore_errors=True)  # resume state: not needed once finished
    if not keep:
        shutil.rmtree(ft_dir / "model", ignore_errors=True)
    return {"seed": seed, "accuracy": last["accuracy"], "macro_f1": last.get("macro_f1")}, ft_dir / "model"


def _curve_points(arms: _Arms, plan: Plan, results: list[dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """The curve as the report gives it: per label count that ran, each starting point's `quartiles` and runs,
    the baseline's beside the frozen points, and `curve_verdict`."""
    curve = []
    for i, n in enumerate(arms.rungs):
        if not results[i]["pretrained"]:
            continue  # every run of this label count was skipped: out of time
        point = {"labels": n, "passes": plan.passes[i], "frozen": arms.rung_configs[i].frozen}
        for name in ("pretrained", "scratch"):
            runs = results[i][name]
            point[name] = {**quartiles([r["accuracy"] for r in runs]), "runs": runs}
        if i in arms.baseline:
            arm = len(arms.rungs) + arms.baseline.index(i)
            runs = results[arm]["scratch_finetuned"]
            if runs:
                point["scratch_finetuned"] = {**quartiles([r["accuracy"] for r in runs]), "runs": runs,
                                              "passes": plan.passes[arm]}
        point.update(curve_verdict(point))
        curve.append(point)
    return curve


def _pretraining_figures(result, evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's pretraining figures: steps, tokens, speed, and the held-out evaluations (first and last)."""
    return {
        "steps": result.step,
        "train_tokens": result.tokens,
        "tokens_per_s": round(result.tokens / max(result.elapsed, 1e-9), 1),
        "eval_points": len(evals),
        "evaluations": [{k: r[k] for k in ("step", "eval_mlm_accuracy", "eval_perplexity") if k in r} for r in evals],
        **{f"{key}_{when}": evals[at].get(f"eval_{key}") if evals else None
           for key in ("mlm_accuracy", "perplexity") for when, at in (("before", 0), ("after", -1))},
    }


def _corpus_facts(splits: dict[str, Any], tokenizer: WordPieceTokenizer, normalisation: str) -> dict[str, Any]:
    """The report's corpus and vocabulary: documents, sentences and tokens per split, the normalisation."""
    return {"corpus_summary": {split: {k: v[k] for k in ("documents", "sentences", "tokens")}
                               for split, v in splits.items()},
            "tokens": splits.get("train", {}).get("tokens"),
            "vocab_size": tokenizer.vocab_size,
            "normalisation": {"lowercase": tokenizer.lowercase, "strip_accents": tokenizer.strip_accents,
                              "why": normalisation}}


def _setup_facts(setup: _Setup, config, model_dir: Path) -> dict[str, Any]:
    """The report's machine (the load average now added), precision, recipe, model, plan and speeds."""
    trained = ModelDir.open(model_dir)
    n_params = trained.load("pretraining").num_parameters()
    setup.machine["load_average_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"machine": setup.machine, "precision": setup.precision, "precision_reason": setup.why,
            "measured_tokens_per_s": setup.speeds,
            "recipe": {"name": RECIPE, **RECIPE_OVERRIDES, "max_seq_length": setup.task.length,
                       "eval_instances": setup.plan.eval_rows, "batch_size": config.data.batch_size,
                       "learning_rate": config.train.learning_rate},
            "model_summary": {"preset": setup.preset, "layers": trained.raw.get("num_hidden_layers"),
                              "hidden": trained.raw.get("hidden_size"),
                              "heads": trained.raw.get("num_attention_heads"), "parameters": n_params},
            "plan": dataclasses.asdict(setup.plan), "speed": setup.speed, "finetune_speed": setup.ft_speed}


def _probes(model_dir: Path, probes: list[str]) -> dict[str, list[tuple[str, float]]]:
    """{probe sentence: its five best fillers for [MASK], (token, probability)} from the pretrained model."""
    found = {}
    for text in probes:
        candidates = fill_mask(model_dir, text, top_k=5)
        found[text] = [(c["token"], round(c["probability"], 3)) for c in candidates[0]]
    return found


def _finetune_summary(task: _Task, curve: list[dict[str, Any]], kept: dict[str, Path], min_examples: int,
                      frozen_max_labels: int) -> dict[str, Any]:
    """The report's "finetune": the task, its recipe, the curve and the fine-tuned models kept."""
    return {"task": {k: v for k, v in task.info.items() if k != "dev_sentences"},
            "train_examples": len(task.train), "dev_examples": len(task.dev),
            "pairs": task.dev[0].pair is not None, "labels": task.classes, "majority_label": task.majority,
            "majority_accuracy": sum(str(e.label) == task.majority for e in task.dev) / len(task.dev),
            "config": {**FINETUNE, "max_seq_length": task.length, "precision": task.config.precision,
                       "min_examples": min_examples, "min_passes": FINETUNE_MIN_PASSES,
                       "frozen_max_labels": frozen_max_labels, "frozen_layers": FROZEN["layers"],
                       "frozen_task_model": FROZEN["task_model"]},
            "curve": curve,
            "models": {name: str(path) for name, path in kept.items()}}


def run_pipeline(out_dir: str | Path = "runs/pipeline", corpus: list[str] | None = None, minutes: float = 10.0,
                 preset: str | None = None, vocab_size: int = 8192, probes: list[str] | None = None,
                 progress: bool = True, seed: int = 0, train_seconds: float | None = None,
                 task_train: str | None = None, task_dev: str | None = None, text_column: str = "text",
                 pair_column: str | None = None, label_column: str = "label", precision: str = "auto",
                 finetune_seeds: int = FINETUNE_SEEDS, ladder: tuple[int, ...] = LABEL_LADDER,
                 min_examples: int = FINETUNE_MIN_EXAMPLES, fill_mask_prompts: int = FILL_MASK_PROMPTS,
                 device: str = "auto", frozen_max_labels: int = FROZEN_MAX_LABELS) -> dict[str, Any]:
    """Run every stage (see the module docstring); return the report, also written to OUT/report.json, with the
    page OUT/report.html. The last line printed names the page and the command that serves the model.

    minutes: the whole run's budget; the set-up stages take what they take, then the time left is split between
        pretraining and the label-efficiency curve (`plan_budget`); a run that would end past the budget is
        skipped (every label count keeps its first seed).
    train_seconds: the pretraining budget in seconds instead (tests and quick looks; every seed then runs).
    preset: tiny, mini or small; default tiny on a CPU, small on a CUDA GPU.
    task_train, task_dev: the user's labelled task (CSV/TSV/JSONL with the named columns, as `bertkit finetune
        classify` reads); both or neither. Without them the built-in task (`build_word_salad_task`) is used.
    precision: auto (bf16 where the CPU has native bf16, `choose_precision`), bf16 or fp32.
    finetune_seeds: seeds seed, seed + 1, ... at the fewest labels (up to `FROZEN_SEEDS` at the other counts of
        the frozen encoder, `FINETUNED_SEEDS` planned at the fine-tuned ones and up to `FINETUNED_MORE_SEEDS` while
        the budget has room), the same for both starting points; fewer when the budget is short.
    ladder: the label counts of the curve (those below the training set's size; all labels are added).
    min_examples: training examples each fine-tuning run sees at least (`passes_for`).
    frozen_max_labels: label counts up to this fit a logistic regression on the frozen encoder (`FROZEN`).
    device: auto (CUDA when available), cpu or cuda.
    """
    _check_arguments(task_train, task_dev, precision, finetune_seeds, preset, ladder, min_examples)
    clock = _Clock(progress, minutes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    # 1. Corpus, and the built-in task (its dev sentences are kept out of the corpus).
    task_info, paths, fresh_corpus = _corpus_and_task(out, corpus, task_train, task_dev, seed, minutes, progress,
                                                      clock.say)
    columns = ("text", None, "label") if task_train is None else (text_column, pair_column, label_column)
    clock.lap("corpus")

    # 2. Vocabulary, its normalisation chosen for the corpus's script.
    tok_dir = out / "tokenizer"
    tokenizer, normalisation = _vocabulary(tok_dir, paths, fresh_corpus, vocab_size, progress, clock.say)
    clock.lap("vocabulary")

    # 3. Shards.
    data_dir, splits = _shards(paths, tok_dir, out / "data", seed, progress, clock.say)
    clock.lap("shards")

    # 4. Machine, precision, model size, speeds, the plan.
    setup = _setup(out, data_dir, tok_dir, task_info, (task_info["train"], task_info["dev"]), columns, device,
                   preset, precision, seed, progress, clock.load_at_start, normalisation,
                   (ladder, frozen_max_labels, min_examples, finetune_seeds, train_seconds), clock)
    clock.lap("plan")

    # 5. Pretraining.
    run_dir = out / "run"
    config, result, evals = _pretraining(data_dir, run_dir, setup, clock.say)
    clock.lap("pretraining")

    # 6. The label-efficiency curve: both starting points, same label sets, recipe and seeds.
    curve, kept = _curve(out, setup, run_dir / "model", seed, min_examples, frozen_max_labels, train_seconds, clock)
    clock.lap("finetuning")

    # 7. Fill-mask on held-out text, and the report.
    clock.say(f"7/7 evaluation: fill-mask on up to {fill_mask_prompts:,} held-out sentences, and the report")
    fill = fill_mask_evaluation(run_dir / "model", data_dir, prompts=fill_mask_prompts, seed=seed)
    report = {"corpus": paths, **_corpus_facts(splits, tokenizer, normalisation),
              **_setup_facts(setup, config, run_dir / "model"), **_pretraining_figures(result, evals),
              "finetune": _finetune_summary(setup.task, curve, kept, min_examples, frozen_max_labels),
              "fill_mask": fill, "probes": _probes(run_dir / "model", probes or []), "model": str(run_dir / "model"),
              "report": str(out / "report.html"),
              # The end of the story is the fine-tuned model (the pretrained one serves fill-mask).
              "serve": f"bertkit serve --model {kept.get('pretrained', run_dir / 'model')}", "timings": clock.timings}
    report["commands"] = reproduce_commands(report, out, tok_dir, data_dir, run_dir, out / "scratch",
                                            setup.task.sets_dir, corpus_given=bool(corpus), vocab_size=vocab_size,
                                            seed=seed)
    clock.lap("evaluation")
    return _write(report, out, run_dir, clock, progress)


def _write(report: dict[str, Any], out: Path, run_dir: Path, clock: _Clock, progress: bool) -> dict[str, Any]:
    """The report with its minutes and figures, written as OUT/report.json and OUT/report.html, and printed."""
    # Drawing the page takes a few seconds more.
    report["minutes"] = round((time.perf_counter() - clock.started) / 60, 2)
    report["plots"] = [str(p) for p in write_report(report, run_dir, out / "report.html", out / "plots")]
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n", encoding="utf-8")
    if progress:
        print_summary(report)
    return report


def reproduce_commands(report: dict[str, Any], out: Path, tok_dir: Path, data_dir: Path, run_dir: Path,
                       scratch_dir: Path, sets_dir: Path, *, corpus_given: bool, vocab_size: int,
                       seed: int) -> list[tuple[str, str]]:
    """(stage, command) pairs that redo each stage with the separate verbs, with this run's settings."""
    plan, ft = report["plan"], report["finetune"]
    corpus = " ".join(report["corpus"])
    overrides = " ".join(f"--{k.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in RECIPE_OVERRIDES.items())
    norm = report["normalisation"]
    preset = report["model_summary"]["preset"]
    commands = []
    if not corpus_given:
        commands.append(("corpus and built-in task", f"python -c \"from pathlib import Path; from bertkit.pipeline "
                         f"import build_word_salad_task, default_corpus; t = build_word_salad_task('{out / 'task'}', "
                         f"seed={seed}); default_corpus(Path('{corpus}'), exclude=set(t['dev_sentences']))\""))
    commands += [
        ("vocabulary (" + norm["why"] + ")", f"python -c \"from bertkit.data.corpus import CorpusLines; from "
                       f"bertkit.tokenizers import WordPieceTokenizer; WordPieceTokenizer.train(CorpusLines("
                       f"{report['corpus']!r}), vocab_size={vocab_size}, lowercase={norm['lowercase']}, "
                       f"strip_accents={norm['strip_accents']}).save('{tok_dir}')\""),
        ("shards", f"bertkit prepare --corpus {corpus} --tokenizer {tok_dir} --out {data_dir} --eval-fraction "
                   f"{EVAL_FRACTION} --seed {seed}"),
        ("pretraining", f"bertkit pretrain --data {data_dir} --out {run_dir} --config {RECIPE} --preset {preset} "
                        f"{overrides} --learning-rate {report['recipe']['learning_rate']:g} "
                        f"--precision {report['precision']} --eval-instances {plan['eval_rows']} "
                        f"--eval-every {plan['eval_every']} --max-time {plan['pretrain_s']:.0f} --seed {seed}"),
        ("curves", f"bertkit plot {run_dir}"),
        ("random initialisation", f"bertkit init --tokenizer {tok_dir} --preset {preset} --seed {seed} "
                                  f"--out {scratch_dir}"),
    ]
    c = ft["config"]

    def point_command(start: Path, name: str, lr: float, more: str = "", sets: str = "train-N-seedS.jsonl") -> str:
        return (f"bertkit finetune classify --model {start} --train {sets_dir}/{sets} --dev "
                f"{sets_dir}/dev.jsonl{' --pair-column pair' if ft['pairs'] else ''} --out "
                f"{out / 'finetune' / name}-N-seedS --epochs 1 --lr {lr:g} --batch-size "
                f"{c['batch_size']} --max-seq-length {c['max_seq_length']} --dropout {c['dropout']} --seed S "
                f"--precision {c['precision']} --new-head{more}")

    frozen = c.get("frozen_max_labels") and any(p.get("frozen") for p in ft["curve"])
    for name, start in (("pretrained", run_dir / "model"), ("scratch", scratch_dir)):
        who = "pretrained" if name == "pretrained" else "random initialisation"
        commands.append((f"one point of the curve ({who}), for N labels and seed S (the label set's file repeats it "
                         f"for the run's passes)" + (f"; N above {c['frozen_max_labels']}" if frozen else ""),
                         point_command(start, name, c["learning_rate"])))
        if frozen:
            commands.append((f"a point of at most {c['frozen_max_labels']} labels ({who}): a logistic regression "
                             f"on the frozen encoder's last layer", point_command(
                                 start, name, c["learning_rate"], f" --frozen --layers={c['frozen_layers']} "
                                 f"--task-model {c['frozen_task_model']} --feature-cache {out / 'finetune' / name}"
                                 f".features")))
    if any(p.get("scratch_finetuned") for p in ft["curve"]):
        commands.append((f"the baseline at a point of at most {c['frozen_max_labels']} labels: random "
                         f"initialisation fine-tuned on the same label set (its file repeats it for the run's passes)",
                         point_command(scratch_dir, "scratch-finetuned", c["learning_rate"],
                                       sets="train-N-seedS-finetuned.jsonl")))
    example = report["fill_mask"]["examples"][0]["prompt"] if report["fill_mask"]["examples"] else "[MASK]"
    commands += [("fill-mask", f"bertkit fill-mask --model {run_dir / 'model'} \"{example}\""),
                 ("serve the fine-tuned classifier", report["serve"]),
                 ("serve fill-mask", f"bertkit serve --model {run_dir / 'model'}")]
    return commands


def print_summary(report: dict[str, Any]) -> None:
    """The report's figures on the terminal; the last line names the page and the serve command."""
    ft, fill = report["finetune"], report["fill_mask"]
    print()
    print(f"machine: {report['machine']['summary']}")
    print(f"pretraining: {report['steps']:,} steps, {report['train_tokens']:,} tokens "
          f"({report['tokens_per_s']:,.0f} tokens/s, {report['precision']}); held-out masked-token accuracy "
          f"{report['mlm_accuracy_before']:.3f} -> {report['mlm_accuracy_after']:.3f}, perplexity "
          f"{report['perplexity_before']:,.0f} -> {report['perplexity_after']:,.1f} "
          f"({report['eval_points']} held-out evaluations)")
    print(f"label-efficiency curve on {ft['task']['description']}")
    print(f"  dev accuracy ({ft['dev_examples']:,} examples), median over seeds [interquartile range]; majority "
          f"class {ft['majority_accuracy']:.3f}")
    print(f"  {'labels':>7} {'seeds':>5}  {'pretrained':<22} {'random initialisation':<22} {'gap':>7}"
          f"  {'random init fine-tuned (seeds)':<30}")
    for p in ft["curve"]:
        pre, scr, tuned = p["pretrained"], p["scratch"], p.get("scratch_finetuned")
        print(f"  {p['labels']:>7,} {p['seeds']:>5}  {pre['median']:.3f} [{pre['q1']:.3f}-{pre['q3']:.3f}]"
              f"{'':<4} {scr['median']:.3f} [{scr['q1']:.3f}-{scr['q3']:.3f}]{'':<4} {p['gap'] + 0.0:+.3f}"
              + (f"  {tuned['median']:.3f} [{tuned['q1']:.3f}-{tuned['q3']:.3f}] ({len(tuned['values'])})"
                 if tuned else "")
              + f"{'  beyond both IQRs' if p['beyond_spread'] else ''}")
    print(f"fill-mask on {fill['prompts']:,} held-out sentences: top-1 {fill['top1_accuracy']:.3f}, top-5 "
          f"{fill['top5_accuracy']:.3f} (always '{fill['baseline_word']}': {fill['baseline_accuracy']:.3f}); by the "
          f"masked word's frequency rank:")
    for b in fill["bands"]:
        if b["prompts"]:
            print(f"  {b['band']:<10} {b['prompts']:>5,} prompts: top-1 {b['top1_accuracy']:.3f}, top-5 "
                  f"{b['top5_accuracy']:.3f} (the band's most frequent word(s): {b['baseline_top1']:.3f}, "
                  f"{b['baseline_top5']:.3f})")
    for example in fill["examples"][:4]:
        candidates = "  ".join(f"{t} ({p:.2f})" for t, p in example["candidates"])
        print(f"  {example['prompt']}\n      true: {example['answer']:<14} model: {candidates}")
    for text, candidates in report["probes"].items():
        print(f"  {text}\n      " + "  ".join(f"{t} ({p:.2f})" for t, p in candidates))
    print(f"took {report['minutes']:.1f} minutes; pretrained model: {report['model']}")
    print(f"report: {report['report']}   serve: {report['serve']}")
