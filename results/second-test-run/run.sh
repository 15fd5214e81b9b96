#!/usr/bin/env bash
# The second test run (issue 68), reported beside the first, never instead of it: the same test episodes and
# commands as the first runs (results/self-study-test/run.sh, results/compare-smollm2-facts-test-questions), at the
# current code, now with each episode's scores and each question's record (compare keeps them), so that every share
# of keep-prompt's answers the README prints has a paired bootstrap interval (stats.paired_share_interval95); and the
# main job with kv-press among its methods (the seed-0 demo before it: results/demo-derived-queries).
#   bash scripts/env.sh bash results/second-test-run/run.sh
#   bash scripts/env.sh python results/second-test-run/summary.py
set -euo pipefail
out=results/second-test-run
# the main job as it was then (the invented-facts demo; `incontext demo` runs SQuAD now): the same command
incontext compare --model smollm2 --task facts --episodes 5 --seed 0 --set people=2 \
  --methods keep-prompt,drop-prompt,iclca-approx,dynamic-eval,distill-lora,kv-prefix,kv-press --out results/demo-facts
methods=(--methods keep-prompt,drop-prompt,distill-lora,kv-prefix --set distill-lora.progress=false
  --set kv-prefix.progress=false)
incontext compare --model smollm2 --task facts --episodes 12 --seed 1 --set people=2 "${methods[@]}" --out $out/facts
incontext compare --model smollm2 --task documents --episodes 12 --seed 1 "${methods[@]}" --out $out/documents
incontext compare --model smollm2 --task facts --episodes 5 --seed 0 --set people=2 --set questions=paraphrases:3 \
  "${methods[@]}" --set distill-lora.study.wording_ensemble=true --set kv-prefix.study.wording_ensemble=true \
  --out $out/facts-questions
