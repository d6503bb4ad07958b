"""What a classifier can read from few labels in a model's [CLS] vector, its pooler and the mean of its tokens.

    python bench/experiments/cls_vs_mean_probe.py PRETRAINED_MODEL SCRATCH_MODEL TASK_DIR

TASK_DIR holds train.jsonl and dev.jsonl ({"text", "label"}), as `bertkit pipeline` writes for its built-in task
(OUT/task). For each model and each kind of features: nearest-centroid accuracy on dev from the first 32 and 128
examples of `stratified_order` (4 and 16 per class on the built-in task; median over seeds 0-4; features
standardised with the training set's mean and deviation), and the spread of the dev vectors around their mean
over the norm of that mean.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

from bertkit.features import load_encoder
from bertkit.pipeline.curve import stratified_order
from bertkit.tokenizers import load_tokenizer

torch.set_num_threads(1)
task = Path(sys.argv[3])
train = [json.loads(l) for l in (task / "train.jsonl").read_text().splitlines()]
dev = [json.loads(l) for l in (task / "dev.jsonl").read_text().splitlines()]
labels = sorted({r["label"] for r in train})
def feats(model_dir, rows):
    tok = load_tokenizer(model_dir); enc = load_encoder(model_dir).eval()
    out = {"cls": [], "pooler": [], "mean": []}
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            b = tok.encode_batch([r["text"] for r in rows[i:i+64]], max_length=64, padding=True)
            ids = torch.tensor([e.input_ids for e in b]); am = torch.tensor([e.attention_mask for e in b])
            o = enc(ids, am, torch.zeros_like(ids))
            h = o.last_hidden_state
            out["cls"].append(h[:, 0]); out["pooler"].append(o.pooler_output if o.pooler_output is not None else h[:, 0])
            m = am.unsqueeze(-1).float(); out["mean"].append((h * m).sum(1) / m.sum(1))
    return {k: torch.cat(v).numpy() for k, v in out.items()}
for name, d in (("pretrained", sys.argv[1]), ("scratch", sys.argv[2])):
    ft, fd = feats(d, train), feats(d, dev)
    y = np.array([labels.index(r["label"]) for r in train]); yd = np.array([labels.index(r["label"]) for r in dev])
    for kind in ("cls", "pooler", "mean"):
        X, Xd = ft[kind], fd[kind]
        mu, sd = X.mean(0), X.std(0) + 1e-6
        accs = []
        for n in (32, 128):
          for seed in range(5):
            idx = stratified_order([r["label"] for r in train], seed)[:n]
            Z = (X[idx] - mu) / sd; Zd = (Xd - mu) / sd
            C = np.stack([Z[y[idx] == c].mean(0) for c in range(len(labels))])
            Zn = Zd / np.linalg.norm(Zd, axis=1, keepdims=True); Cn = C / np.linalg.norm(C, axis=1, keepdims=True)
            accs.append((n, float(((Zn @ Cn.T).argmax(1) == yd).mean())))
        spread = float(np.linalg.norm(Xd - Xd.mean(0), axis=1).mean() / (np.linalg.norm(Xd.mean(0)) + 1e-9))
        print(name, kind, "32:", round(np.median([a for n, a in accs if n == 32]), 3), "128:", round(np.median([a for n, a in accs if n == 128]), 3), "spread/mean-norm", round(spread, 3), flush=True)
