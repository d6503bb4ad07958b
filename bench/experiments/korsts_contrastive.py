"""Does contrastive training help a Korean encoder bertkit pretrained itself? KorSTS dev Spearman (cosine of mean
pooled vectors against the gold score) of a tiny BERT pretrained by bertkit on the KorSTS training sentences,
before and after `bertkit finetune embed` on the KorSTS training pairs scoring >= 4 (in-batch negatives).

    python bench/experiments/korsts_contrastive.py --out runs/korsts-contrastive [--pretrain-seconds 240]

Steps: the corpus of `korsts_pipeline_data.py` (training sentences only; dev sentences unseen) -> an 8k WordPiece
vocabulary -> shards -> masked-LM pretraining of the tiny preset for --pretrain-seconds on one thread -> dev
Spearman of the pretrained model (the untuned self) -> `finetune embed` (1 epoch, batch 32, lr 1e-4, length 64)
-> dev Spearman of the tuned model, both computed here by the same function. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = next((p for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data") if p.is_dir()),
            ROOT.parent / "shared" / "data") / "korsts"


def bertkit(*args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "bertkit.cli", *args], check=True, env=env)


def dev_spearman(model_dir: Path) -> float:
    import numpy as np

    from bertkit.features import encode_sentences
    from bertkit.tasks.embed import read_pairs
    from bertkit.tasks.metrics import spearman

    rows = read_pairs(DATA / "sts-dev.tsv")
    a = encode_sentences(model_dir, [r.anchor for r in rows], pooling="mean", max_seq_length=64)
    b = encode_sentences(model_dir, [r.positive for r in rows], pooling="mean", max_seq_length=64)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return float(spearman(cos, [r.score for r in rows]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/korsts-contrastive"))
    parser.add_argument("--pretrain-seconds", type=int, default=240)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = os.getloadavg()
    if not (out / "data" / "corpus.txt").is_file():
        subprocess.run([sys.executable, str(ROOT / "bench" / "experiments" / "korsts_pipeline_data.py"),
                        "--out", str(out / "data")], check=True)
    if not (out / "tok").is_dir():
        bertkit("tokenizer", "train", "--files", str(out / "data" / "corpus.txt"), "--vocab-size", "8000",
                "--out", str(out / "tok"), "--quiet")
    if not (out / "shards").is_dir():
        bertkit("prepare", "--corpus", str(out / "data" / "corpus.txt"), "--tokenizer", str(out / "tok"),
                "--out", str(out / "shards"), "--quiet")
    if not (out / "pretrained" / "model" / "config.json").is_file():
        bertkit("pretrain", "--data", str(out / "shards"), "--out", str(out / "pretrained"), "--config", "mini-fast",
                "--preset", "tiny", "--isolate-documents", "true", "--precision", "fp32",
                "--max-time", str(args.pretrain_seconds), "--progress", "false")
    if not (out / "tuned" / "model" / "config.json").is_file():
        bertkit("finetune", "embed", "--model", str(out / "pretrained" / "model"), "--train",
                str(DATA / "sts-train.tsv"), "--dev", str(DATA / "sts-dev.tsv"), "--min-score", "4", "--epochs", "1",
                "--batch-size", "32", "--lr", "1e-4", "--max-seq-length", "64", "--seed", str(args.seed),
                "--out", str(out / "tuned"), "--quiet")
    result = {"korsts_dev_spearman_untuned": dev_spearman(out / "pretrained" / "model"),
              "korsts_dev_spearman_tuned": dev_spearman(out / "tuned" / "model"),
              "pretrain_seconds": args.pretrain_seconds, "load_before": start, "load_after": os.getloadavg()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
