"""End-to-end rows of the GPU suite: `bertkit pretrain` / `bertkit finetune` through the CLI, as a user runs them,
against transformers' `Trainer` on run_mlm.py's / run_glue.py's recipe (bench/gpu/peer_trainer.py), on the same
text, and against bertkit's own model step timed in the same run.

Rows (a GPU: BERT-base, batch 256 x 128, bf16; the quick CPU run: the tiny preset, batch 8 x 32, a few steps):
  e2e_pretrain_bert            --config bert-base (MLM + NSP)
  e2e_pretrain_roberta         --objective roberta (packed rows)
  e2e_pretrain_modernbert      --config modernbert-base at T 1024 (peer: ModernBertForMaskedLM at 30%)
  e2e_pretrain_t5              --config t5-base (span corruption; peer: T5ForConditionalGeneration on the same
                               instances), a Unigram vocabulary with sentinels trained on the same text
  e2e_finetune_sst2            `bertkit finetune glue --task sst2` (BERT-base from random initialisation)

Each record: `bertkit_tokens_per_s` (real tokens per second of training, from the run's metrics.jsonl after its
first log window), `peer_tokens_per_s`, `ratio` (bertkit / peer), `model_step_tokens_per_s` (bertkit's model step
alone, on a batch of the same stream), `ratio_to_step` (end to end / model step: 1.0 means the input pipeline
and the loop cost nothing), MFU. Text: WikiText-2 (validation + test) prepared with BERT's uncased vocabulary;
SST-2's train.tsv. Goals (the issue's): end to end >= 0.9 x the model step and >= 1.6 x the Trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.gpu.context import ROOT, Context, Skip

# BERTKIT_SHARED_DATA, else ../shared/data beside the checkout, else shared/data inside it (a device's copy)
SHARED = Path(os.environ.get("BERTKIT_SHARED_DATA") or next(
    (p for p in (Path(__file__).resolve().parents[k] / "shared" / "data" for k in (3, 2)) if p.is_dir()),
    Path(__file__).resolve().parents[3] / "shared" / "data"))
VOCAB = SHARED / "vocab" / "bert-base-uncased-vocab.txt"


def shape(ctx: Context, long: bool = False) -> dict:
    """Preset, batch, length and steps of a row: BERT-base at 256 x 128 (32 x 1024 for ModernBERT) on a GPU."""
    if ctx.quick:
        return {"preset": "tiny", "batch": 8, "seq_len": 64 if long else 32, "steps": 6, "log_every": 2}
    return {"preset": "base", "batch": 32 if long else 256, "seq_len": 1024 if long else 128, "steps": 60,
            "log_every": 10}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "TOKENIZERS_PARALLELISM": "false"}


def _run(args: list[str], timeout: float) -> str:
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def prepared(ctx: Context) -> Path:
    """WikiText-2 prepared once per run (the quick run: its first 600 lines)."""
    out = ctx.out / "e2e-data"
    if (out / "manifest.json").is_file():
        return out
    raw = SHARED / "wikitext-2"
    if not VOCAB.is_file() or not raw.is_dir():
        raise Skip(f"needs {raw} and {VOCAB} (set BERTKIT_SHARED_DATA)")
    corpus = [str(raw / "wiki.valid.raw"), str(raw / "wiki.test.raw")]
    if ctx.quick:
        small = ctx.out / "e2e-wiki.raw"
        small.write_text("".join((raw / "wiki.valid.raw").read_text(encoding="utf-8").splitlines(True)[:600]),
                         encoding="utf-8")
        corpus = [str(small)]
    _run([sys.executable, "-m", "bertkit.cli", "prepare", "--corpus", *corpus, "--format", "wikitext",
          "--tokenizer", str(VOCAB), "--out", str(out), "--quiet"], 600)
    return out


def run_rate(run_dir: Path, key: str = "tokens") -> float:
    """Tokens (or steps) per second of a run after its first log window (start-up, compilation, warm-up)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if key in r and "elapsed_s" in r]
    if len(timed) < 2:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has {len(timed)} timed lines; more steps are needed")
    first, last = timed[0], timed[-1]
    return (last[key] - first[key]) / max(last["elapsed_s"] - first["elapsed_s"], 1e-9)


