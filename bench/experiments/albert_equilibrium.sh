#!/usr/bin/env bash
# The ALBERT paper's "equilibrium" figure (Lan et al., 2019, figure 1) at CPU scale: a BERT and an ALBERT of the same
# shape (LAYERS layers, H 128, A 2, FFN 512; the ALBERT with E 128 and one layer's weights shared by all layers),
# pretrained by bertkit for the same number of steps on WikiText-2 (wiki.test.raw; held-out wiki.valid.raw) with a
# WordPiece vocabulary of 8,192 tokens trained on that text, each with its own objective (BERT: MLM + NSP; ALBERT:
# MLM + SOP), no dropout, length 64, batch 32, bf16 autocast. Then `bertkit analyze layers` measures, on the
# held-out text, the L2 and cosine distance between each layer's input and output embeddings of both models and
# draws them side by side (OUT/layers/layers.png, numbers in OUT/layers/layers.json).
#
#   OMP_NUM_THREADS=1 nohup bash bench/experiments/albert_equilibrium.sh &    # STEPS=1500 LAYERS=6 OUT=runs/equilibrium
#   STEPS=20 bash bench/experiments/albert_equilibrium.sh                     # a smoke run
#
# A finished run (OUT/run-NAME/model) is kept: a second call only redoes the analysis.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/equilibrium}
STEPS=${STEPS:-1500}
LAYERS=${LAYERS:-6}
OPTIMIZER=${OPTIMIZER:-adamw}
WIKI=$DATA/wikitext-2
mkdir -p "$OUT"
[ -f "$OUT/tok/vocab.txt" ] || bertkit tokenizer train --files "$WIKI/wiki.test.raw" --vocab-size 8192 --out "$OUT/tok"
[ -f "$OUT/wt2/manifest.json" ] || bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --out "$OUT/wt2" > /dev/null
COMMON=(--config tiny --num-hidden-layers "$LAYERS" --max-steps "$STEPS" --max-seq-length 64 --batch-size 32
        --precision bf16 --hidden-dropout-prob 0 --attention-probs-dropout-prob 0 --eval-instances 500
        --eval-every 0 --save-every "$STEPS" --optimizer "$OPTIMIZER" --progress false)
[ -d "$OUT/run-bert/model" ] || bertkit pretrain --data "$OUT/wt2" --out "$OUT/run-bert" "${COMMON[@]}" --objective bert
[ -d "$OUT/run-albert/model" ] || bertkit pretrain --data "$OUT/wt2" --out "$OUT/run-albert" "${COMMON[@]}" \
    --objective albert --model-type albert --embedding-size 128 --num-hidden-groups 1
# Held-out text for the analysis: the first 200 non-empty, non-heading lines of the validation split.
grep -v '^ *=' "$WIKI/wiki.valid.raw" | grep -v '^ *$' | head -200 > "$OUT/texts.txt"
bertkit analyze layers --model "$OUT/run-bert/model" "$OUT/run-albert/model" --name BERT ALBERT \
    --input "$OUT/texts.txt" --out "$OUT/layers"
