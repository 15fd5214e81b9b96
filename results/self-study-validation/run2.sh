#!/usr/bin/env bash
# Issue 62's validation sweep, second part: the two leading syntheses of run.sh (derived, derived-grounded), the tail
# bucket on top of derived, and today's kv-prefix on 4 more validation episodes (--seed 4: seeds 10004-10007) of both
# tasks; then, on run.sh's episodes (--seed 0), the tail-bucket row that failed there (documents) and the writer
# option: Gemma-3-270M writes the grounded questions that SmolLM2 answers with the document in context.
#   bash scripts/env.sh bash results/self-study-validation/run2.sh
set -euo pipefail
out=results/self-study-validation
variants=(--methods keep-prompt,kv-prefix,kv-prefix:derived,kv-prefix:derived-grounded,kv-prefix:derived-tail
  --set kv-prefix:derived.study.derived=16
  --set kv-prefix:derived-grounded.study.derived=16 --set kv-prefix:derived-grounded.study.grounded=true
  --set kv-prefix:derived-tail.study.derived=16 --set kv-prefix:derived-tail.tail=true)
incontext compare --model smollm2 --task facts --split validation --seed 4 --episodes 4 --set people=2 "${variants[@]}" \
  --out $out/facts-seed4
incontext compare --model smollm2 --task documents --split validation --seed 4 --episodes 4 "${variants[@]}" \
  --out $out/documents-seed4
incontext compare --model smollm2 --task documents --split validation --episodes 4 --methods kv-prefix:tail \
  --set kv-prefix:tail.tail=true --out $out/documents-tail
writer=(--writer gemma3-270m --methods kv-prefix:gemma-questions-grounded
  --set kv-prefix:gemma-questions-grounded.study.n_questions=8 --set kv-prefix:gemma-questions-grounded.study.grounded=true)
incontext compare --model smollm2 --task facts --split validation --episodes 4 --set people=2 "${writer[@]}" \
  --out $out/facts-gemma
incontext compare --model smollm2 --task documents --split validation --episodes 4 "${writer[@]}" --out $out/documents-gemma
