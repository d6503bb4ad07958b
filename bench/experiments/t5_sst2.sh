#!/usr/bin/env bash
# Does span-corruption pretraining help a T5 fine-tuned as text to text? A mini T5 (t5-mini: 4 + 4 layers,
# d_model 256) pretrained with bertkit on WikiText-2 for a fixed CPU budget, then fine-tuned on the SST-2
# 8,000-example subset as text to text ("sst2 sentence: ..." -> "positive" / "negative", greedy decoding, dev
# accuracy with unrecognised generations counted as wrong), against the same architecture fine-tuned from T5's
# random initialisation (`bertkit init --model-type t5`) with the same recipe, seeds 1-3 at every rate of LRS.
#
#   bash bench/experiments/t5_sst2.sh        # DATA=../shared/data OUT=runs/t5_sst2 MINUTES=30
#   PRECISION=fp32 bash bench/experiments/t5_sst2.sh   # CPUs without bf16 instructions
#
# Text: WikiText-2's wiki.test.raw for pretraining (wiki.valid.raw held out: span-corruption loss and accuracy),
# an 8k Unigram vocabulary with T5's 100 sentinels trained on it, shared by both starting points. Pretraining: the
# t5-mini recipe (inputs of 128 tokens, noise density 0.15, mean span length 3, AdamW 1e-3 on T5's
# inverse-square-root schedule) for MINUTES minutes on 2 threads. Fine-tuning: 3 epochs, batch 32, inputs of 64
# tokens, dropout 0.1, the best epoch on dev kept; each starting point is reported at the rate with the best mean
# over the seeds. Takes MINUTES + about 40 minutes on 2 cores.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/t5_sst2}
MINUTES=${MINUTES:-30}
PRETRAIN_SECONDS=${PRETRAIN_SECONDS:-$((MINUTES * 60))}
PRECISION=${PRECISION:-bf16}
LRS=${LRS:-"3e-4 1e-3"}
WIKI=$DATA/wikitext-2
GLUE=$DATA/glue
mkdir -p "$OUT/ft"

# The labelled 8,000-example training subset of the reference figures.
python - "$GLUE/SST-2" "$OUT/sst2_subset8000.tsv" <<'PY'
import sys
from pathlib import Path
folder, target = Path(sys.argv[1]), Path(sys.argv[2])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split()]
target.write_text("\n".join([lines[0]] + [lines[1 + i] for i in keep]) + "\n", encoding="utf-8")
PY

[ -f "$OUT/tok/tokenizer.json" ] || bertkit tokenizer train --kind unigram --files "$WIKI/wiki.test.raw" \
    --vocab-size 8192 --extra-ids 100 --out "$OUT/tok" --quiet
[ -f "$OUT/data/manifest.json" ] || bertkit prepare --corpus "$WIKI/wiki.test.raw" \
    --eval-corpus "$WIKI/wiki.valid.raw" --tokenizer "$OUT/tok" --out "$OUT/data" --quiet

if [ ! -f "$OUT/pretrained/model/config.json" ]; then
    OMP_NUM_THREADS=2 bertkit pretrain --data "$OUT/data" --out "$OUT/pretrained" --config t5-mini \
        --precision "$PRECISION" --max-time "$PRETRAIN_SECONDS" --eval-every 1000 --save-every 500 \
        --progress false > "$OUT/pretrained.log" 2>&1
fi
[ -d "$OUT/scratch" ] || bertkit init --model-type t5 --tokenizer "$OUT/tok" --preset mini --seed 0 --out "$OUT/scratch"

finetune() {  # finetune START LR SEED: one run, skipped when its results exist
    local start=$1 lr=$2 seed=$3 model=$OUT/$1 run=$OUT/ft/sst2-$1-$2-s$3
    [ "$start" = pretrained ] && model=$OUT/pretrained/model
    [ -f "$run/results.json" ] && return
    OMP_NUM_THREADS=1 bertkit finetune glue --task sst2 --model "$model" --train "$OUT/sst2_subset8000.tsv" \
        --dev "$GLUE/SST-2/dev.tsv" --out "$run" --epochs 3 --lr "$lr" --batch-size 32 --max-seq-length 64 \
        --seed "$seed" --dropout 0.1 --precision "$PRECISION" --quiet
}

# Two runs at a time, one thread each.
for seed in 1 2 3; do
    for lr in $LRS; do
        finetune pretrained "$lr" $seed & finetune scratch "$lr" $seed & wait
    done
done

# The pretraining run's last line, then one JSON line per (starting point, learning rate): the seeds' dev
# accuracies, their mean and the unrecognised generations of the best epochs; then each starting point at its best
# rate.
python - "$OUT" <<'PY'
import json, sys
from collections import defaultdict
from pathlib import Path
out = Path(sys.argv[1])
last = json.loads((out / "pretrained.log").read_text().strip().splitlines()[-1])
print(json.dumps({"pretrained": "t5-mini", **{k: v for k, v in last.items() if k != "model"}}))
scores = defaultdict(dict)
for run in sorted((out / "ft").glob("*/results.json")):
    _, start, rest = run.parent.name.split("-", 2)  # sst2-pretrained-1e-3-s1
    lr, seed = rest.rsplit("-s", 1)
    best = json.loads(run.read_text())["best"]
    scores[(start, lr)][int(seed)] = (best["accuracy"], best.get("unrecognized", 0))
means = {}
for (start, lr), by_seed in sorted(scores.items()):
    values = [by_seed[s][0] for s in sorted(by_seed)]
    means[(start, lr)] = sum(values) / len(values)
    print(json.dumps({"task": "sst2", "start": start, "lr": lr, "accuracy": [round(v, 4) for v in values],
                      "mean": round(means[(start, lr)], 4),
                      "unrecognized": [by_seed[s][1] for s in sorted(by_seed)]}))
for start in ("pretrained", "scratch"):
    lr = max((k[1] for k in means if k[0] == start), key=lambda r: means[(start, r)])
    print(json.dumps({"start": start, "best_lr": lr, "mean_accuracy": round(means[(start, lr)], 4)}))
PY
