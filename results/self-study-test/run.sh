#!/usr/bin/env bash
# Issue 62's one test run, the document alone, after the choice on validation (results/self-study-validation):
# keep-prompt, drop-prompt, distill-lora, kv-prefix at its new default (the chosen synthesis) and kv-prefix with the
# data stage it had before (recall windows and two continuations: `kv-prefix:windows`), each at p = M/4, on fresh
# test episodes of `facts`, `documents` and `continuation` (--seed 1: episodes never run before); then the chat check
# (absorb -> generate --chat on the test split's chat questions), the demo at the new default and the absorb cost of a
# 160-token document.
#   bash scripts/env.sh bash results/self-study-test/run.sh
set -euo pipefail
out=results/self-study-test
methods=(--methods keep-prompt,drop-prompt,distill-lora,kv-prefix,kv-prefix:windows
  --set kv-prefix:windows.study.derived=0 --set kv-prefix:windows.study.grounded=false
  --set distill-lora.progress=false --set kv-prefix.progress=false --set kv-prefix:windows.progress=false)
incontext compare --model smollm2 --task facts --episodes 12 --seed 1 --set people=2 "${methods[@]}" --out $out/facts
incontext compare --model smollm2 --task documents --episodes 12 --seed 1 "${methods[@]}" --out $out/documents
incontext compare --model smollm2 --task continuation --episodes 5 --seed 1 "${methods[@]}" --out $out/continuation
# the main job then (the invented-facts demo, before kv-press joined it; results/demo-facts holds the later run)
incontext compare --model smollm2 --task facts --episodes 5 --seed 0 --set people=2 \
  --methods keep-prompt,drop-prompt,iclca-approx,dynamic-eval,distill-lora,kv-prefix --out results/demo-facts
python benchmarks/distill_lora_facts.py --split test --seed 1 --episodes 5 --method kv-prefix --config teacher \
  --config s29-test-kv-prefix
python benchmarks/distill_lora_facts.py --split test --seed 1 --episodes 5 --method distill-lora --config s29-test-distill-lora
python benchmarks/absorb_cost.py --people 2 --repeats 2 --methods kv-prefix,kv-prefix:windows,distill-lora \
  --set kv-prefix:windows.study.derived=0 --set kv-prefix:windows.study.grounded=false \
  --out benchmarks/results/absorb_cost_self_study_cpu
