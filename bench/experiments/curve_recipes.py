"""The label-efficiency curve's fine-tuning runs alone, on a pretrained model kept from a `bertkit pipeline` run:
try tasks and fine-tuning recipes in minutes instead of a whole pipeline run each.

    python bench/experiments/curve_recipes.py OUT/run/model OUT/scratch TASK_DIR --labels 32 128 --seeds 5 \
        --lr 3e-4 --min-examples 2000 [--seed-start 10] [--frozen [--layers=-1]] [--pair]

The pipeline's recipe at 32 labels (a linear head on the frozen encoder's last layer):
--lr 3e-3 --frozen --layers=-1 --min-examples 2000; above: --lr 3e-4 --min-examples 1000.

TASK_DIR holds train.jsonl and dev.jsonl ({"text", "pair"?, "label"}). Both starting points get the same label sets
(`stratified_order`), passes (`passes_for`), recipe and seeds, as in the pipeline. Prints one JSON line per label
count: the medians and interquartile ranges of dev accuracy, the gap and whether it is beyond both spreads.
"""
import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import torch

from bertkit.tasks.finetune import FinetuneConfig, finetune
from bertkit.pipeline.curve import curve_verdict, passes_for, quartiles, stratified_order, write_label_set
from bertkit.tasks.classify import ClassificationFamily

# One thread: on a shared 2-core machine two threads that wait for each other ran a fine-tuning run 10x slower.
torch.set_num_threads(1)

parser = argparse.ArgumentParser()
parser.add_argument("pretrained")
parser.add_argument("scratch")
parser.add_argument("task", type=Path)
parser.add_argument("--labels", type=int, nargs="+", default=[32])
parser.add_argument("--seeds", type=int, default=5)
parser.add_argument("--seed-start", type=int, default=0, help="first seed (seeds SEED_START .. SEED_START+SEEDS-1)")
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--min-examples", type=int, default=2000)
parser.add_argument("--min-passes", type=int, default=3)
parser.add_argument("--warmup", type=float, default=0.1)
parser.add_argument("--length", type=int, default=64)
parser.add_argument("--frozen", action="store_true")
parser.add_argument("--layers", default="all", help="frozen: the layers the linear head reads (all, or -1 = the last)")
parser.add_argument("--pair", action="store_true")
args = parser.parse_args()

base = FinetuneConfig(kind="classify", max_seq_length=args.length, epochs=1.0, learning_rate=args.lr,
                      batch_size=args.batch_size, dropout=0.1, warmup_ratio=args.warmup, precision="fp32",
                      device="cpu", progress=False, pair_column="pair" if args.pair else None, frozen=args.frozen,
                      **({"layers": args.layers} if args.frozen else {}))
family = ClassificationFamily(base)
train = family.read(args.task / "train.jsonl", training=True)
dev = family.read(args.task / "dev.jsonl", training=False)
labels = [str(e.label) for e in train]
work = Path(tempfile.mkdtemp(prefix="curve-"))
dev_file = write_label_set(dev, list(range(len(dev))), 1, work / "dev.jsonl")
for n in args.labels:
    passes = passes_for(n, args.min_examples, args.min_passes)
    got = {"pretrained": [], "scratch": []}
    began = time.perf_counter()
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        train_file = write_label_set(train, stratified_order(labels, seed)[:n], passes, work / f"train-{n}-{seed}.jsonl")
        for name, start in (("pretrained", args.pretrained), ("scratch", args.scratch)):
            ft = work / f"{name}-{n}-{seed}"
            with open(work / "log.txt", "a") as log, redirect_stdout(log):
                r = finetune("classify", start, train_file, dev_file, ft, dataclasses.replace(base, seed=seed),
                             new_heads=True)
            got[name].append(r["epochs"][-1]["accuracy"])
            shutil.rmtree(ft, ignore_errors=True)
    point = {"labels": n, "passes": passes, "pretrained": quartiles(got["pretrained"]),
             "scratch": quartiles(got["scratch"])}
    v = curve_verdict(point)
    print(json.dumps({"task": str(args.task), "labels": n,
                      "seeds": [args.seed_start, args.seed_start + args.seeds - 1], "passes": passes, "lr": args.lr,
                      "frozen": args.frozen and args.layers,
                      "pre": [round(point["pretrained"][k], 3) for k in ("median", "q1", "q3")],
                      "scr": [round(point["scratch"][k], 3) for k in ("median", "q1", "q3")],
                      "gap": round(v["gap"], 3), "beyond": v["beyond_spread"], "wins": v["wins"],
                      "pre_all": [round(x, 3) for x in got["pretrained"]],
                      "scr_all": [round(x, 3) for x in got["scratch"]], "s": round(time.perf_counter() - began)}),
          flush=True)
shutil.rmtree(work, ignore_errors=True)