def model_step_rate(ctx: Context, data: Path, objective: str, s: dict, model_type: str = "bert") -> tuple[float, float]:
    """bertkit's own pretraining step (forward, backward, fused AdamW) on one batch of the run's stream, bf16 on a
    GPU: (real tokens per second, model FLOPs per step). No input pipeline, no loop."""
    from bench.common import model_flops
    from bertkit.training.pretrain import build_pretraining_model, resolve_config, stream_options
    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream
    from bertkit.data.shards import ShardedCorpus

    corpus = ShardedCorpus(data, "train")
    tok = corpus.manifest.load_tokenizer()
    recipe = f"{model_type}-base"
    config = resolve_config(recipe, {"preset": s["preset"], "objective": objective, "batch_size": s["batch"],
                                     "max_seq_length": s["seq_len"]})
    model, task = build_pretraining_model(config, tok.vocab_size, tokenizer=tok)
    model.to(ctx.device).train()
    special = SpecialIds(cls=tok.cls_id, sep=tok.sep_id, pad=tok.pad_id, mask=tok.mask_id)
    stream = PretrainingStream(corpus, stream_options(config.data, tok), special, tok.vocab_size, s["batch"],
                               prefetch=0)
    batch = next(iter(stream))
    tokens = int(batch["attention_mask"].ne(0).sum())
    batch = {k: v.to(ctx.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k != "_state"}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=ctx.cuda)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with ctx.autocast(ctx.cuda):
            out = task(model, batch)
        sum(v[0] / v[1].clamp(min=1) for k, v in out.items() if k.endswith("_loss")).backward()
        optimizer.step()

    for _ in range(2):
        step()
    ctx.sync()
    n = 3 if ctx.quick else 10
    start = time.perf_counter()
    for _ in range(n):
        step()
    ctx.sync()
    seconds = (time.perf_counter() - start) / n
    lengths = batch["attention_mask"].ne(0).sum(1).tolist()
    flops = model_flops(model.config, lengths, training=True) if model_type == "bert" else float("nan")
    return tokens / seconds, flops / max(tokens, 1)


def prepared_t5(ctx: Context) -> Path:
    """The same text prepared for span corruption: a Unigram vocabulary (32,000, 100 sentinels) trained on it."""
    out = ctx.out / "e2e-data-t5"
    if (out / "manifest.json").is_file():
        return out
    raw = SHARED / "wikitext-2"
    if not raw.is_dir():
        raise Skip(f"needs {raw} (set BERTKIT_SHARED_DATA)")
    corpus = [str(raw / "wiki.valid.raw"), str(raw / "wiki.test.raw")]
    tok = ctx.out / "e2e-t5-tok"
    _run([sys.executable, "-m", "bertkit.cli", "tokenizer", "train", "--kind", "unigram", "--vocab-size", "32000",
          "--extra-ids", "100", "--files", *corpus, "--out", str(tok), "--quiet"], 900)
    _run([sys.executable, "-m", "bertkit.cli", "prepare", "--corpus", *corpus, "--format", "wikitext",
          "--tokenizer", str(tok), "--out", str(out), "--quiet"], 600)
    return out


def pretrain_row(name: str, objective: str, recipe: str, long: bool = False):
    def row(ctx: Context, measured: dict) -> None:
        from bench.gpu.speed import measure_peak

        s = shape(ctx, long)
        model_type = recipe.split("-")[0]  # the recipe's architecture: bert, modernbert, t5
        data = prepared_t5(ctx) if model_type == "t5" else prepared(ctx)  # T5 reads a Unigram vocabulary
        measured.update(bench="e2e_pretrain", model=f"{recipe} ({s['preset']} preset)", objective=objective, batch_size=s["batch"],
                        seq_len=s["seq_len"], steps=s["steps"], dtype="bf16" if ctx.cuda else "fp32")
        run_dir = ctx.out / f"e2e-{name}"
        device = "cuda" if ctx.cuda else "cpu"
        _run([sys.executable, "-m", "bertkit.cli", "pretrain", "--data", str(data), "--out", str(run_dir),
              "--config", recipe, "--preset", s["preset"], "--objective", objective, "--batch-size",
              str(s["batch"]), "--max-seq-length", str(s["seq_len"]), "--max-steps", str(s["steps"]),
              "--log-every", str(s["log_every"]), "--save-every", str(10 ** 6), "--eval-instances", "0",
              "--device", device, "--precision", "bf16" if ctx.cuda else "fp32", "--progress", "false",
              "--warmup-steps", "1"], 900)
        measured["bertkit_tokens_per_s"] = run_rate(run_dir)
        step_rate, flops_per_token = model_step_rate(ctx, data, objective, s, model_type)
        measured["model_step_tokens_per_s"] = step_rate
        measured["ratio_to_step"] = measured["bertkit_tokens_per_s"] / step_rate
        # The quick CPU run executes the peer too (6 tiny steps, no worker: about 10 s of CPU, most of it the
        # Trainer's start), so the dry run proves the script a GPU run depends on.
        task = ["t5"] if model_type == "t5" else ["mlm", "--model", model_type]
        peer = json.loads(_run([sys.executable, str(ROOT / "bench" / "gpu" / "peer_trainer.py"), *task,
                                "--data", str(data), "--preset", s["preset"], "--seq-len", str(s["seq_len"]),
                                "--batch-size", str(s["batch"]), "--steps", str(s["steps"]),
                                "--warmup", str(s["log_every"]), "--workers", "0" if ctx.quick else "4"],
                               900).strip().splitlines()[-1])
        measured["peer"] = peer["peer"]
        measured["peer_tokens_per_s"] = peer["tokens_per_s"]
        measured["ratio"] = measured["bertkit_tokens_per_s"] / peer["tokens_per_s"]
        peak = measure_peak(ctx, torch.bfloat16 if ctx.cuda else torch.float32)
        if flops_per_token == flops_per_token:  # ModernBERT has no FLOP formula here (NaN)
            measured["bertkit_mfu"] = measured["bertkit_tokens_per_s"] * flops_per_token / (peak * 1e9)
            measured["model_step_mfu"] = step_rate * flops_per_token / (peak * 1e9)
        measured["goal_ratio_to_step"], measured["goal_ratio"] = 0.9, 1.6
    return row


