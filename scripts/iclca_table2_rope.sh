#!/usr/bin/env bash
# Issue 76 item 3: ICLCA Table 2 in the paper's form at the largest size that fits here: RoPE (the paper's positions;
# the default recipe has learned positions), N_LAYER layers (default 2, the recipe's depth; the paper 12), width 128,
# the default recipe otherwise (Taylor features, 8,000 steps at lr 3e-3), over 5 seeds, two runs at a time (one
# thread each); then scripts/iclca_table2_rope_summary.py writes results/iclca-table2-rope/runs.md (the success rate:
# runs at or above 95% with the prompt).
#   bash scripts/env.sh bash scripts/iclca_table2_rope.sh              # about an hour on 2 cores (8,000 steps of 2
#       layers take about 20 minutes a run at one thread; three rounds of two)
#   N_LAYER=4 bash scripts/env.sh bash scripts/iclca_table2_rope.sh    # 4 layers: about 45 minutes a run, 2.5 hours
set -euo pipefail
out=results/iclca-table2-rope
layers=${N_LAYER:-2}
mkdir -p "$out"
run() { OMP_NUM_THREADS=1 incontext run iclca-table2 --set positions=rope --set n_layer="$layers" --set seed="$1" \
          --out "$out/seed$1" > "$out/seed$1.log" 2>&1; }
for pair in "0 1" "2 3" "4"; do
  for seed in $pair; do run "$seed" & done
  wait
done
python scripts/iclca_table2_rope_summary.py
