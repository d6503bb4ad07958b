"""How often a main-job claim holds for a given number of seeds: the frozen-encoder points of a `bertkit pipeline`
run refitted on many label sets, then resampled.

For each label count, the job's own recipe (a logistic regression on the frozen encoder's last layer, the job's
`finetune` call with its feature cache) is fitted on label sets 0 .. SETS-1 (`stratified_order`, as the job draws
them) from both starting points the job kept (OUT/run/model and OUT/scratch), and scored on the job's dev file
(OUT/finetune/sets/dev.jsonl). Then DRAWS times, K of the SETS seeds are drawn without replacement (the same seeds
for both starting points, as in the job), and the draw counts as "beyond" when the gap of the medians is larger
than both interquartile ranges (`seed_draw_share`: `curve_verdict`, the job's test, over the draws). Where the job
ran a label count, its seeds' accuracies must come out the same here (checked: the refit is the job's run).

    PYTHONPATH=src python bench/experiments/seed_draws.py OUT --labels 32 64 128 --sets 30 --k 5 7 \
        [--draws 10000] [--work OUT/seed-draws]

Prints one JSON line per label count (the SETS runs' medians and interquartile ranges, and per K the share of
draws beyond both spreads) and writes them, with every run's accuracy, to WORK/seed_draws.json. Finished runs are
reused when the command is repeated.
"""
import argparse
import dataclasses
import json
import shutil
import time
from contextlib import redirect_stdout
from pathlib import Path

import torch

from bertkit.tasks.finetune import FinetuneConfig, finetune
from bertkit.pipeline.curve import FINETUNE, FROZEN, quartiles, seed_draw_share, stratified_order, write_label_set
from bertkit.tasks.classify import ClassificationFamily

torch.set_num_threads(1)  # a shared 2-core machine: one thread per process

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("out", type=Path, help="a `bertkit pipeline` output directory (report.json, run/, scratch/)")
parser.add_argument("--labels", type=int, nargs="+", default=[32, 64, 128])
parser.add_argument("--sets", type=int, default=30, help="label sets (seeds 0 .. SETS-1) per label count")
parser.add_argument("--k", type=int, nargs="+", default=[5, 7], help="seeds per draw")
parser.add_argument("--draws", type=int, default=10_000)
parser.add_argument("--work", type=Path, help="default OUT/seed-draws")
parser.add_argument("--text-column", default="text")
parser.add_argument("--pair-column")
parser.add_argument("--label-column", default="label")
args = parser.parse_args()

report = json.loads((args.out / "report.json").read_text(encoding="utf-8"))
ft = report["finetune"]
config = ft["config"]
work = args.work or args.out / "seed-draws"
work.mkdir(parents=True, exist_ok=True)
task = ClassificationFamily(FinetuneConfig(kind="classify", text_column=args.text_column,
                                           pair_column=args.pair_column, label_column=args.label_column))
train = task.read(ft["task"]["train"], training=True)
labels = [str(e.label) for e in train]
dev_file = args.out / "finetune" / "sets" / "dev.jsonl"
# The job's frozen-encoder recipe (run_pipeline: its fine-tuning config with FROZEN), seed and cache set per run.
recipe = dataclasses.replace(
    FinetuneConfig(kind="classify", max_seq_length=config["max_seq_length"], epochs=1.0, precision=config["precision"],
                   device="cpu", progress=False, text_column="text", pair_column="pair" if ft["pairs"] else None,
                   label_column="label", **FINETUNE), **FROZEN)
starts = {"pretrained": args.out / "run" / "model", "scratch": args.out / "scratch"}
for name in starts:  # the job's layer caches, copied: the job's files stay as they were
    cache = args.out / "finetune" / f"{name}.features"
    if cache.exists() and not (work / cache.name).exists():
        shutil.copytree(cache, work / cache.name) if cache.is_dir() else shutil.copy(cache, work / cache.name)
job = {p["labels"]: p for p in ft["curve"] if p.get("frozen")}
orders = {}
results = {}
started = time.perf_counter()
for n in args.labels:
    accuracy = {name: [] for name in starts}
    for seed in range(args.sets):
        if seed not in orders:
            orders[seed] = stratified_order(labels, seed)
        train_file = write_label_set(train, orders[seed][:n], 1, work / "sets" / f"train-{n}-seed{seed}.jsonl")
        for name, start in starts.items():
            run = work / f"{name}-{n}-seed{seed}"
            if not (run / "results.json").is_file():
                shutil.rmtree(run, ignore_errors=True)
                run.mkdir(parents=True)
                run_config = dataclasses.replace(recipe, seed=seed, feature_cache=str(work / f"{name}.features"))
                with open(run / "log.txt", "w", encoding="utf-8") as log, redirect_stdout(log):
                    finetune("classify", start, train_file, dev_file, run, run_config, new_heads=True)
                shutil.rmtree(run / "model", ignore_errors=True)
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
            got = json.loads((run / "results.json").read_text(encoding="utf-8"))["epochs"][-1]["accuracy"]
            accuracy[name].append(got)
    if n in job:  # the job's own seeds, refitted: the same accuracies
        for name in starts:
            ran = job[n][name]["values"]
            if accuracy[name][:len(ran)] != ran:
                raise SystemExit(f"{n} labels, {name}: the refit gives {accuracy[name][:len(ran)]}, the job "
                                 f"{ran}: not the job's recipe")
    shares = {k: seed_draw_share(accuracy["pretrained"], accuracy["scratch"], k, args.draws) for k in args.k}
    row = {"labels": n, "sets": args.sets, "draws": args.draws,
           **{name: {k: round(v, 4) for k, v in quartiles(accuracy[name]).items() if k != "values"}
              for name in starts},
           "beyond_share": shares, "job_seeds_checked": len(job[n]["pretrained"]["values"]) if n in job else 0}
    print(json.dumps(row), flush=True)
    results[n] = {**row, "accuracy": accuracy}
summary = {"out": str(args.out), "steps": report.get("steps"), "mlm_accuracy_after": report.get("mlm_accuracy_after"),
           "seconds": round(time.perf_counter() - started, 1), "points": list(results.values())}
(work / "seed_draws.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
