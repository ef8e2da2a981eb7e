#!/usr/bin/env bash
# The CPU Table-2 analogue: every row in gin/experiments/cpu/table2/ (2 tasks × drafters d3, d2, d1 standing in
# for T5-small/base/large × temperature 0 and 1) and table2_distilled/ (the distilled d1kd), each a benchmark of
# baseline vs speculative decoding in one run, then one table beside the paper's numbers:
# results/table2_cpu/table2.md (+ .json, .png).
# Resumable: a finished row (benchmark.json present) is skipped, an interrupted one resumes per example.
#   bash scripts/reproduce_table2.sh [MAX_EXAMPLES (default 32)] [extra --gin.NAME=VALUE flags for every row]
# The TPU version (T5-XXL): scripts/tpu/reproduce_table2_tpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_EXAMPLES="${1:-32}"
shift || true
OUT=results/table2_cpu
mkdir -p "$OUT/rows"
for gin_file in gin/experiments/cpu/table2/*.gin gin/experiments/cpu/table2_distilled/*.gin; do
  name="$(basename "$gin_file" .gin)"
  if [[ -f "$OUT/rows/$name/benchmark.json" ]]; then
    echo "== $name: done earlier, kept"
    continue
  fi
  echo "== $name"
  python -m specdec.main --gin_file="$gin_file" --gin.OUTPUT_DIR="'$OUT/rows/$name'" \
    --gin.main.run.max_examples="$MAX_EXAMPLES" "$@"
done
python scripts/make_table2.py --rows "$OUT/rows" --out "$OUT" \
  --command "bash scripts/reproduce_table2.sh $MAX_EXAMPLES $*"
