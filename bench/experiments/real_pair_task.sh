#!/usr/bin/env bash
# Does the main job's short pretraining help on a real sentence-pair task? KorSTS (Korean STS-B, ../shared/data)
# as three classes by score band (`korsts_pipeline_data.py`: "different" below 2, "related" from 2 to below 4,
# "equivalent" from 4), with the main job's own settings, through the verbs a user types:
#
#   bash bench/experiments/real_pair_task.sh      # DATA=../shared/data OUT=runs/real_pair_task PRETRAIN_S=600
#   PRECISION=fp32 bash bench/experiments/real_pair_task.sh   # CPUs without bf16 instructions
#
# Corpus: every KorSTS training sentence once, dev sentences left out (0.77 MB); an 8,192-token WordPiece
# vocabulary, lowercased, accents kept (Hangul syllables stay whole, as the main job chooses for this text).
# Pretraining: the main job's recipe (`mini-fast` at the tiny size, masked LM on packed rows of isolated
# documents, 20% of the tokens predicted, peak learning rate 2e-3, classification from the mean of the tokens),
# one thread, for PRETRAIN_S seconds. The baseline: the same architecture with fresh random weights
# (`bertkit init --like`). Both starting points are fine-tuned on the same class-balanced label sets of 64, 128,
# 256 and 512 pairs (the main job's `stratified_order`, seeds 1-3) and on all 5,749, with the main job's
# fine-tuning recipe (lr 3e-4, batch 16, dropout 0.1, length 64, at least 1,000 examples seen: a small set is
# repeated; all labels: 3 passes; dev scored once, at the end). Up to 512 labels the main job's frozen recipe runs
# too (a logistic regression on the frozen encoder's last layer) for both. With PRETRAIN_S=600 it took 44 minutes
# on a 2-core machine shared with other work (load average 1.6 to 12; the fine-tuning runs are most of it); finished
# runs are reused when the command is repeated. Its figures: docs/getting-started/main-job.md, "Runs".
#
# Prints one JSON line for the pretraining (steps, held-out masked-token accuracy), then one per (recipe, label
# count, starting point): each seed's dev accuracy and their median, with the dev set's majority-class accuracy.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/real_pair_task}
PRETRAIN_S=${PRETRAIN_S:-600}
PRECISION=${PRECISION:-bf16}
LABELS=${LABELS:-"64 128 256 512"}
SEEDS=${SEEDS:-"1 2 3"}
ALL=${ALL:-1}  # 0: no all-labels runs
export OMP_NUM_THREADS=1
mkdir -p "$OUT/sets" "$OUT/ft"

python bench/experiments/korsts_pipeline_data.py --data "$DATA/korsts" --out "$OUT/korsts" > "$OUT/korsts.json"
[ -f "$OUT/tok/vocab.txt" ] || bertkit tokenizer train --files "$OUT/korsts/corpus.txt" --vocab-size 8192 \
    --no-strip-accents --out "$OUT/tok" --quiet
[ -f "$OUT/data/manifest.json" ] || bertkit prepare --corpus "$OUT/korsts/corpus.txt" --tokenizer "$OUT/tok" \
    --out "$OUT/data" --eval-fraction 0.03 --seed 0 --quiet > "$OUT/prepare.json"
[ -f "$OUT/pretrained/model/config.json" ] || bertkit pretrain --data "$OUT/data" --out "$OUT/pretrained" \
    --config mini-fast --preset tiny --isolate-documents true --mask-prob 0.2 --max-predictions-per-seq 13 \
    --classifier-pooling mean --learning-rate 2e-3 --precision "$PRECISION" --eval-instances 500 \
    --eval-every 200 --max-time "$PRETRAIN_S" --seed 0 --progress false > "$OUT/pretrained.log" 2>&1
[ -f "$OUT/scratch/config.json" ] || bertkit init --like "$OUT/pretrained/model" --seed 0 --out "$OUT/scratch"

