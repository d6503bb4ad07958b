"""The main job's plan (stage 4): the machine (CPU model and flags, GPU), the precision, a few timed pretraining
steps, the cost of a fine-tuning epoch, and from them the split of the budget between pretraining and the
label-efficiency curve (`plan_budget`)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bertkit.data.instances import SpecialIds
from bertkit.data.loader import PretrainingStream, fixed_batches
from bertkit.data.shards import ShardedCorpus
from bertkit.pipeline.curve import passes_for
from bertkit.tasks.classify import ClassificationFamily
from bertkit.tokenizers import load_tokenizer
from bertkit.training.pretrain import build_pretraining_model, random_token_ids, stream_options
from bertkit.training.trainer import make_optimizer, setup_distributed, use_bf16


EVAL_POINTS = 30  # held-out evaluations aimed at: still more than 10 when a shared machine runs 2.5 times slower
EVAL_INSTANCES = 500  # held-out rows per evaluation (about 6,500 masked tokens)
FINETUNE_SHARE = 0.45  # at most this share of the time left after the set-up goes to the curve
FINETUNE_OVERHEAD_S = 3.0  # a fine-tuning run's loading, features and model saving (2-3 s measured, tiny model)
# A regression run's loading (the task files read and tokenised, the encoder, its cache file), fit, dev scoring from
# the cache and saving, beside the dev set's pieces once more (`eval_s`): 2-3 s a run measured at 64-512 labels
# (tiny model, 2,870 dev rows, full speed); planned at 1.5 s alone, the curve took twice its estimate.
FROZEN_OVERHEAD_S = 1.5


BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def _cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none, as on macOS or Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_flags(wanted: tuple[str, ...], cpuinfo: str | None) -> list[str]:
    """Those of `wanted` in the first `flags` (or `Features`) line of `cpuinfo` (default: read /proc/cpuinfo)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [flag for flag in wanted if flag in present]
    return []


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The native-bf16 instruction flags (AMX-BF16, AVX512-BF16) in /proc/cpuinfo's first `flags` line.

    cpuinfo: the file's text (default: read it; [] where there is none, as on macOS or Windows)."""
    return _cpu_flags(BF16_FLAGS, cpuinfo)


def choose_precision(device_type: str, cpuinfo: str | None = None) -> tuple[str, str]:
    """(precision, why): bf16 autocast on a CPU with native bf16 instructions, fp32 on any other CPU; on a GPU
    "auto" (the trainer's bf16 where the GPU supports it)."""
    if device_type == "cuda":
        return "auto", "a CUDA GPU: bf16 autocast where it supports bf16, else fp32"
    flags = cpu_bf16_flags(cpuinfo)
    if flags:
        return "bf16", f"the CPU has native bf16 instructions ({', '.join(flags)}), so bf16 autocast"
    return "fp32", ("the CPU has no native bf16 instructions (no amx_bf16 or avx512_bf16 among its flags): bf16 "
                    "would be emulated there, slower than fp32")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return ""


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # the flags that matter for speed here