def finetune_row(ctx: Context, measured: dict) -> None:
    s = shape(ctx)
    measured.update(bench="e2e_finetune", model=f"bert-base ({s['preset']} preset), SST-2")
    train = SHARED / "glue" / "SST-2" / "train.tsv"
    if not train.is_file():
        raise Skip(f"needs {train}")
    model_dir = ctx.out / "e2e-sst2-init"
    if not (model_dir / "config.json").is_file():
        _run([sys.executable, "-c", "import sys; from bertkit.training.pretrain import init_model_dir; "
              "init_model_dir(sys.argv[1], sys.argv[2], preset=sys.argv[3])", str(model_dir), str(VOCAB),
              s["preset"]], 600)
    batch = 8 if ctx.quick else 32
    examples = batch * s["steps"]
    subset = ctx.out / "e2e-sst2"
    subset.mkdir(parents=True, exist_ok=True)
    lines = train.read_text(encoding="utf-8").splitlines(True)
    (subset / "train.tsv").write_text("".join(lines[:1 + examples]), encoding="utf-8")
    (subset / "dev.tsv").write_text("".join(lines[:1] + lines[1:65]), encoding="utf-8")
    run_dir = ctx.out / "e2e-finetune"
    workers = 1 if ctx.cuda else 0  # finetune's default: batches collated by one worker process on a GPU
    start = time.perf_counter()
    _run([sys.executable, "-m", "bertkit.cli", "finetune", "glue", "--task", "sst2", "--model", str(model_dir),
          "--train", str(subset / "train.tsv"), "--dev", str(subset / "dev.tsv"), "--out", str(run_dir),
          "--batch-size", str(batch), "--epochs", "1", "--max-seq-length", str(s["seq_len"]),
          "--log-every", str(s["log_every"]), "--workers", str(workers), "--device", "cuda" if ctx.cuda else "cpu"],
         900)
    measured["bertkit_wall_s"] = time.perf_counter() - start
    measured["workers"] = workers
    measured["bertkit_examples_per_s"] = run_rate(run_dir, "step") * batch
    results = json.loads((run_dir / "results.json").read_text())
    # The whole run's rate (start-up inside the loop and the end-of-epoch checkpoint included) and the first log
    # window against the later ones: the first steps' one-off costs (kernel loading, allocator growth) show here
    measured["bertkit_examples_per_s_whole_run"] = results["train_examples_per_s"]
    ends = [r["elapsed_s"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]
    windows = [b - a for a, b in zip([0.0] + ends[:-1], ends)]
    measured["first_log_window_s"] = windows[0]
    measured["later_log_window_s"] = sorted(windows[1:])[len(windows[1:]) // 2] if len(windows) > 1 else None
    measured["steps_per_log_window"] = s["log_every"]
    if not ctx.quick:
        peer = json.loads(_run([sys.executable, str(ROOT / "bench" / "gpu" / "peer_trainer.py"), "glue",
                                "--train", str(subset / "train.tsv"), "--vocab", str(VOCAB), "--preset",
                                s["preset"], "--seq-len", str(s["seq_len"]), "--batch-size", str(batch),
                                "--steps", str(s["steps"])], 900).strip().splitlines()[-1])
        measured["peer_examples_per_s"] = peer["examples_per_s"]
        measured["ratio"] = measured["bertkit_examples_per_s"] / peer["examples_per_s"]


def plan(ctx: Context) -> list[tuple[str, object, float]]:
    """(name, row, seconds it needs at least): the e2e rows, run after the step rows."""
    rows = [("e2e_pretrain_bert", pretrain_row("bert", "bert", "bert-base"), 90),
            ("e2e_pretrain_roberta", pretrain_row("roberta", "roberta", "bert-base"), 60),
            ("e2e_pretrain_modernbert_T1024", pretrain_row("modernbert", "roberta", "modernbert-base", True), 90),
            ("e2e_pretrain_t5", pretrain_row("t5", "t5", "t5-base"), 90),
            ("e2e_finetune_sst2", finetune_row, 60)]
    if ctx.quick:  # the CPU dry run stays under a minute: one row runs the CLI, model-step and MFU code
        rows = [(name, row if name == "e2e_pretrain_bert" else _skip("quick run: e2e_pretrain_bert runs the same "
                                                                      "code"), reserve) for name, row, reserve in rows]
    return rows


def _skip(reason: str):
    def row(ctx: Context, measured: dict) -> None:
        raise Skip(reason)
    return row
