"""What a pretrained masked LM alone knows about a corrupted-vs-original task, with no label: the area under the
ROC curve of sentence scores made from pseudo-log-likelihoods (each word piece masked in turn, its log-probability
read), and of a bag of words (logistic regression on word counts, trained on all the training labels), which must
be at chance for a task whose labels are keyed by no word.

    python bench/experiments/mlm_zero_shot_auc.py OUT/run/model TASK_DIR [TASK_DIR ...] [--limit 600]

Scores (higher = more "original"): mean PLL; mean PMI (PLL minus the piece's log unigram frequency in the task's
training sentences, so rare words do not count as errors); min PMI (the least fitting piece: the replaced-word
detector's score). Prints one JSON line per task.
"""
import argparse
import collections
import json
import math
from pathlib import Path

import numpy as np
import torch

from bertkit.models import model_class
from bertkit.tokenizers import load_tokenizer

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("tasks", nargs="+", type=Path)
parser.add_argument("--limit", type=int, default=600, help="dev sentences scored (the first LIMIT)")
args = parser.parse_args()
model = model_class(args.model, "pretraining").from_pretrained(args.model).eval()
tok = load_tokenizer(args.model)
vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else tok._vocab
MASK, CLS, SEP = vocab["[MASK]"], vocab["[CLS]"], vocab["[SEP]"]


def auc(pos, neg):
    pos, neg = np.asarray(pos), np.asarray(neg)
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def bag_auc(train, dev):
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    v = CountVectorizer(lowercase=True, token_pattern=r"\S+")
    x = v.fit_transform([r["text"] for r in train])
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(x, [r["label"] in ("original", "written") for r in train])
    s = clf.decision_function(v.transform([r["text"] for r in dev]))
    y = np.array([r["label"] in ("original", "written") for r in dev])
    return auc(s[y], s[~y]), float(((s > 0) == y).mean())


for task in args.tasks:
    train = [json.loads(l) for l in (task / "train.jsonl").read_text().splitlines()]
    dev = [json.loads(l) for l in (task / "dev.jsonl").read_text().splitlines()][:args.limit]
    counts = collections.Counter(i for r in train for i in tok.encode(r["text"], max_length=64).input_ids)
    total = sum(counts.values())
    logu = {i: math.log((c + 1) / (total + len(vocab))) for i, c in counts.items()}
    scores = {"mean_pll": [], "mean_pmi": [], "min_pmi": []}
    with torch.no_grad():
        for r in dev:
            ids = torch.tensor(tok.encode(r["text"], max_length=64).input_ids)
            pos = [i for i in range(len(ids)) if ids[i] not in (CLS, SEP)]
            batch = ids.repeat(len(pos), 1)
            batch[torch.arange(len(pos)), torch.tensor(pos)] = MASK
            logits = model(batch, torch.ones_like(batch), torch.zeros_like(batch)).prediction_logits
            lp = logits[torch.arange(len(pos)), torch.tensor(pos)].log_softmax(-1)
            pll = lp.gather(-1, ids[pos].unsqueeze(-1)).squeeze(-1).numpy()
            pmi = pll - np.array([logu.get(int(ids[p]), math.log(1 / (total + len(vocab)))) for p in pos])
            scores["mean_pll"].append(pll.mean())
            scores["mean_pmi"].append(pmi.mean())
            scores["min_pmi"].append(pmi.min())
    y = np.array([r["label"] in ("original", "written") for r in dev])
    out = {"task": task.name}
    for k, s in scores.items():
        s = np.array(s)
        out[k] = round(auc(s[y], s[~y]), 3)
    out["bag_of_words_auc"], out["bag_of_words_acc"] = [round(x, 3) for x in bag_auc(train, dev)]
    print(json.dumps(out), flush=True)