def describe_machine(device=None, cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine a run's figures come from: {"cpu", "cores", "threads", "flags" (those of `CPU_FLAGS` it has),
    "gpu" (name, or None), "device", "summary" (one line)}."""
    flags = _cpu_flags(CPU_FLAGS, cpuinfo)
    cpu = cpu_name() or "an unnamed CPU"
    gpu = torch.cuda.get_device_name(device) if device is not None and getattr(device, "type", "") == "cuda" else None
    threads = torch.get_num_threads()
    named = " ".join(flags) or "none of " + "/".join(CPU_FLAGS)
    summary = f"{cpu}, {os.cpu_count()} cores ({threads} threads), flags {named}" + (f"; GPU {gpu}" if gpu else
                                                                                  "; no GPU")
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "flags": flags, "gpu": gpu,
            "device": str(device) if device is not None else "cpu", "summary": summary}


def measure_pretraining_step(data_dir: Path, config, steps: int = 5, warmup: int = 4) -> dict[str, float]:
    """Seconds per optimizer step and per held-out evaluation of the recipe: the median of `steps` timed steps,
    after `warmup` untimed ones, of a throw-away model on the prepared data's first batches.

    The warm-up matters: the first steps pay for kernel selection at each new shape (the number of masked tokens
    varies by batch). The median keeps a step slowed by another process out. Returns {"step_s",
    "tokens_per_step", "tokens_per_s", "eval_row_s"}: a held-out row is evaluated forward only, taken as a third
    of a training step's time per row.
    """
    _, device = setup_distributed(config.train.device)
    corpus = ShardedCorpus(data_dir, "train")
    tokenizer = corpus.manifest.load_tokenizer()
    d = config.data
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    stream = PretrainingStream(corpus, stream_options(d), special, tokenizer.vocab_size, d.batch_size,
                               seed=config.train.seed, random_ids=random_token_ids(tokenizer), prefetch=0)
    batches = fixed_batches(stream, d.batch_size * (steps + warmup), d.batch_size)
    model, objective = build_pretraining_model(config, tokenizer.vocab_size, tokenizer=tokenizer)
    model.to(device).train()
    optimizer = make_optimizer(model, config.train)
    bf16 = use_bf16(config.train.precision, device)
    times, tokens = [], []
    for i, batch in enumerate(batches):
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = objective(model, batch)
        loss = sum(out[k][0].float() / max(float(out[k][1]), 1.0) for k in out if k.endswith("_loss"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= min(warmup, len(batches) - 1):
            times.append(time.perf_counter() - started)
            tokens.append(float(batch["attention_mask"].ne(0).sum()))
    if not times:
        raise RuntimeError(f"{data_dir}: too little training data for one batch of {d.batch_size}")
    step_s = statistics.median(times)
    per_step = sum(tokens) / len(tokens)
    return {"step_s": step_s, "tokens_per_step": per_step, "tokens_per_s": per_step / step_s,
            "eval_row_s": step_s / 3 / d.batch_size}


def finetune_cost(task_train, task_dev, config, tokenizer_dir: Path, tokens_per_s: float) -> dict[str, float]:
    """Estimated seconds of one fine-tuning epoch and one dev evaluation of the task, from its pieces (read and
    tokenised as fine-tuning will) and the measured pretraining speed in tokens per second.

    A training epoch costs about 1.5 times a pretraining step's time per piece (padding, dropout and the cost of
    short sequences beyond their pieces; measured 1.2 on the built-in task and rounded up); an evaluation runs
    forward only, a third of that per piece. Timing a few real fine-tuning steps instead was tried and misleads: their
    first steps pay once for kernel selection at each new sequence length, which can take tens of seconds.
    """
    tokenizer = load_tokenizer(tokenizer_dir)
    family = ClassificationFamily(config)
    pieces = {}
    for split, path in (("train", task_train), ("dev", task_dev)):
        examples = family.read(path, training=split == "train")
        pieces[split] = sum(len(f["input_ids"]) for f in family.features(examples, tokenizer,
                                                                          training=split == "train"))
    return {"train_pieces": pieces["train"], "dev_pieces": pieces["dev"],
            "epoch_s": 1.5 * pieces["train"] / tokens_per_s, "eval_s": 1.5 * pieces["dev"] / tokens_per_s / 3}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the pipeline spends its budget (seconds are estimates made before pretraining)."""

    pretrain_s: float  # pretraining's max_time (its evaluations included)
    eval_every: int  # steps between held-out evaluations
    eval_rows: int  # held-out rows per evaluation
    expected_steps: int  # pretraining steps the measured speed promises
    ladder: tuple[int, ...]  # label counts of the curve, smallest first (then the baseline's, `starts` 1)
    seeds: tuple[int, ...]  # seeds per label count (each run for both starting points)
    passes: tuple[int, ...]  # passes over the label set per run
    run_s: tuple[float, ...]  # one fine-tuning run per label count, its dev evaluation and overhead included
    finetune_s: float  # every run of the curve
    short: bool = False  # the budget is smaller than the minimum: pretraining gets its minimum anyway
    starts: tuple[int, ...] = ()  # runs per seed at each entry of the ladder: 2 (both starting points) or 1


