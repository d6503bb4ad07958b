#!/usr/bin/env bash
# Does pretraining help? A mini BERT (L4/H256) pretrained with bertkit on CPU for 30 minutes in all, then fine-tuned
# on SST-2 (the 8,000-example subset) and CoLA, against the same architecture fine-tuned from random
# initialisation. The small-scale version of the textbook result (BERT-base on CoLA: MCC 0.57 pretrained,
# 0.04 from scratch).
#
#   bash bench/experiments/pretrain_vs_scratch.sh            # DATA=../shared/data OUT=runs/pretrain_vs_scratch
#
# Phase 1 (20 min) is also the WikiText-2 pretraining figure of the README: MLM + NSP on wiki.test.raw, evaluated
# on wiki.valid.raw. Phase 2 (10 min) continues with MLM only (RoBERTa-style packing) on WikiText-2 plus the
# SST-2 training sentences without their labels.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/pretrain_vs_scratch}
VOCAB=$DATA/vocab/bert-base-uncased-vocab.txt
WIKI=$DATA/wikitext-2
GLUE=$DATA/glue
FT=(--epochs 3 --learning-rate 1e-4 --batch-size 32 --max-seq-length 64 --seed 1)
mkdir -p "$OUT"

# Unlabeled SST-2 sentences, and the labelled 8,000-example training subset used by the reference figures.
tail -n +2 "$GLUE/SST-2/train.tsv" | cut -f1 > "$OUT/sst2_sentences.txt"
python - "$GLUE/SST-2" "$OUT/sst2_subset8000.tsv" <<'PY'
import sys
from pathlib import Path
folder, target = Path(sys.argv[1]), Path(sys.argv[2])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split()]
target.write_text("\n".join([lines[0]] + [lines[1 + i] for i in keep]) + "\n", encoding="utf-8")
PY

# Phase 1: MLM + NSP on WikiText-2, 20 minutes.
bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" --tokenizer "$VOCAB" \
    --out "$OUT/wiki" --quiet
bertkit pretrain --data "$OUT/wiki" --out "$OUT/phase1" --config mini --max-time 1200
# Phase 2: MLM on WikiText-2 + SST-2 sentences, 10 minutes, from phase 1.
bertkit prepare --corpus "$WIKI/wiki.test.raw" "$OUT/sst2_sentences.txt" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$VOCAB" --out "$OUT/mixed" --quiet
bertkit pretrain --data "$OUT/mixed" --out "$OUT/phase2" --config mini --objective roberta \
    --init-from "$OUT/phase1/model" --max-time 600 --warmup-ratio 0.02
# The baseline: the same architecture, randomly initialised.
bertkit init --tokenizer "$VOCAB" --preset mini --seed 0 --out "$OUT/scratch"

for model in phase2 scratch; do
    dir=$OUT/$model
    [ "$model" = phase2 ] && dir=$OUT/phase2/model
    bertkit finetune glue --task sst2 --model "$dir" --train "$OUT/sst2_subset8000.tsv" --dev "$GLUE/SST-2/dev.tsv" \
        --out "$OUT/sst2-$model" "${FT[@]}" --quiet
    bertkit finetune glue --task cola --model "$dir" --train "$GLUE/CoLA/in_domain_train.tsv" \
        --dev "$GLUE/CoLA/in_domain_dev.tsv" --out "$OUT/cola-$model" "${FT[@]}" --quiet
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for task, metric in (("sst2", "accuracy"), ("cola", "mcc")):
    for model in ("phase2", "scratch"):
        best = json.loads((out / f"{task}-{model}" / "results.json").read_text())["best"]
        print(json.dumps({"task": task, "model": "pretrained" if model == "phase2" else "from scratch",
                          metric: best.get(metric)}))
PY
