#!/usr/bin/env bash
# Does pretraining help? The textbook experiment (BERT-base on CoLA: MCC 0.57 pretrained, 0.04 from scratch) at
# CPU scale: a tiny (L2 H128) and a mini (L4 H256) BERT, each pretrained with bertkit for 29 minutes on one CPU
# thread (the two side by side on a 2-core machine), then fine-tuned on the SST-2 8,000-example subset and on
# CoLA, against the same architecture fine-tuned from random initialisation with the same recipe.
#
#   bash bench/experiments/pretrain_vs_scratch.sh        # DATA=../shared/data OUT=runs/pretrain_vs_scratch
#   PRECISION=fp32 bash bench/experiments/pretrain_vs_scratch.sh   # CPUs without bf16 instructions
#
# Unlabeled text: WikiText-2 (wiki.test.raw; wiki.valid.raw is held out for the masked-LM accuracy) plus the
# 67,349 SST-2 training sentences without their labels, one document each. Both starting points share one 8k
# WordPiece vocabulary trained on that text. Fine-tuning: 3 epochs, batch 32, length 64, dropout 0.1, the best
# epoch on dev kept (as for every bertkit fine-tuning run), seeds 1-3 at every learning rate of LRS; each starting
# point is reported at the rate with the best mean over the seeds, and CoLA runs at that rate. Takes about 70
# minutes on 2 cores.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/pretrain_vs_scratch}
SECONDS_BUDGET=${SECONDS_BUDGET:-1740}
PRECISION=${PRECISION:-bf16}
LRS=${LRS:-"1e-4 3e-4 6e-4 1e-3"}
WIKI=$DATA/wikitext-2
GLUE=$DATA/glue
mkdir -p "$OUT/ft"

# Unlabeled SST-2 sentences (a blank line after each: one document per sentence), and the labelled
# 8,000-example training subset of the reference figures.
tail -n +2 "$GLUE/SST-2/train.tsv" | cut -f1 | awk '{print; print ""}' > "$OUT/sst2_docs.txt"
python - "$GLUE/SST-2" "$OUT/sst2_subset8000.tsv" <<'PY'
import sys
from pathlib import Path
folder, target = Path(sys.argv[1]), Path(sys.argv[2])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split()]
target.write_text("\n".join([lines[0]] + [lines[1 + i] for i in keep]) + "\n", encoding="utf-8")
PY

bertkit tokenizer train --files "$WIKI/wiki.test.raw" "$OUT/sst2_docs.txt" --vocab-size 8192 --out "$OUT/tok" --quiet
bertkit prepare --corpus "$WIKI/wiki.test.raw" "$OUT/sst2_docs.txt" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --out "$OUT/data" --quiet

# Masked LM on packed rows of isolated documents, 20% of the tokens predicted, one thread per model.
for preset in tiny mini; do
    [ -f "$OUT/pretrained-$preset/model/config.json" ] && continue
    OMP_NUM_THREADS=1 bertkit pretrain --data "$OUT/data" --out "$OUT/pretrained-$preset" --config mini-fast \
        --preset $preset --isolate-documents true --precision "$PRECISION" --mask-prob 0.2 \
        --max-predictions-per-seq 13 --max-time "$SECONDS_BUDGET" --eval-every 2000 --save-every 1000 \
        --progress false > "$OUT/pretrained-$preset.log" 2>&1 &
done
wait
for preset in tiny mini; do
    [ -d "$OUT/scratch-$preset" ] || bertkit init --tokenizer "$OUT/tok" --preset $preset --seed 0 --out "$OUT/scratch-$preset"
done

finetune() {  # finetune START TASK LR SEED: one run, skipped when its results exist
    local start=$1 task=$2 lr=$3 seed=$4 model=$OUT/$1 train dev run=$OUT/ft/$2-$1-$3-s$4
    [[ $start == pretrained-* ]] && model=$OUT/$start/model
    if [ "$task" = sst2 ]; then train=$OUT/sst2_subset8000.tsv; dev=$GLUE/SST-2/dev.tsv
    else train=$GLUE/CoLA/in_domain_train.tsv; dev=$GLUE/CoLA/in_domain_dev.tsv; fi
    [ -f "$run/results.json" ] && return
    OMP_NUM_THREADS=1 bertkit finetune glue --task "$task" --model "$model" --train "$train" --dev "$dev" \
        --out "$run" --epochs 3 --lr "$lr" --batch-size 32 --max-seq-length 64 --seed "$seed" --dropout 0.1 --quiet
}
best_lr() {  # the learning rate with the best mean SST-2 dev accuracy over seeds 1-3 for START
    python - "$OUT/ft" "$1" $LRS <<'PY'
import json, sys
from pathlib import Path
ft, start, lrs = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
def accuracy(lr, seed):
    return json.loads((ft / f"sst2-{start}-{lr}-s{seed}" / "results.json").read_text())["best"]["accuracy"]
print(max(lrs, key=lambda lr: sum(accuracy(lr, seed) for seed in (1, 2, 3))))
PY
}

# Two runs at a time, one thread each.
for preset in tiny mini; do
    for seed in 1 2 3; do
        for lr in $LRS; do
            finetune pretrained-$preset sst2 "$lr" $seed & finetune scratch-$preset sst2 "$lr" $seed & wait
        done
    done
    lr_p=$(best_lr pretrained-$preset); lr_s=$(best_lr scratch-$preset)
    for seed in 1 2 3; do
        finetune pretrained-$preset cola "$lr_p" $seed & finetune scratch-$preset cola "$lr_s" $seed & wait
    done
done

# One JSON line per pretraining run, then per (task, starting point, learning rate): the seeds' dev scores and
# their mean.
python - "$OUT" <<'PY'
import json, sys
from collections import defaultdict
from pathlib import Path
out = Path(sys.argv[1])
for preset in ("tiny", "mini"):
    last = json.loads((out / f"pretrained-{preset}.log").read_text().strip().splitlines()[-1])
    print(json.dumps({"pretrained": preset, **{k: v for k, v in last.items() if k != "model"}}))
scores = defaultdict(dict)
for run in sorted((out / "ft").glob("*/results.json")):
    task, start, size, rest = run.parent.name.split("-", 3)  # sst2-pretrained-tiny-1e-4-s1
    lr, seed = rest.rsplit("-s", 1)
    metric = "accuracy" if task == "sst2" else "mcc"
    scores[(task, f"{start}-{size}", lr, metric)][int(seed)] = json.loads(run.read_text())["best"][metric]
for (task, start, lr, metric), by_seed in sorted(scores.items()):
    values = [by_seed[seed] for seed in sorted(by_seed)]
    print(json.dumps({"task": task, "start": start, "lr": lr, metric: [round(v, 4) for v in values],
                      "mean": round(sum(values) / len(values), 4)}))
PY
