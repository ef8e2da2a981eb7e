#!/usr/bin/env bash
# Runs the paper's Table 2 (T5-XXL target; T5 1.1 small/base/large drafters; WMT En-De and CNN/DM;
# temperature 0 and 1) on one Cloud TPU slice: twelve launches of scripts/tpu/launch.py, one per
# gin/experiments/table2/xxl_{ende,cnndm}_{small,base,large}_t{0,1}.gin, each writing to <root>/<name>.
#
#   bash scripts/tpu/reproduce_table2_tpu.sh gs://BUCKET/table2 --tpu_name=NAME --zone=ZONE \
#     [--project=P] [--env=TFDS_DATA_DIR=gs://BUCKET/tfds] [--checkpoints=gs://BUCKET/finetune] \
#     [--table=results/table2_tpu] [--delete_after] [--dry_run] [launch.py flags]
#
# --checkpoints=<finetune root>: decode with the models finetune_table2.sh fine-tuned there, through the gin files'
# macros: TARGET_CHECKPOINT=<root>/xxl_<task>/checkpoints and DRAFTER_CHECKPOINT=<root>/<size>_<task>/checkpoints
# (a trainer's checkpoint directory: its latest step). Without it the gin files' public pre-trained checkpoints
# are used (they say so).
# --table=DIR: afterwards copy the rows down to DIR/rows and write the table beside the paper's numbers
# (scripts/make_table2.py: DIR/table2.md, .json, .png). With --dry_run both are printed, not run.
#
# The first launch creates (or reuses) the TPU and installs the package; the others reuse both.
# Every other flag goes to every launch, except --delete_after, which only the last launch gets (it
# deletes the TPU even if that experiment fails). A failed experiment does not stop the others; the
# script lists the failures and exits 1. Interrupting it leaves the TPU running: delete it yourself.
set -euo pipefail

root=${1:-}
case "$root" in
  gs://*) shift ;;
  *) echo "usage: $0 gs://BUCKET/PATH --tpu_name=NAME --zone=ZONE [launch.py flags]" >&2; exit 2 ;;
esac
root=${root%/}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
PYTHON=${PYTHON:-python}

pass=()
delete_after=()
checkpoints=""
table=""
dry_run=""
for arg in "$@"; do
  case "$arg" in
    --delete_after) delete_after=(--delete_after) ;;
    --checkpoints=*) checkpoints=${arg#--checkpoints=}; checkpoints=${checkpoints%/} ;;
    --table=*) table=${arg#--table=}; table=${table%/} ;;
    *) if [ "$arg" = --dry_run ]; then dry_run=1; fi; pass+=("$arg") ;;
  esac
done
case "$checkpoints" in
  ""|gs://*) ;;
  *) echo "--checkpoints=$checkpoints: must be the gs:// root finetune_table2.sh wrote to" >&2; exit 2 ;;
esac

names=()
for task in ende cnndm; do
  for size in small base large; do
    for t in 0 1; do names+=("xxl_${task}_${size}_t${t}"); done
  done
done

# The fine-tuned checkpoints of one experiment, as gin bindings (none without --checkpoints).
checkpoint_bindings() {
  local task size
  IFS=_ read -r _ task size _ <<< "$1"  # xxl_<task>_<size>_t<temperature>
  if [ -n "$checkpoints" ]; then
    echo "--gin=TARGET_CHECKPOINT='$checkpoints/xxl_$task/checkpoints'"
    echo "--gin=DRAFTER_CHECKPOINT='$checkpoints/${size}_$task/checkpoints'"
  fi
}

failed=()
last=$((${#names[@]} - 1))
for i in "${!names[@]}"; do
  name=${names[$i]}
  extra=()
  if [ "$i" -gt 0 ]; then extra+=(--skip_create --skip_install); fi
  if [ "$i" -eq "$last" ]; then extra+=(${delete_after[@]+"${delete_after[@]}"}); fi
  while IFS= read -r binding; do [ -n "$binding" ] && extra+=("$binding"); done < <(checkpoint_bindings "$name")
  echo "== $name -> $root/$name" >&2
  if ! "$PYTHON" "$here/launch.py" --gin_file="experiments/table2/$name.gin" \
      --output_dir="$root/$name" ${pass[@]+"${pass[@]}"} ${extra[@]+"${extra[@]}"}; then
    failed+=("$name")
  fi
done

# The table beside the paper's: copy the twelve rows down, then scripts/make_table2.py (from the repository root).
if [ -n "$table" ]; then
  recorded=()  # the command that made the table, as the table records it
  for arg in "$@"; do [ "$arg" = --dry_run ] || recorded+=("$arg"); done
  collect=(mkdir -p "$table/rows")
  copy=(gcloud storage cp -r "$root/*" "$table/rows/")
  make=("$PYTHON" scripts/make_table2.py --rows "$table/rows" --out "$table"
        "--title=Table 2 on Cloud TPU (T5-XXL target, batch 1)"
        "--command=$(show bash scripts/tpu/reproduce_table2_tpu.sh "$root" ${recorded[@]+"${recorded[@]}"})")
  if [ -z "$dry_run" ] && [ ! -f scripts/make_table2.py ]; then
    echo "--table: run this script from the repository root (scripts/make_table2.py makes the table)" >&2
    failed+=("table")
  else
    [ -n "$dry_run" ] || echo "== the table -> $table/table2.md" >&2
    { run "${collect[@]}" && run "${copy[@]}" && run "${make[@]}"; } || failed+=("table")
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]}" >&2
  exit 1
fi
