#!/usr/bin/env bash
# The BERT paper's ablation of the pretraining tasks (Devlin et al., 2018, section 5.1, table 5) at CPU scale. One
# small encoder (PRESET, tiny: L2 H128 A2) is pretrained on WikiText-2 (wiki.test.raw; held-out wiki.valid.raw, an
# 8,192-piece WordPiece vocabulary trained on it) for the same number of steps (STEPS) four ways, then
# fine-tuned with the same recipe on the SST-2 8,000-example subset, CoLA (in-domain train, in-domain dev) and
# CoNLL-2003 NER (NER_SENTENCES training sentences, the whole development split), one run per seed (SEEDS):
#
#   mlm-nsp     MLM + NSP (BERT)                         --objective bert
#   mlm         MLM only ("No NSP")                      --objective roberta-doc (rows of whole sentences of one
#                                                        document, as the NSP rows, without the pair task)
#   ltr         left-to-right LM ("LTR & No NSP")        --objective causal --causal true (a causal mask; the
#                                                        classifier reads the last real token, as GPT-1)
#   ltr-bilstm  ltr + a randomly initialised BiLSTM on top during fine-tuning   --task-model bilstm
#
# Everything else is shared: length 64, batch 32 (the rows of mlm and ltr hold one document's whole sentences and
# hold fewer real tokens than the NSP pairs: result.json of each run says how many it saw), lr 1e-3 with 5% warm-up, bf16 autocast, seed 0 for
# pretraining; fine-tuning lr LR, EPOCHS
# epochs, batch 32, length 64. Every task is a `bertkit finetune --seeds` sweep (its card.json / card.md); the
# table is `bertkit card` over them (OUT/card/card.md, card.png). A stage whose output exists is kept, so a second
# call only does what is missing.
#
#   OMP_NUM_THREADS=1 nohup bash bench/experiments/bert_ablations.sh &     # DATA=../shared/data OUT=runs/ablations
#   STEPS=10 SEEDS=1 NER_SENTENCES=200 bash bench/experiments/bert_ablations.sh     # a smoke run
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/ablations}
PRESET=${PRESET:-tiny}
STEPS=${STEPS:-500}
SEEDS=${SEEDS:-1,2,3}
LR=${LR:-5e-4}
EPOCHS=${EPOCHS:-2}
NER_SENTENCES=${NER_SENTENCES:-3000}
ROWS=${ROWS:-mlm-nsp mlm ltr ltr-bilstm}
TASKS=${TASKS:-sst2 cola ner}
WIKI=$DATA/wikitext-2
GLUE=$DATA/glue
mkdir -p "$OUT/ft"
. "$(dirname "$0")/sweep.sh"

[ -f "$OUT/tok/vocab.txt" ] || bertkit tokenizer train --files "$WIKI/wiki.test.raw" --vocab-size 8192 --out "$OUT/tok"
[ -f "$OUT/wt2/manifest.json" ] || bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" \
    --tokenizer "$OUT/tok" --out "$OUT/wt2" > /dev/null
python - "$GLUE/SST-2" "$OUT/sst2_subset8000.tsv" "$DATA/conll2003/train.txt" "$OUT/ner_train.txt" "$NER_SENTENCES" <<'PY'
import sys
from pathlib import Path
folder, target, conll, ner_target, n = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split()]
target.write_text("\n".join([lines[0]] + [lines[1 + i] for i in keep]) + "\n", encoding="utf-8")
# The first n sentences of the NER training file (its -DOCSTART- lines kept).
sentences = conll.read_text(encoding="utf-8").split("\n\n")
out, count = [], 0
for block in sentences:
    out.append(block)
    count += any(line and not line.startswith("-DOCSTART-") for line in block.splitlines())
    if count >= n:
        break
ner_target.write_text("\n\n".join(out).strip("\n") + "\n", encoding="utf-8")
PY

PRE=(--config tiny --preset "$PRESET" --max-steps "$STEPS" --max-seq-length 64 --batch-size 32 --precision bf16
     --eval-instances 500 --eval-every 0 --save-every "$STEPS" --seed 0 --progress false)
pretrain() {  # pretrain NAME ARGS...
    local name=$1; shift
    [ -f "$OUT/pre-$name/model/config.json" ] || bertkit pretrain --data "$OUT/wt2" --out "$OUT/pre-$name" "${PRE[@]}" "$@" \
        > "$OUT/pre-$name.log" 2>&1
}
pretrain mlm-nsp --objective bert
pretrain mlm --objective roberta-doc
pretrain ltr --objective causal --causal true

for row in $ROWS; do
    model=$OUT/pre-${row%-bilstm}/model
    extra=()
    [ "$row" = ltr-bilstm ] && extra=(--task-model bilstm)
    for task in $TASKS; do
        finetune_sweep "$task" "$OUT/ft/$task-$row" "$row" "$model" "${extra[@]}"
    done
done
runs=()
for row in $ROWS; do for task in $TASKS; do
    [ -f "$OUT/ft/$task-$row/card.json" ] && runs+=("$OUT/ft/$task-$row")
done; done
bertkit card "${runs[@]}" --out "$OUT/card"
