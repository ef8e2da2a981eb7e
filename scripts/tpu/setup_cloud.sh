#!/usr/bin/env bash
# One-time Google Cloud setup for the Table-2 reproduction: the project, the TPU API, a bucket the TPU VMs can
# write, and the TFDS data of both tasks in that bucket.
#
#   bash scripts/tpu/setup_cloud.sh --project=PROJECT_ID --bucket=gs://BUCKET [--region=us-central2] \
#     [--create_project --billing_account=ACCOUNT_ID] [--skip_data] [--dry_run]
#
# Steps, in order (each one command; --dry_run prints them, one per line, and runs nothing):
#   1. with --create_project: create the project and link it to the billing account;
#   2. make it gcloud's default project, enable the Cloud TPU API and create the TPU service agent;
#   3. create the bucket in the TPU's region (an existing one is kept) and let the TPU VMs' service account (the
#      project's Compute Engine default one, PROJECT_NUMBER-compute@developer.gserviceaccount.com) write it;
#   4. unless --skip_data: build the TFDS data of both tasks into gs://BUCKET/tfds with `tfds build` (package
#      tensorflow-datasets) on this machine (CPU and network work, cheaper here than on a TPU VM), then list the
#      versions built: they must be the ones specdec/tasks.py pins (wmt_t2t_translate/de-en 1.0.0, cnn_dailymail
#      3.4.0), and the script fails if one is missing.
# TPU quota is requested in the Cloud console, not here (docs/cloud_tpu.md). Run it after `gcloud auth login`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"

project=""
bucket=""
region=us-central2
create_project=""
billing_account=""
skip_data=""
dry_run=""
for arg in "$@"; do
  case "$arg" in
    --project=*) project=${arg#--project=} ;;
    --bucket=*) bucket=${arg#--bucket=}; bucket=${bucket%/} ;;
    --region=*) region=${arg#--region=} ;;
    --create_project) create_project=1 ;;
    --billing_account=*) billing_account=${arg#--billing_account=} ;;
    --skip_data) skip_data=1 ;;
    --dry_run) dry_run=1 ;;
    *) echo "unknown flag: $arg" >&2; exit 2 ;;
  esac
done
usage="usage: $0 --project=PROJECT_ID --bucket=gs://BUCKET [--region=R]"
usage+=" [--create_project --billing_account=ID] [--skip_data] [--dry_run]"
if [ -z "$project" ]; then echo "--project is required; $usage" >&2; exit 2; fi
case "$bucket" in
  gs://?*) ;;
  *) echo "--bucket must be gs://NAME; $usage" >&2; exit 2 ;;
esac
if [ -n "$create_project" ] && [ -z "$billing_account" ]; then
  echo "--create_project needs --billing_account (TPUs need billing)" >&2; exit 2
fi
if [ -z "$dry_run" ] && ! command -v gcloud > /dev/null; then
  echo "gcloud not found on PATH: install the Google Cloud CLI and run gcloud auth login (or use --dry_run)." >&2
  exit 2
fi
if [ -z "$dry_run" ] && [ -z "$skip_data" ] && ! command -v tfds > /dev/null; then
  echo "tfds not found on PATH: install the package tensorflow-datasets (or use --skip_data)." >&2
  exit 2
fi

# 1-2. The project and the TPU API.
if [ -n "$create_project" ]; then
  run gcloud projects create "$project"
  run gcloud billing projects link "$project" --billing-account="$billing_account"
fi
run gcloud config set project "$project"
run gcloud services enable tpu.googleapis.com --project="$project"
run gcloud beta services identity create --service=tpu.googleapis.com --project="$project"

# 3. The bucket, writable by the TPU VMs.
if [ -n "$dry_run" ] || ! gcloud storage buckets describe "$bucket" --project="$project" > /dev/null 2>&1; then
  run gcloud storage buckets create "$bucket" --location="$region" --project="$project"
fi
number=PROJECT_NUMBER
if [ -z "$dry_run" ]; then
  number=$(gcloud projects describe "$project" --format='value(projectNumber)')
fi
run gcloud storage buckets add-iam-policy-binding "$bucket" \
  --member="serviceAccount:$number-compute@developer.gserviceaccount.com" --role=roles/storage.objectAdmin

# 4. The TFDS data, and the versions built.
if [ -z "$skip_data" ]; then
  run tfds build wmt_t2t_translate/de-en --data_dir="$bucket/tfds"
  run tfds build cnn_dailymail --data_dir="$bucket/tfds"
  if ! run gcloud storage ls "$bucket/tfds/wmt_t2t_translate/de-en/1.0.0/" "$bucket/tfds/cnn_dailymail/3.4.0/"; then
    echo "The TFDS versions specdec/tasks.py pins are missing under $bucket/tfds: build them with a" \
      "tensorflow-datasets release that has them." >&2
    exit 1
  fi
fi
