#!/usr/bin/env bash
# Issue 62's validation sweep: today's kv-prefix data stage against five other syntheses and the tail-bucket
# objective, the document alone, on the same validation episodes of `facts` and `documents` (4 each).
#   bash scripts/env.sh bash results/self-study-validation/run.sh
set -euo pipefail
variants=(--methods keep-prompt,drop-prompt,kv-prefix,kv-prefix:tail,kv-prefix:derived,kv-prefix:derived-grounded,kv-prefix:self-study,kv-prefix:questions-grounded
  --set kv-prefix:tail.tail=true
  --set kv-prefix:derived.study.derived=16
  --set kv-prefix:derived-grounded.study.derived=16 --set kv-prefix:derived-grounded.study.grounded=true
  --set kv-prefix:self-study.study.n_conversations=10
  --set kv-prefix:questions-grounded.study.n_questions=8 --set kv-prefix:questions-grounded.study.grounded=true)
incontext compare --model smollm2 --task facts --split validation --episodes 4 --set people=2 "${variants[@]}" \
  --out results/self-study-validation/facts
incontext compare --model smollm2 --task documents --split validation --episodes 4 "${variants[@]}" \
  --out results/self-study-validation/documents
