#!/usr/bin/env bash
# Issue 67's one test run, after the choice on validation (run.sh, curve-validation.md): fresh test episodes
# (--seed 100: never run before), the target budgets (25% and 10% of the document's K/V), the presses on `facts`,
# `documents` and the long documents, and kv-prefix at the start chosen on validation beside KVzip on the same
# episodes; then the one table (curve-test.md).
#   bash scripts/env.sh bash results/press-curve/test.sh
set -euo pipefail
export SPLIT=test SEED=100 RATIOS="0.25 0.1"
LONG_EPISODES=1 bash results/press-curve/run.sh presses
STARTS=${CHOSEN_START:-press} TRAINED_EPISODES=2 bash results/press-curve/run.sh trained
python results/press-curve/summary.py --split test