def plan_budget(remaining_s: float, step_s: float, eval_row_s: float, ladder: list[int],
                example_s: float | list[float], fixed_s: float | list[float], seeds: list[int],
                passes: list[int] | None = None, starts: list[int] | None = None, ft_share: float = FINETUNE_SHARE,
                eval_points: int = EVAL_POINTS, eval_rows: int = EVAL_INSTANCES, eval_share: float = 0.12,
                min_eval_rows: int = 64, min_pretrain_s: float = 30.0, pretrain_s: float | None = None,
                min_first_seeds: int = 3) -> Plan:
    """Split `remaining_s` seconds between pretraining and the label-efficiency curve; size the evaluations.

    The curve runs `seeds[i]` seeds at label count `ladder[i]`, each seed `starts[i]` times (default 2: once per
    starting point; 1: one starting point alone, the baseline entries after the curve's); a run costs
    ladder[i] x passes[i] x `example_s` (training; one figure, or one per label count) + `fixed_s` (its dev
    evaluation, loading and saving; one figure, or one per label count). passes:
    default `passes_for` each label count. The curve gets at most `ft_share` of the time: while it does not fit,
    an entry loses a seed, in this order: the baseline's entries but the smallest label count's (down to none), the
    curve's but the smallest count's (down to one), the curve's smallest count (down to `min_first_seeds`, since
    its spread is the curve's point), the baseline's smallest count (down to one), then any (down to one); inside
    each, the largest label count first. At one seed everywhere, every run's passes shrink by the factor that
    makes it fit (at least one pass): a slow machine keeps its pretraining, which the curve is about. Pretraining
    gets the rest, and never less than 1 - ft_share of the time (nor `min_pretrain_s`). Its `eval_points` evaluations of up to `eval_rows` held-out rows
    (`eval_row_s` seconds each, at least `min_eval_rows` rows) take at most `eval_share` of its time, and come
    every expected_steps / eval_points steps, where expected_steps is what is left of the pretraining time after
    them divided by step_s.

    pretrain_s: a fixed pretraining time instead (tests and quick looks): every seed and pass runs.
    """
    passes = list(passes or [passes_for(n) for n in ladder])
    example_s = list(example_s) if isinstance(example_s, (list, tuple)) else [example_s] * len(ladder)
    fixed_s = list(fixed_s) if isinstance(fixed_s, (list, tuple)) else [fixed_s] * len(ladder)
    starts = list(starts or [2] * len(ladder))
    if min(step_s, eval_row_s, *example_s) <= 0 or min(fixed_s) < 0 or min(seeds) < 1 \
            or not set(starts) <= {1, 2} \
            or not len(ladder) == len(seeds) == len(passes) == len(example_s) == len(fixed_s) == len(starts):
        raise ValueError("step, row and example times must be positive, the fixed time not negative, seeds at "
                         "least 1, starts 1 or 2, one seed count, pass count and start count per label count")
    seeds = list(seeds)

    def run_s() -> list[float]:
        return [n * p * e + f for n, p, e, f in zip(ladder, passes, example_s, fixed_s)]

    def total() -> float:
        return sum(k * m * r for k, m, r in zip(seeds, starts, run_s()))

    if pretrain_s is None:
        room = ft_share * remaining_s
        # Who loses a seed, in stages: the baseline's entries but the first (to none: the time left at the end may
        # still run them), the curve's but the first (to one), the curve's first (to `min_first_seeds`), the
        # baseline's first (to one), then any (to one); inside a stage the largest label count first.
        single = [i for i in range(len(seeds)) if starts[i] == 1]
        curve = [i for i in range(len(seeds)) if starts[i] == 2]
        stages = [(single[:0:-1], 0), (curve[:0:-1], 1), (curve[:1], min_first_seeds), (single[:1], 1),
                  (list(range(len(seeds))), 1)]
        while total() > room:
            over = next(([i for i in entries if seeds[i] > floor] for entries, floor in stages
                         if any(seeds[i] > floor for i in entries)), [])
            if not over:
                break
            seeds[over[0]] -= 1
        if total() > room:
            fixed = sum(k * m * f for k, m, f in zip(seeds, starts, fixed_s))
            factor = max(0.0, room - fixed) / (total() - fixed)
            passes = [max(1, math.floor(p * factor)) for p in passes]
    short = False
    if pretrain_s is None:
        # The curve's share is a cap: pretraining keeps the rest even when the curve's floor (one seed, one pass)
        # does not fit; its runs are then skipped at the deadline, as their measured times say.
        pretrain_s = max(remaining_s - total(), (1 - ft_share) * remaining_s)
        short = pretrain_s < min_pretrain_s
        pretrain_s = max(pretrain_s, min_pretrain_s)
    rows = max(min_eval_rows, min(eval_rows, int(eval_share * pretrain_s / eval_points / eval_row_s)))
    expected = max(1, int((pretrain_s - eval_points * rows * eval_row_s) / step_s))
    return Plan(pretrain_s=pretrain_s, eval_every=max(1, expected // eval_points), eval_rows=rows,
                expected_steps=expected, ladder=tuple(ladder), seeds=tuple(seeds), passes=tuple(passes),
                run_s=tuple(run_s()), finetune_s=total(), short=short, starts=tuple(starts))
