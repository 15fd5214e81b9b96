#!/usr/bin/env bash
# Issue 69's check that the move changed no result: the main job at the moved code (commit 110c341), against
# results/demo-facts (then results/demo), run before the move (commit 78a49bf). Scores, agreement, kept bytes, steps, per-episode scores and
# per-question records must be identical (tests/docs/test_docs.py reads both); timings differ (this run had the two
# cores alone, results/demo shared them with edits).
#   bash scripts/env.sh bash results/demo-after-move/run.sh
set -euo pipefail
# the main job as it was then (`incontext demo` runs SQuAD now): the same command
incontext compare --model smollm2 --task facts --episodes 5 --seed 0 --set people=2 \
  --methods keep-prompt,drop-prompt,iclca-approx,dynamic-eval,distill-lora,kv-prefix,kv-press --out results/demo-after-move
