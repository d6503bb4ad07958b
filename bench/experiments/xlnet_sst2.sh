#!/usr/bin/env bash
# XLNet against BERT for the same pretraining budget: xlnet-mini (permutation LM) and the mini BERT (MLM + NSP, the
# same L4 H256 shape) each pretrained on WikiText-2 for STEPS steps of 16 sequences x 128 token slots, then both
# fine-tuned on the SST-2 8,000-example subset, seeds 1-3 (1 epoch, batch 32, inputs of 64 tokens, lr 1e-4).
#
#   bash bench/experiments/xlnet_sst2.sh        # DATA=../shared/data OUT=runs/xlnet_sst2 STEPS=100
#
# Text: WikiText-2's wiki.test.raw for pretraining (wiki.valid.raw held out), each model with its own 8k vocabulary
# trained on it: an XLNet-layout Unigram (`--kind unigram --xlnet`) and a WordPiece. The budget is fixed in steps
# (equal token slots; BERT's NSP pairs leave some slots as padding), not time. One process at a time, one thread.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/xlnet_sst2}
STEPS=${STEPS:-100}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
W=$DATA/wikitext-2
mkdir -p "$OUT"
python - "$DATA" "$OUT/sst2-8000.tsv" <<'PY'
import sys
rows = open(f"{sys.argv[1]}/glue/SST-2/train.tsv", encoding="utf-8").read().splitlines()
idx = [int(x) for x in open(f"{sys.argv[1]}/glue/SST-2/train_subset8000_dataseed0.idx").read().split()]
open(sys.argv[2], "w", encoding="utf-8").write("\n".join([rows[0]] + [rows[1 + i] for i in idx]) + "\n")
PY
bertkit tokenizer train --kind unigram --xlnet --vocab-size 8000 --files "$W/wiki.test.raw" --out "$OUT/tok-xlnet" --quiet
bertkit tokenizer train --kind wordpiece --vocab-size 8000 --files "$W/wiki.test.raw" --out "$OUT/tok-bert" --quiet
for m in xlnet bert; do
  bertkit prepare --corpus "$W/wiki.test.raw" --eval-corpus "$W/wiki.valid.raw" --format wikitext \
    --tokenizer "$OUT/tok-$m" --out "$OUT/data-$m" --quiet > /dev/null
done
bertkit pretrain --data "$OUT/data-xlnet" --out "$OUT/pre-xlnet" --config xlnet-mini --max-steps "$STEPS" \
  --batch-size 16 --save-every 50 --eval-instances 256 --seed 0 --progress false
bertkit pretrain --data "$OUT/data-bert" --out "$OUT/pre-bert" --config mini --max-steps "$STEPS" \
  --batch-size 16 --save-every 50 --eval-instances 256 --seed 0 --progress false
for seed in 1 2 3; do
  for m in xlnet bert; do
    bertkit finetune glue --task sst2 --model "$OUT/pre-$m/model" --train "$OUT/sst2-8000.tsv" \
      --dev "$DATA/glue/SST-2/dev.tsv" --out "$OUT/ft-$m-$seed" --epochs 1 --batch-size 32 --max-seq-length 64 \
      --learning-rate 1e-4 --seed "$seed" --quiet
  done
done
python - "$OUT" <<'PY'
import json, statistics, sys
for m in ("xlnet", "bert"):
    acc = [json.load(open(f"{sys.argv[1]}/ft-{m}-{s}/results.json"))["best"]["accuracy"] for s in (1, 2, 3)]
    print(m, [round(a, 4) for a in acc], "mean", round(statistics.mean(acc), 4))
PY
