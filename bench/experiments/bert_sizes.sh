#!/usr/bin/env bash
# The BERT paper's model-size table (Devlin et al., 2018, section 5.2, table 6) at CPU scale: BERT encoders of
# growing size (SIZES: tiny L2 H128, mini L4 H256, small L4 H512) pretrained with MLM + NSP on WikiText-2
# (wiki.test.raw; held-out wiki.valid.raw, the 8,192-piece vocabulary of bench/experiments/bert_ablations.sh) for
# the same number of steps (STEPS), batch and peak learning rate (PRETRAIN_LR, 3e-4: at the tiny recipe's 1e-3
# the small model stays at the unigram plateau, held-out MLM accuracy 0.05 after 1,000 steps), then fine-tuned with one recipe on SST-2 (8,000-example subset) and
# CoLA (in-domain train, in-domain dev), one run per seed (SEEDS). The paper's columns: held-out MLM perplexity
# (here each run's `eval_perplexity` on 500 held-out instances) and dev scores; the table is OUT/sizes.md (and
# `bertkit card` over the fine-tuning runs: OUT/card/card.md, card.png). A stage whose output exists is kept.
#
#   OMP_NUM_THREADS=1 nohup bash bench/experiments/bert_sizes.sh &     # DATA=../shared/data OUT=runs/sizes
#   STEPS=10 SEEDS=1 EPOCHS=1 SIZES="tiny mini" bash bench/experiments/bert_sizes.sh     # a smoke run
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/sizes}
SIZES=${SIZES:-tiny mini small}
STEPS=${STEPS:-1000}
PRETRAIN_LR=${PRETRAIN_LR:-3e-4}
SEEDS=${SEEDS:-1,2,3}
LR=${LR:-5e-4}
EPOCHS=${EPOCHS:-1}
TASKS=${TASKS:-sst2 cola}
WIKI=$DATA/wikitext-2
GLUE=$DATA/glue
mkdir -p "$OUT/ft"
. "$(dirname "$0")/sweep.sh"

[ -f "$OUT/tok/vocab.txt" ] || bertkit tokenizer train --files "$WIKI/wiki.test.raw" --vocab-size 8192 --out "$OUT/tok"
[ -f "$OUT/wt2/manifest.json" ] || bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --out "$OUT/wt2" > /dev/null
[ -f "$OUT/sst2_subset8000.tsv" ] || python - "$GLUE/SST-2" "$OUT/sst2_subset8000.tsv" <<'PY'
import sys
from pathlib import Path
folder, target = Path(sys.argv[1]), Path(sys.argv[2])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split()]
target.write_text("\n".join([lines[0]] + [lines[1 + i] for i in keep]) + "\n", encoding="utf-8")
PY

for size in $SIZES; do
    pre=$OUT/pre-$size
    [ -f "$pre/model/config.json" ] || bertkit pretrain --data "$OUT/wt2" --out "$pre" --config tiny --preset "$size" \
        --objective bert --max-steps "$STEPS" --learning-rate "$PRETRAIN_LR" --max-seq-length 64 --batch-size 32 --precision bf16 \
        --eval-instances 500 --eval-every 0 --save-every "$STEPS" --seed 0 --progress false > "$pre.log" 2>&1
    for task in $TASKS; do
        finetune_sweep "$task" "$OUT/ft/$task-$size" "$size" "$pre/model"
    done
done

runs=()
for size in $SIZES; do for task in $TASKS; do
    [ -f "$OUT/ft/$task-$size/card.json" ] && runs+=("$OUT/ft/$task-$size")
done; done
bertkit card "${runs[@]}" --out "$OUT/card"
# The size table: parameters, held-out MLM perplexity and accuracy, and each task's median dev score.
python - "$OUT" "$TASKS" $SIZES <<'PY'
import json
import math
import sys
from pathlib import Path

from safetensors import safe_open

out, tasks, sizes = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
head = "| model | L | H | parameters | steps | held-out MLM perplexity | held-out MLM accuracy | " + \
       " | ".join(f"{t} (median, min-max)" for t in tasks) + " |"
lines = [head, "|" + "---|" * (7 + len(tasks))]
for size in sizes:
    pre = out / f"pre-{size}"
    result = json.loads((pre / "result.json").read_text())
    config = json.loads((pre / "model" / "config.json").read_text())
    with safe_open(str(pre / "model" / "model.safetensors"), "pt") as f:
        count = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    cells = []
    for task in tasks:
        card_file = out / "ft" / f"{task}-{size}" / "card.json"
        if not card_file.exists():
            cells.append("")
            continue
        card = json.loads(card_file.read_text())
        metric = card["metric"]
        key = metric if metric in card["stats"] else next(k for k in card["stats"] if k.split("/")[-1] == metric)
        stats = card["stats"][key]
        cells.append(f"{stats['median']:.3f} ({stats['min']:.3f}-{stats['max']:.3f}), {metric}, n={stats['n']}")
    lines.append(f"| {size} | {config['num_hidden_layers']} | {config['hidden_size']} | {count / 1e6:.1f}M | "
                 f"{result['step']} | {result['eval_metrics']['eval_perplexity']:.1f} | {result['eval_metrics']['eval_mlm_accuracy']:.3f} | "
                 + " | ".join(cells) + " |")
(out / "sizes.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
print("\n".join(lines))
PY
