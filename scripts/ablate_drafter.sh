#!/usr/bin/env bash
# Drafters side by side (unigram, bigram, the neural drafters incl. the distilled d1kd) on both tasks, greedy and temperature 1, γ = 4:
# α, c, speedup, and the Table 3 analogue. Resumable. Writes results/ablate_drafter/.
#   bash scripts/ablate_drafter.sh [extra scripts/ablate.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/ablate.py drafter --drafters unigram bigram d3 d2 d1 d1kd --tasks ende summ --temperatures 0 1 \
  --gamma 4 --max_examples 32 --repeats 1 --out results/ablate_drafter "$@"
