#!/usr/bin/env bash
# The GPU check suite in one call: correctness of every fast path on the device, bertkit against transformers
# speed, multi-GPU when present. Results in $OUT (default ./gpu-results): correctness.json, speed.json,
# environment.json, report.md. Exit status 1 when a correctness check failed.
#
#   bash bench/gpu/run.sh                         # on a GPU machine: the whole suite, under 8 minutes
#   bash bench/gpu/run.sh --device cpu --quick    # the dry run: same code and files, tiny shapes, < 1 minute
#   bash bench/gpu/run.sh --only unpad family_    # items whose name starts with these; --help for the rest
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
# The suite imports bench.* from the repository root and bertkit from src/ when it is not installed.
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OUT="${OUT:-$ROOT/gpu-results}"

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "run.sh: $PYTHON cannot import torch; install it first (pip install torch: the CUDA build on Linux)" >&2
    exit 2
fi
missing="$("$PYTHON" - <<'PY'
import importlib.util
print(" ".join(m for m in ("numpy", "safetensors", "tokenizers", "transformers", "tqdm", "yaml")
               if importlib.util.find_spec(m) is None))
PY
)"
if [ -n "$missing" ]; then
    echo "run.sh: not importable: $missing (pip install -e '.[test]'); the checks that need them will fail or skip" >&2
fi

# A hard stop, so one call never outlives a lent machine: SIGINT at BERTKIT_SUITE_TIMEOUT seconds (default 470;
# 0 = none) makes the suite write what it measured and exit; the budget of the speed rows (--budget-s, 420 s on
# a GPU) normally ends the run before that.
LIMIT="${BERTKIT_SUITE_TIMEOUT:-470}"
if [ "$LIMIT" != "0" ] && command -v timeout >/dev/null 2>&1; then
    exec timeout --signal=INT --kill-after=20 "$LIMIT" "$PYTHON" -m bench.gpu.suite "$@"
fi
exec "$PYTHON" -m bench.gpu.suite "$@"
