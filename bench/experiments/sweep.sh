# Sourced by bert_ablations.sh and bert_sizes.sh: one `bertkit finetune --seeds` sweep per (task, model), with the
# shared recipe (SEEDS, EPOCHS, LR; batch 32, length 64) and the tasks' files under OUT, GLUE and DATA.
#
#   finetune_sweep TASK RUN NAME MODEL [EXTRA ...]     TASK: sst2 (OUT/sst2_subset8000.tsv), cola (in-domain), ner
#                                                      (OUT/ner_train.txt); a RUN with a card.json is kept
finetune_sweep() {
    local task=$1 run=$2 name=$3 model=$4
    shift 4
    [ -f "$run/card.json" ] && return 0
    local common=(--model "$model" --out "$run" --seeds "$SEEDS" --name "$name" --epochs "$EPOCHS" --lr "$LR"
                  --batch-size 32 --max-seq-length 64 --quiet "$@")
    case $task in
        sst2) bertkit finetune glue --task sst2 --train "$OUT/sst2_subset8000.tsv" --dev "$GLUE/SST-2/dev.tsv" "${common[@]}" ;;
        cola) bertkit finetune glue --task cola --train "$GLUE/CoLA/in_domain_train.tsv" \
                  --dev "$GLUE/CoLA/in_domain_dev.tsv" "${common[@]}" ;;
        ner) bertkit finetune ner --train "$OUT/ner_train.txt" --dev "$DATA/conll2003/valid.txt" "${common[@]}" ;;
        *) echo "unknown task $task (sst2, cola or ner)"; false ;;
    esac > "$run.log" 2>&1 || echo "$(basename "$0"): $task $name failed, see $run.log" >&2
}
