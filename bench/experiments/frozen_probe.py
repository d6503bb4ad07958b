"""A cheap screen before fine-tuning: how much of a task a few labels can read off the frozen encoder, pretrained
against random initialisation. Mean-pooled features of the last layer (and of every layer, concatenated) for the
task's training and dev sentences; a logistic regression on the same stratified label sets as the curve
(`stratified_order`, seeds 0..SEEDS-1); dev accuracy median and interquartile range per model and label count.
Also the zero-shot AUC of each sentence's mean log-probability of its own pieces at the masked-LM head without
any masking (what the 10% random replacements of BERT's masking teach: whether a piece fits where it stands).

    python bench/experiments/frozen_probe.py OUT/run/model OUT/scratch TASK_DIR [TASK_DIR ...] --labels 32 128
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bertkit.models import model_class
from bertkit.pipeline.curve import stratified_order
from bertkit.tokenizers import load_tokenizer

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("pretrained")
parser.add_argument("scratch")
parser.add_argument("tasks", nargs="+", type=Path)
parser.add_argument("--labels", type=int, nargs="+", default=[32, 128])
parser.add_argument("--seeds", type=int, default=20)
args = parser.parse_args()


def features(d, texts):
    m = model_class(d, "pretraining").from_pretrained(d).eval()
    tok = load_tokenizer(d)
    last, every, self_lp = [], [], []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            b = tok.encode_batch(texts[i:i + 64], max_length=64, padding=True)
            ids = torch.tensor([e.input_ids for e in b])
            am = torch.tensor([e.attention_mask for e in b])
            out = m.bert(ids, am, torch.zeros_like(ids), output_hidden_states=True) if hasattr(m, "bert") else None
            hs = out.hidden_states
            k = am.unsqueeze(-1).float()
            means = [(h * k).sum(1) / k.sum(1) for h in hs]
            last.append(means[-1])
            every.append(torch.cat(means, -1))
            logits = m(ids, am, torch.zeros_like(ids)).prediction_logits
            lp = logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            real = am.bool().clone()
            real[:, 0] = False
            real &= ids != tok.sep_id
            self_lp.append((lp * real).sum(1) / real.sum(1))
    return torch.cat(last).numpy(), torch.cat(every).numpy(), torch.cat(self_lp).numpy()


def probe(xtr, ytr, xdv, ydv, labels_list):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    res = {}
    for n in args.labels:
        accs = []
        for seed in range(args.seeds):
            idx = stratified_order(labels_list, seed)[:n]
            sc = StandardScaler().fit(xtr[idx])
            clf = LogisticRegression(max_iter=2000, C=0.1).fit(sc.transform(xtr[idx]), ytr[idx])
            accs.append(float((clf.predict(sc.transform(xdv)) == ydv).mean()))
        q = np.percentile(accs, [25, 50, 75])
        res[n] = [round(float(q[1]), 3), round(float(q[0]), 3), round(float(q[2]), 3)]
    return res


for task in args.tasks:
    train = [json.loads(l) for l in (task / "train.jsonl").read_text().splitlines()]
    dev = [json.loads(l) for l in (task / "dev.jsonl").read_text().splitlines()]
    labels_list = [r["label"] for r in train]
    ytr = np.array([r["label"] in ("original", "written") for r in train])
    ydv = np.array([r["label"] in ("original", "written") for r in dev])
    row = {"task": task.name}
    for name, d in (("pre", args.pretrained), ("scr", args.scratch)):
        ltr, etr, _ = features(d, [r["text"] for r in train])
        ldv, edv, sdv = features(d, [r["text"] for r in dev])
        pos, neg = sdv[ydv], sdv[~ydv]
        row[f"{name}_selfprob_auc"] = round(float((pos[:, None] > neg[None, :]).mean()), 3)
        row[f"{name}_last"] = probe(ltr, ytr, ldv, ydv, labels_list)
        row[f"{name}_all_layers"] = probe(etr, ytr, edv, ydv, labels_list)
    print(json.dumps(row), flush=True)
