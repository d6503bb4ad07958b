#!/usr/bin/env bash
# The BERT family's pretraining objectives side by side on WikiText-2, on CPU, with one time budget each: BERT
# (MLM + NSP), RoBERTa (MLM, FULL-SENTENCES, byte-level BPE), ALBERT (MLM + SOP, factorised embeddings, one
# shared layer), ELECTRA (generator MLM + replaced-token detection) and a causal (GPT-style) LM, each with its
# built-in recipe at the same size (PRESET, mini: L4 H256 A4), length 128 and batch 32. Prints a markdown table:
# parameters, steps, real tokens/s, first and last training loss, held-out accuracy before and after.
#
#   bash bench/experiments/objectives.sh               # MINUTES=4 per run, DATA=../shared/data OUT=runs/objectives
#   MINUTES=0.3 bash bench/experiments/objectives.sh                         # a smoke run of a few steps each
#   RUNS="bert electra" bash bench/experiments/objectives.sh                # some of the runs only
#
# Training text is wiki.test.raw, the held-out text wiki.valid.raw. Two vocabularies of the same size (VOCAB,
# 8192) are trained on the training text: WordPiece for BERT, ALBERT and ELECTRA (as in their papers), byte-level
# BPE for RoBERTa and the causal LM (as RoBERTa and GPT-2), so the causal run differs from the RoBERTa run only by
# its attention mask and objective. Each vocabulary's corpus is prepared once (a re-run reuses the shards).
# The time budget counts from the start of training and includes the held-out evaluation before the first step
# (EVAL_INSTANCES instances); the evaluation at the end comes after it.
set -euo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/objectives}
MINUTES=${MINUTES:-4}
PRESET=${PRESET:-mini}
VOCAB=${VOCAB:-8192}
# Held-out instances: 1,000 (as the README's figures), 100 for budgets under 2 minutes (smoke runs).
EVAL_INSTANCES=${EVAL_INSTANCES:-$(python -c "print(1000 if float('$MINUTES') >= 2 else 100)")}
RUNS=${RUNS:-bert roberta albert electra causal}
SEED=${SEED:-0}
WIKI=$DATA/wikitext-2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUDGET=$(python -c "print(round(float('$MINUTES') * 60, 1))")
mkdir -p "$OUT"

for kind in wordpiece bpe; do
    bertkit tokenizer train --kind "$kind" --files "$WIKI/wiki.test.raw" --vocab-size "$VOCAB" \
        --out "$OUT/tok-$kind" --quiet
    bertkit prepare --corpus "$WIKI/wiki.test.raw" --eval-corpus "$WIKI/wiki.valid.raw" --tokenizer "$OUT/tok-$kind" \
        --tokenizer-kind "$kind" --out "$OUT/data-$kind" --quiet > "$OUT/prepare-$kind.json"
done

# run NAME VOCABULARY RECIPE [overrides...]: a fresh run directory, the same budget and logging for every run
# (one metrics line per step; no evaluation or checkpoint inside the budget but the one before the first step).
run() {
    local name=$1 kind=$2 recipe=$3
    shift 3
    rm -rf "$OUT/run-$name"
    echo "== $name: --config $recipe $* on the $kind shards, $BUDGET s" >&2
    if ! bertkit pretrain --data "$OUT/data-$kind" --out "$OUT/run-$name" --config "$recipe" --preset "$PRESET" \
        --max-time "$BUDGET" --seed "$SEED" --log-every 1 --eval-every 0 --save-every 1000000 \
        --eval-instances "$EVAL_INSTANCES" --progress false "$@" > "$OUT/run-$name.log" 2>&1; then
        # A process can die in interpreter shutdown after finishing; its results are what the table needs.
        [ -f "$OUT/run-$name/result.json" ] || { cat "$OUT/run-$name.log" >&2; echo "$name failed" >&2; exit 1; }
        echo "note: $name exited abnormally after writing result.json (see $OUT/run-$name.log)" >&2
    fi
    grep '^{' "$OUT/run-$name.log" | tail -n 1 >&2
}

for name in $RUNS; do
    case $name in
        bert) run bert wordpiece mini ;;
        roberta) run roberta bpe roberta-mini ;;
        albert) run albert wordpiece albert-mini ;;
        electra) run electra wordpiece electra-mini ;;
        # RoBERTa's architecture, data and optimiser with a causal mask: saved as RobertaForCausalLM.
        causal) run causal bpe roberta-mini --objective causal --causal true ;;
        *) echo "unknown run $name (bert, roberta, albert, electra, causal)" >&2; exit 2 ;;
    esac
done

# shellcheck disable=SC2086  # RUNS is a list of names
python "$HERE/objectives_table.py" "$OUT" $RUNS
