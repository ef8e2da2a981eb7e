#!/usr/bin/env bash
# Runs the paper's Table 2 (T5-XXL target; T5 1.1 small/base/large drafters; WMT En-De and CNN/DM;
# temperature 0 and 1) on one Cloud TPU slice: twelve launches of scripts/tpu/launch.py, one per
# gin/experiments/table2/xxl_{ende,cnndm}_{small,base,large}_t{0,1}.gin, each writing to <root>/<name>.
#
#   bash scripts/tpu/reproduce_table2_tpu.sh gs://BUCKET/table2 --tpu_name=NAME --zone=ZONE \
#     [--project=P] [--env=TFDS_DATA_DIR=gs://BUCKET/tfds] [--delete_after] [--dry_run] [launch.py flags]
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
PYTHON=${PYTHON:-python}

pass=()
delete_after=()
for arg in "$@"; do
  if [ "$arg" = --delete_after ]; then delete_after=(--delete_after); else pass+=("$arg"); fi
done

names=()
for task in ende cnndm; do
  for size in small base large; do
    for t in 0 1; do names+=("xxl_${task}_${size}_t${t}"); done
  done
done

failed=()
last=$((${#names[@]} - 1))
for i in "${!names[@]}"; do
  name=${names[$i]}
  extra=()
  if [ "$i" -gt 0 ]; then extra+=(--skip_create --skip_install); fi
  if [ "$i" -eq "$last" ]; then extra+=(${delete_after[@]+"${delete_after[@]}"}); fi
  echo "== $name -> $root/$name" >&2
  if ! "$PYTHON" "$here/launch.py" --gin_file="experiments/table2/$name.gin" \
      --output_dir="$root/$name" ${pass[@]+"${pass[@]}"} ${extra[@]+"${extra[@]}"}; then
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]}" >&2
  exit 1
fi
