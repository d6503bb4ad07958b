#!/usr/bin/env bash
# Does pretraining help? A mini BERT (L4/H256) pretrained with bertkit on CPU for 20 minutes, then fine-tuned on
# SST-2 (the 8,000-example subset) and CoLA, against the same architecture fine-tuned from random
# initialisation: the small-scale version of the textbook result (BERT-base on CoLA: MCC 0.57 pretrained, 0.04
# from scratch).
#
#   bash bench/experiments/pretrain_vs_scratch.sh            # DATA=../shared/data OUT=runs/pretrain_vs_scratch
#
# Unlabeled text: WikiText-2 (wiki.test.raw; wiki.valid.raw is held out for evaluation) plus the SST-2 training
# sentences without their labels. Both models share one 8k WordPiece vocabulary trained on that text.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/pretrain_vs_scratch}
MINUTES=${MINUTES:-20}
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

bertkit tokenizer train --files "$WIKI/wiki.test.raw" "$OUT/sst2_sentences.txt" --vocab-size 8192 --out "$OUT/tok" --quiet
bertkit prepare --corpus "$WIKI/wiki.test.raw" "$OUT/sst2_sentences.txt" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --out "$OUT/data" --quiet
bertkit pretrain --data "$OUT/data" --out "$OUT/pretrained" --config mini-fast --max-time $((MINUTES * 60))
bertkit init --tokenizer "$OUT/tok" --preset mini --seed 0 --out "$OUT/scratch"

for model in pretrained scratch; do
    dir=$OUT/$model
    [ "$model" = pretrained ] && dir=$OUT/pretrained/model
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
    for model in ("pretrained", "scratch"):
        best = json.loads((out / f"{task}-{model}" / "results.json").read_text())["best"]
        print(json.dumps({"task": task, "model": model, metric: round(best[metric], 4)}))
PY
