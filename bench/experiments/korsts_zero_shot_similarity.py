"""KorSTS dev: Spearman correlation of the cosine of two separately pooled sentence vectors with the gold score,
no label used, for a pipeline run's pretrained model and its random-initialisation twin (what a frozen encoder
offers a pair task before any training). Usage: python bench/experiments/korsts_zero_shot_similarity.py
[RUN_DIR [DEV_JSONL]] (defaults: /tmp/korsts4, /tmp/korsts-data/dev.jsonl); first 600 dev pairs."""
import sys

import json, numpy as np, torch
from scipy.stats import spearmanr
from bertkit.features import encode_sentences
torch.set_num_threads(1)
run = sys.argv[1] if len(sys.argv) > 1 else '/tmp/korsts4'
dev = sys.argv[2] if len(sys.argv) > 2 else '/tmp/korsts-data/dev.jsonl'
rows=[json.loads(l) for l in open(dev, encoding='utf-8')][:600]
a=[r['sentence1'] for r in rows]; b=[r['sentence2'] for r in rows]; s=[r['score'] for r in rows]
for name in [f'{run}/run/model', f'{run}/scratch']:
    for pooling in ['mean','max']:
        ea=np.asarray(encode_sentences(name,a,pooling=pooling)); eb=np.asarray(encode_sentences(name,b,pooling=pooling))
        cos=(ea*eb).sum(1)/np.linalg.norm(ea,axis=1)/np.linalg.norm(eb,axis=1)
        print(name.split('/')[-1], pooling, round(spearmanr(cos,s).correlation,4), flush=True)
