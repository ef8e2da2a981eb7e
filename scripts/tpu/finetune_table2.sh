#!/usr/bin/env bash
# Fine-tunes the eight models of the paper's Table 2 (T5 1.1 small/base/large drafters and the XXL target, each on
# WMT En-De and CNN/DM) on one Cloud TPU slice: eight launches of scripts/tpu/launch.py --entry=train, one per
# gin/train/table2/<size>_<task>.gin, each writing its checkpoints, logs and evaluations to <root>/<size>_<task>
# (its MODEL_DIR). The Table-2 decoding runs read them from there (reproduce_table2_tpu.sh --checkpoints=<root>).
#
#   bash scripts/tpu/finetune_table2.sh gs://BUCKET/finetune --tpu_name=NAME --zone=ZONE \
#     [--project=P] [--env=TFDS_DATA_DIR=gs://BUCKET/tfds] [--only=small_ende,xxl_ende] [--delete_after] \
#     [--dry_run] [launch.py flags]
#
# The slice defaults to a v4-128, where every run fits with the mesh its gin file sets (results/xxl_training_plan.md:
# memory per chip, and the chip-hours of each run); pass --accelerator_type to change it. Smallest models first, so
# that a problem shows up within minutes, not after the XXL runs. --only=NAME,... runs a subset (e.g. to relaunch
# one that failed: the trainer resumes from its last checkpoint).
#
# As reproduce_table2_tpu.sh: the first launch creates (or reuses) the TPU and installs the package, the others reuse
# both; every other flag goes to every launch, except --delete_after, which only the last launch gets (it deletes
# the TPU even if that run fails). A failed run does not stop the others; the script lists the failures and exits 1.
# Interrupting it leaves the TPU running: delete it yourself.
set -euo pipefail

root=${1:-}
case "$root" in
  gs://*) shift ;;
  *) echo "usage: $0 gs://BUCKET/PATH --tpu_name=NAME --zone=ZONE [--only=NAME,...] [launch.py flags]" >&2; exit 2 ;;
esac
root=${root%/}
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}

all=()
for size in small base large xxl; do
  for task in ende cnndm; do all+=("${size}_${task}"); done
done

pass=()
delete_after=()
only=""
for arg in "$@"; do
  case "$arg" in
    --delete_after) delete_after=(--delete_after) ;;
    --only=*) only=${arg#--only=} ;;
    *) pass+=("$arg") ;;
  esac
done

names=()
if [ -z "$only" ]; then
  names=("${all[@]}")
else
  IFS=, read -r -a wanted <<< "$only"
  for name in "${wanted[@]}"; do
    case " ${all[*]} " in
      *" $name "*) names+=("$name") ;;
      *) echo "--only: unknown run '$name'; the runs: ${all[*]}" >&2; exit 2 ;;
    esac
  done
fi

failed=()
last=$((${#names[@]} - 1))
for i in "${!names[@]}"; do
  name=${names[$i]}
  extra=()
  if [ "$i" -gt 0 ]; then extra+=(--skip_create --skip_install); fi
  if [ "$i" -eq "$last" ]; then extra+=(${delete_after[@]+"${delete_after[@]}"}); fi
  echo "== $name -> $root/$name" >&2
  # The default slice comes first: a later --accelerator_type among the flags wins.
  if ! "$PYTHON" "$here/launch.py" --entry=train --accelerator_type=v4-128 \
      --gin_file="train/table2/$name.gin" --output_dir="$root/$name" \
      ${pass[@]+"${pass[@]}"} ${extra[@]+"${extra[@]}"}; then
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]}" >&2
  exit 1
fi
