#!/usr/bin/env bash
# Does span-corruption pretraining help a T5 fine-tuned as text to text? A mini T5 (t5-mini: 4 + 4 layers,
# d_model 256) pretrained with bertkit on WikiText-2 for a fixed budget of steps, then fine-tuned on the SST-2
# 8,000-example subset as text to text ("sst2 sentence: ..." -> "positive" / "negative", greedy decoding, dev
# accuracy with unrecognised generations counted as wrong), against the same architecture fine-tuned from T5's
# random initialisation (`bertkit init --model-type t5`) with the same recipe, seeds 1-3 at every rate of LRS.
#
#   bash bench/experiments/t5_sst2.sh        # DATA=../shared/data OUT=runs/t5_sst2 PRETRAIN_STEPS=100 EPOCHS=1
#
# Text: WikiText-2's wiki.test.raw for pretraining (wiki.valid.raw held out: span-corruption loss and accuracy),
# an 8k Unigram vocabulary with T5's 100 sentinels trained on it, shared by both starting points. Pretraining: the
# t5-mini recipe (inputs of 128 tokens, noise density 0.15, mean span length 3, batch 32, AdamW 1e-3 on T5's
# inverse-square-root schedule, still in its constant warm-up part) for PRETRAIN_STEPS steps (resumed from its last
# checkpoint when stopped). Fine-tuning: EPOCHS epochs, batch 32, inputs of 64 tokens, dropout 0.1, the best epoch
# on dev kept; each starting point is reported at the rate with the best mean over the seeds. The budget is fixed in
# steps and epochs, not time. Every process runs on one thread, three at a time: the pretraining beside the
# fine-tunes from the random start, then the fine-tunes from the pretrained model (with the defaults, about 20
# minutes on three free cores; a shared machine takes as many times longer as it is oversubscribed).
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/t5_sst2}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-100}
EPOCHS=${EPOCHS:-1}
PRECISION=${PRECISION:-fp32}
LRS=${LRS:-"1e-3"}
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

pretrain() {  # skipped when it has ended (its model is written at every checkpoint too), resumed when stopped
    [ -f "$OUT/pretrained/result.json" ] && return
    local resume=()
    [ -d "$OUT/pretrained/checkpoints" ] && resume=(--resume)
    OMP_NUM_THREADS=1 bertkit pretrain --data "$OUT/data" --out "$OUT/pretrained" --config t5-mini \
        --precision "$PRECISION" --max-steps "$PRETRAIN_STEPS" --eval-every 100000 --save-every 50 \
        --progress false "${resume[@]}" >> "$OUT/pretrained.log" 2>&1
}
[ -d "$OUT/scratch" ] || bertkit init --model-type t5 --tokenizer "$OUT/tok" --preset mini --seed 0 --out "$OUT/scratch"

finetune() {  # finetune START LR SEED: one run, skipped when its results exist
    local start=$1 lr=$2 seed=$3 model=$OUT/$1 run=$OUT/ft/sst2-$1-$2-s$3
    [ "$start" = pretrained ] && model=$OUT/pretrained/model
    [ -f "$run/results.json" ] && return
    OMP_NUM_THREADS=1 bertkit finetune glue --task sst2 --model "$model" --train "$OUT/sst2_subset8000.tsv" \
        --dev "$GLUE/SST-2/dev.tsv" --out "$run" --epochs "$EPOCHS" --lr "$lr" --batch-size 32 --max-seq-length 64 \
        --seed "$seed" --dropout 0.1 --precision "$PRECISION" --quiet
}

after_pretraining() {  # wait for the pretraining lane; true when it produced the model
    while [ ! -f "$OUT/pretrained.done" ] && [ ! -f "$OUT/pretrained.failed" ]; do sleep 10; done
    [ -f "$OUT/pretrained.done" ]
}

# Three lanes of one thread each: (pretraining, then the pretrained model's seeds 1 and 3), (the random start's
# seeds 1 and 2), (its seed 3, then the pretrained model's seed 2).
rm -f "$OUT/pretrained.done" "$OUT/pretrained.failed"
for lr in $LRS; do
    { pretrain || { touch "$OUT/pretrained.failed"; exit 1; }
      touch "$OUT/pretrained.done"; finetune pretrained "$lr" 1; finetune pretrained "$lr" 3; } &
    { finetune scratch "$lr" 1; finetune scratch "$lr" 2; } &
    { finetune scratch "$lr" 3; after_pretraining && finetune pretrained "$lr" 2; } &
    wait
done

# The pretraining run's last line, then one JSON line per (starting point, learning rate): the seeds' dev
# accuracies, their mean and the unrecognised generations of the best epochs; then each starting point at its best
# rate.
python - "$OUT" <<'PY'
import json, sys
from collections import defaultdict
from pathlib import Path
out = Path(sys.argv[1])
# The run's result, or (a run stopped at its last checkpoint) its last logged training step.
result = out / "pretrained" / "result.json"
last = json.loads(result.read_text()) if result.exists() else [
    row for row in map(json.loads, (out / "pretrained" / "metrics.jsonl").read_text().splitlines()) if "loss" in row][-1]
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
