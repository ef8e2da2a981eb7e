#!/usr/bin/env bash
# Derives the drafters of a target: its greedy decodes of pool inputs and of the training inputs, the bigram and
# trigram tables, the draft vocabulary and the feature head f128, then the family's evaluation. Defaults: the third
# CPU target (models/cpu_v3). Every step resumes or is skipped when its output is there, so run it again after a
# stop; the head's gin file caps its run with max_minutes (run again to continue it).
#   bash scripts/derive_family.sh                       # about 90 minutes on 2 cores
#   FAMILY=models/cpu_v3 CORPUS=data/corpus_v3 TAG=v3 HEAD_GIN=train/feature_head_f128_v3.gin bash scripts/derive_family.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FAMILY=${FAMILY:-models/cpu_v3}
CORPUS=${CORPUS:-data/corpus_v3}
TAG=${TAG:-v3}
HEAD_GIN=${HEAD_GIN:-train/feature_head_f128_v3.gin}
POOL_EXAMPLES=${POOL_EXAMPLES:-60000}      # En->De pool inputs the head imitates (about 55 a second here)
TRAIN_EXAMPLES=${TRAIN_EXAMPLES:-24000}    # training inputs per task the n-gram tables count
TARGET=$FAMILY/target
quiet() { "$@" 2>&1 | grep --line-buffered -v '^[IWE]0000\|^WARNING: All log'; }
[ -f "$TARGET/config.json" ] || { echo "no target at $TARGET" >&2; exit 2; }

echo "== pool inputs -> data/pool_$TAG"
[ -f "data/pool_$TAG/manifest.json" ] || quiet python scripts/build_distill_pool.py --out "data/pool_$TAG" --corpus "$CORPUS"
echo "== $TARGET's greedy decodes of $POOL_EXAMPLES pool inputs -> data/pool_greedy_$TAG"
quiet python scripts/build_distill_corpus.py --model "$TARGET" --corpus "data/pool_$TAG" --out "data/pool_greedy_$TAG" \
  --max_examples "$POOL_EXAMPLES" --tasks translate_en_de
echo "== draft vocabularies -> $FAMILY/draft_vocab"
[ -f "$FAMILY/draft_vocab/top1024.json" ] || quiet python scripts/draft_vocab.py --corpus "data/pool_greedy_$TAG" \
  --model "$TARGET" --tasks translate_en_de --k 1024 2048 --ids_dir "$FAMILY/draft_vocab" --out_dir "results/draft_vocab_$TAG"
echo "== $TARGET's greedy decodes of $TRAIN_EXAMPLES training inputs per task -> data/distill_greedy_$TAG"
quiet python scripts/build_distill_corpus.py --model "$TARGET" --corpus "$CORPUS" --out "data/distill_greedy_$TAG" \
  --max_examples "$TRAIN_EXAMPLES"
echo "== bigram and trigram -> $FAMILY"
[ -f "$FAMILY/trigram/config.json" ] || quiet python scripts/build_ngram_drafters.py --out "$FAMILY" --prior 1.0 \
  --corpus_dir "data/distill_greedy_$TAG" --top_k 8 --only bigram trigram
echo "== f128 ($HEAD_GIN) -> $FAMILY/f128"
quiet python -m specdec.training.feature_training --gin_file="$HEAD_GIN" --gin.MODEL_DIR="'runs/f128_$TAG'" \
  --gin.EXPORT_DIR="'$FAMILY/f128'"
echo "== the family's quality and acceptance -> results/models_$TAG"
quiet python scripts/evaluate_family.py --models "$FAMILY" --results "results/models_$TAG" --max_examples 64
