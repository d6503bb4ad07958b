"""How well a pretrained masked LM alone tells original from shuffled sentences: the area under the ROC curve of
each sentence's mean masked-token log-likelihood (5 random maskings of 20% of its pieces, seed 0).

    python bench/experiments/word_order_mlm_auc.py OUT/run/model WORD_ORDER_DIR/dev.jsonl
"""
import json, torch, numpy as np, sys
from bertkit.models import model_class
from bertkit.tokenizers import load_tokenizer
torch.set_num_threads(1)
d = sys.argv[1]; task = sys.argv[2]
m = model_class(d, "pretraining").from_pretrained(d).eval(); tok = load_tokenizer(d)
rows = [json.loads(l) for l in open(task)]
mask_id = tok.token_to_id("[MASK]") if hasattr(tok, "token_to_id") else tok._vocab["[MASK]"]
g = torch.Generator().manual_seed(0)
scores = []
with torch.no_grad():
    for i in range(0, len(rows), 64):
        b = tok.encode_batch([r["text"] for r in rows[i:i+64]], max_length=64, padding=True)
        ids = torch.tensor([e.input_ids for e in b]); am = torch.tensor([e.attention_mask for e in b])
        tot = torch.zeros(len(b)); cnt = torch.zeros(len(b))
        for rep in range(5):
            sel = (torch.rand(ids.shape, generator=g) < 0.2) & (am == 1)
            sel[:, 0] = False
            sel &= ids != tok._vocab["[SEP]"]
            inp = ids.masked_fill(sel, mask_id)
            out = m(inp, am, torch.zeros_like(ids))
            lp = out.prediction_logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            tot += (lp * sel).sum(1); cnt += sel.sum(1)
        scores += (tot / cnt.clamp(min=1)).tolist()
y = np.array([r["label"] == "original" for r in rows]); s = np.array(scores)
from itertools import product
pos, neg = s[y], s[~y]
auc = (pos[:, None] > neg[None, :]).mean()
print("AUC of masked-LM log-likelihood, original vs shuffled:", round(float(auc), 3), "mean", pos.mean(), neg.mean())
