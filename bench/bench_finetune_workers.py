"""Benchmark: `bertkit finetune glue --task sst2` end to end through the CLI with its batches collated in the
training process (--workers 0) and by 1 or 2 worker processes, interleaved round by round.

bertkit against bertkit: the question is what moving collation out of the training process buys on this machine,
so there is no peer here (bench/gpu's `e2e_finetune_sst2` row holds the transformers `Trainer` comparison). Each
run fine-tunes a randomly initialised model of a bertkit size preset (default `tiny`) with Google's uncased
vocabulary for one epoch on the first --examples (1,000) sentences of SST-2's train.tsv, batch 32, the default
recipe otherwise (length bucketing, dropout 0.1, fp32 on the CPU, bf16 auto on a GPU), dev: the first 64 dev
sentences. The runs of a round go 0, 1, 2 workers; rounds repeat that order.

Per run: `examples_per_s` (results.json's train_examples_per_s: training examples over the training time, the
loop's start-up and its end-of-epoch checkpoint included, evaluation excluded), `steady_examples_per_s` (steps
after the first log line, from metrics.jsonl), `first_steps_s` (the first 3 steps' durations). One JSON line per
worker count (medians over rounds, with `ratio_to_0_workers`), plus the load average before and after.

    python bench/bench_finetune_workers.py [--preset tiny] [--examples 1000] [--workers 0 1 2] [--rounds 2]
                                           [--device cpu] [--data DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def one_run(args, root: Path, workers: int, round_: int) -> dict:
    out = root / f"run-w{workers}-r{round_}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "bertkit.cli", "finetune", "glue", "--task", "sst2", "--model",
               str(root / "model"), "--train", str(root / "train.tsv"), "--dev", str(root / "dev.tsv"), "--out",
               str(out), "--epochs", "1", "--batch-size", str(args.batch_size), "--log-every", "1", "--quiet",
               "--device", args.device, "--workers", str(workers)]
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    results = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "loss" in r]
    ends = [r["elapsed_s"] for r in timed]
    durations = [b - a for a, b in zip([0.0] + ends[:-1], ends)]  # a fresh run's clock starts at 0
    steady = (timed[-1]["step"] - timed[0]["step"]) / max(ends[-1] - ends[0], 1e-9) * args.batch_size
    return {"examples_per_s": results["train_examples_per_s"], "steady_examples_per_s": steady,
            "first_steps_s": [round(d, 3) for d in durations[:3]]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--quick", action="store_true", help="128 examples, one round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.rounds = 128, 1
    sst2, vocab = args.data / "glue" / "SST-2", args.data / "vocab" / "bert-base-uncased-vocab.txt"
    if not (sst2 / "train.tsv").is_file() or not vocab.is_file():
        sys.exit(f"bench_finetune_workers.py: needs {sst2}/train.tsv and {vocab} (--data)")
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.training.pretrain import init_model_dir

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        init_model_dir(root / "model", vocab, preset=args.preset)
        train = (sst2 / "train.tsv").read_text(encoding="utf-8").splitlines(True)
        dev = (sst2 / "dev.tsv").read_text(encoding="utf-8").splitlines(True)
        (root / "train.tsv").write_text("".join(train[:1 + args.examples]), encoding="utf-8")
        (root / "dev.tsv").write_text("".join(dev[:65]), encoding="utf-8")
        runs: dict[int, list[dict]] = {w: [] for w in args.workers}
        for r in range(args.rounds):
            for w in args.workers:
                runs[w].append(one_run(args, root, w, r))
                print(f"round {r + 1}, {w} workers: {runs[w][-1]}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    base = statistics.median(x["examples_per_s"] for x in runs[args.workers[0]])
    for w in args.workers:
        rate = statistics.median(x["examples_per_s"] for x in runs[w])
        print(json.dumps({
            "bench": "finetune_workers", "preset": args.preset, "examples": args.examples,
            "batch_size": args.batch_size, "device": args.device, "workers": w, "examples_per_s": rate,
            "steady_examples_per_s": statistics.median(x["steady_examples_per_s"] for x in runs[w]),
            "first_steps_s": runs[w][0]["first_steps_s"], "ratio_to_0_workers": rate / base,
            "rounds": args.rounds, "cpu": cpu_name(), "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after]}),
            flush=True)


if __name__ == "__main__":
    main()
