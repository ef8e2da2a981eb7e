#!/usr/bin/env bash
# Trains the CPU model family (target, then drafters d1, d2, d3) and exports each to models/cpu/<name>.
# Resumable: each model resumes from its checkpoints in $RUNS_DIR/<name>; a model already exported is
# skipped unless FORCE=1. Each gin file caps its run with max_minutes; run the script again to continue.
#   RUNS_DIR=runs bash scripts/train_family.sh [names...]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS_DIR=${RUNS_DIR:-runs}
OUT_DIR=${OUT_DIR:-models/cpu}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(target d1 d2 d3)
for name in "${names[@]}"; do
  if [ "$name" = target ]; then gin_file=train/cpu_target.gin; else gin_file=train/cpu_drafter_$name.gin; fi
  if [ -f "$OUT_DIR/$name/params.msgpack" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "== $name: already exported to $OUT_DIR/$name (FORCE=1 to retrain)"; continue
  fi
  echo "== $name: $gin_file -> $RUNS_DIR/$name, export $OUT_DIR/$name"
  python -m specdec.training.train --gin_file="$gin_file" --gin.MODEL_DIR="'$RUNS_DIR/$name'" \
    --gin.EXPORT_DIR="'$OUT_DIR/$name.partial'" 2>&1 | grep --line-buffered -v '^[IWE]0000\|^WARNING'
  # Only a run that reached its num_steps counts as exported.
  if python - "$OUT_DIR/$name.partial" "$gin_file" <<'PY'
import json, sys, gin
from specdec import gin_utils
path, gin_file = sys.argv[1], sys.argv[2]
gin_utils.parse([gin_file], ["MODEL_DIR = 'x'"])
want = gin.query_parameter('train_config.TrainConfig.num_steps')
got = json.load(open(f'{path}/config.json'))['train']['step']
print(f'{path}: step {got} of {want}')
sys.exit(0 if got >= want else 3)
PY
  then rm -rf "$OUT_DIR/$name"; mv "$OUT_DIR/$name.partial" "$OUT_DIR/$name"
  else echo "== $name: not finished; run again to resume"; fi
done
