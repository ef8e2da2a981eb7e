#!/usr/bin/env bash
# γ = 1…10 for each drafter (greedy, En→De, batch 1): measured speedup with the Thm 3.8 curve over it, and the
# best γ. Resumable: finished runs are kept, an interrupted one resumes. Writes results/ablate_gamma/.
#   bash scripts/ablate_gamma.sh [extra scripts/ablate.py flags, e.g. --max_examples 64]
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/ablate.py gamma --drafters d1kd d2 bigram --gammas 1 2 3 4 5 6 7 8 9 10 \
  --task ende --temperatures 0 --max_examples 32 --repeats 1 --out results/ablate_gamma "$@"