# The label sets: train-N-sS.jsonl once over (the frozen recipe), train-N-sS-ft.jsonl repeated to at least 1,000
# examples (one fine-tuning epoch over it is every pass); all labels 3 times over.
python - "$OUT/korsts/train.jsonl" "$OUT/sets" "$LABELS" "$SEEDS" <<'PY'
import json, sys
from pathlib import Path
from bertkit.pipeline.curve import passes_for, stratified_order
rows = Path(sys.argv[1]).read_text(encoding="utf-8").splitlines()
labels = [json.loads(r)["label"] for r in rows]
sets = Path(sys.argv[2])
def write(name, chosen, passes):
    (sets / name).write_text("".join(rows[i] + "\n" for i in chosen) * passes, encoding="utf-8")
for seed in map(int, sys.argv[4].split()):
    order = stratified_order(labels, seed)
    for n in map(int, sys.argv[3].split()):
        write(f"train-{n}-s{seed}.jsonl", order[:n], 1)
        write(f"train-{n}-s{seed}-ft.jsonl", order[:n], passes_for(n))
write("train-all-s1-ft.jsonl", range(len(rows)), passes_for(len(rows)))
PY

finetune() {  # finetune START SET SEED [options]: one run, skipped when its results exist
    local start=$1 set=$2 seed=$3 model=$OUT/scratch name=$2
    shift 3
    [ "$start" = pretrained ] && model=$OUT/pretrained/model
    [ $# -gt 0 ] && name=$set-frozen
    [ -f "$OUT/ft/$start-$name/results.json" ] && return
    bertkit finetune classify --model "$model" --train "$OUT/sets/$set.jsonl" --dev "$OUT/korsts/dev.jsonl" \
        --text-column sentence1 --pair-column sentence2 --label-column label --out "$OUT/ft/$start-$name" \
        --epochs 1 --lr 3e-4 --batch-size 16 --max-seq-length 64 --dropout 0.1 --seed "$seed" \
        --precision "$PRECISION" --new-head --quiet "$@" > /dev/null
}
for n in $LABELS; do
    for seed in $SEEDS; do
        for start in pretrained scratch; do
            finetune $start "train-$n-s$seed-ft" "$seed"
            finetune $start "train-$n-s$seed" "$seed" --frozen --layers=-1 --task-model logistic \
                --feature-cache "$OUT/ft/$start.features"
        done
    done
done
[ "$ALL" = 0 ] || for start in pretrained scratch; do finetune $start train-all-s1-ft 1; done

python - "$OUT" <<'PY'
import collections, json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
last = [json.loads(l) for l in (out / "pretrained.log").read_text().splitlines() if l.startswith("{")]
evals = [l for l in last if "eval_mlm_accuracy" in l]
print(json.dumps({"pretrained": {"steps": last[-1].get("step"), **({"eval_mlm_accuracy": evals[-1]["eval_mlm_accuracy"]}
                                                                    if evals else {})}}))
dev = collections.Counter(json.loads(l)["label"] for l in (out / "korsts" / "dev.jsonl").open(encoding="utf-8"))
majority = max(dev.values()) / sum(dev.values())
runs = collections.defaultdict(dict)
for path in sorted((out / "ft").glob("*/results.json")):
    start, _, n, seed, *rest = path.parent.name.split("-")  # pretrained-train-64-s1-ft
    recipe = "fine-tuned" if rest == ["ft"] else "frozen logistic"
    result = json.loads(path.read_text())
    runs[(recipe, n, start)][seed] = (result.get("best") or result["final"])["accuracy"]
for (recipe, n, start), by_seed in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all", int(kv[0][1])
                                                                        if kv[0][1] != "all" else 0, kv[0][2])):
    values = [round(by_seed[s], 4) for s in sorted(by_seed)]
    print(json.dumps({"recipe": recipe, "labels": n, "start": start, "accuracy": values,
                      "median": round(statistics.median(values), 4), "majority": round(majority, 4)}))
PY
