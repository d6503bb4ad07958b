#!/usr/bin/env bash
# GPT-1's auxiliary LM loss on a real task: a tiny causal model (byte-level BPE, --config causal-mini --preset
# tiny, STEPS=150 pretraining steps on WikiText-2's wiki.test.raw) fine-tuned on 4,000 SST-2 training sentences it
# never saw (lines 20,002-24,001 of train.tsv), 3 epochs, lr 1e-3, batch 32, dev = SST-2 dev (majority class
# 0.509), once with the default auxiliary loss (--lm-weight 0.5) and once without (--lm-weight 0), for each seed.
# Prints one JSON line per run: seed, lm_weight, the LM head that scored L1, every epoch's dev accuracy, the best.
#
#   bash bench/experiments/gpt1_aux_sst2.sh                       # DATA=../shared/data OUT=runs/gpt1_aux SEEDS="0 1"
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/gpt1_aux}
SEEDS=${SEEDS:-0 1}
STEPS=${STEPS:-150}
WIKI=$DATA/wikitext-2
SST=$DATA/glue/SST-2
mkdir -p "$OUT"

[ -d "$OUT/tok" ] || bertkit tokenizer train --kind bpe --files "$WIKI/wiki.test.raw" --vocab-size 4096 \
    --out "$OUT/tok" --quiet
[ -d "$OUT/data" ] || bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --tokenizer-kind bpe --out "$OUT/data" --quiet > /dev/null
[ -d "$OUT/pre/model" ] || bertkit pretrain --data "$OUT/data" --out "$OUT/pre" --config causal-mini --preset tiny \
    --max-steps "$STEPS" --seed 0 --eval-every 0 --save-every 1000000 --eval-instances 100 --progress false \
    > "$OUT/pre.log" 2>&1
{ head -n 1 "$SST/train.tsv"; sed -n 20002,24001p "$SST/train.tsv"; } > "$OUT/sst2-heldout.tsv"

for seed in $SEEDS; do
    for weight in 0.5 0; do
        run="$OUT/ft-lm$weight-seed$seed"
        rm -rf "$run"
        bertkit finetune glue --task sst2 --model "$OUT/pre/model" --train "$OUT/sst2-heldout.tsv" \
            --dev "$SST/dev.tsv" --out "$run" --epochs 3 --lr 1e-3 --batch-size 32 --lm-weight "$weight" \
            --seed "$seed" --quiet > "$run.log" 2>&1
        python -c "import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({'seed': $seed, \
'lm_weight': $weight, 'lm_head': r.get('lm_head'), 'dev_accuracy': [round(e['accuracy'], 4) for e in r['epochs']], \
'best': round(r['best']['accuracy'], 4)}))" "$run/results.json"
    done
done
