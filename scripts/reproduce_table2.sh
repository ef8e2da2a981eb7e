#!/usr/bin/env bash
# The CPU Table-2 analogue: every row in gin/experiments/cpu/table2/ (2 tasks × drafters d3, d2, d1 standing in
# for T5-small/base/large × temperature 0 and 1) and table2_distilled/ (the distilled d1kd), each a benchmark of
# baseline vs speculative decoding in one run, at every batch size in BATCH_SIZES (default "1 8"), then one
# table beside the paper's numbers: results/table2_cpu/table2.md (+ .json, .png). Batch 1 rows go to
# results/table2_cpu/rows/, batch B rows to results/table2_cpu/rows_bB/.
# Resumable: a finished row (benchmark.json present) is skipped, an interrupted one resumes per example.
#   [BATCH_SIZES="1 8"] bash scripts/reproduce_table2.sh [MAX_EXAMPLES (default 32)] [extra --gin.NAME=VALUE flags for every row]
# The TPU version (T5-XXL): scripts/tpu/reproduce_table2_tpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_EXAMPLES="${1:-32}"
shift || true
BATCH_SIZES="${BATCH_SIZES:-1 8}"
OUT=results/table2_cpu
ROW_DIRS=()
for batch in $BATCH_SIZES; do
  rows="$OUT/rows"
  [[ "$batch" == 1 ]] || rows="$OUT/rows_b$batch"
  ROW_DIRS+=("$rows")
  mkdir -p "$rows"
  for gin_file in gin/experiments/cpu/table2/*.gin gin/experiments/cpu/table2_distilled/*.gin; do
    name="$(basename "$gin_file" .gin)"
    if [[ -f "$rows/$name/benchmark.json" ]]; then
      echo "== $name (batch $batch): done earlier, kept"
      continue
    fi
    echo "== $name (batch $batch)"
    python -m specdec.main --gin_file="$gin_file" --gin.OUTPUT_DIR="'$rows/$name'" \
      --gin.run_config.DataConfig.max_examples="$MAX_EXAMPLES" --gin.settings.Setting.batch_size="$batch" "$@"
  done
done
python scripts/make_table2.py --rows "${ROW_DIRS[@]}" --out "$OUT" \
  --command "BATCH_SIZES=\"$BATCH_SIZES\" bash scripts/reproduce_table2.sh $MAX_EXAMPLES $*"
