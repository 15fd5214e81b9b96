#!/usr/bin/env bash
# The field's benchmarks (issue 75): SQuAD v2.0 dev paragraphs, RULER and HotpotQA on the two shipped models, the
# document alone as the chat template's system turn. One compare per (model, task, budget) into runs/field-SPLIT/
# (scratch); summary.py writes the one table and curve per task and model here (field-SPLIT.{md,json}, curve-*.png).
#   bash scripts/env.sh bash results/field-benchmarks/run.sh references   # validation: what each model reads (F1, RULER)
#   bash scripts/env.sh bash results/field-benchmarks/run.sh wording      # validation: the squad question's wording
#   bash scripts/env.sh bash results/field-benchmarks/test.sh             # the test split, once (the phases below)
#   bash scripts/env.sh python results/field-benchmarks/summary.py --split validation|test
# Phases presses, ruler-presses, hotpotqa-presses (kvpress's presses at each kept share) and methods (the demo's
# methods at their defaults on TASK=ruler|hotpotqa) are what test.sh runs.
# MODELS, EPISODES, RATIOS and LENGTHS narrow a phase (a CPU run of the whole is hours; on 2 cores the run is cut to
# what fits, and the table says how many episodes each row saw).
set -euo pipefail
phase=${1:-references}
split=${SPLIT:-validation}
seed=${SEED:-0}
scratch=runs/field-$split
models=${MODELS:-smollm2 qwen2.5-coder-0.5b}
presses=(${PRESSES:-kvzip snapkv streamingllm knorm})
press_methods=$(printf 'kv-press:%s,' "${presses[@]}")
press_sets=()
for p in "${presses[@]}"; do press_sets+=(--set "kv-press:$p.press=$p"); done
short() { case $1 in qwen2.5-coder-0.5b) echo qwen05;; *) echo "$1";; esac; }
if [ "$phase" = references ]; then
  # what each model reads at all: the prompted reference and the floor, SQuAD and HotpotQA F1, RULER at each length
  for model in $models; do
    incontext compare --model "$model" --task squad --split "$split" --seed "$seed" --episodes "${EPISODES:-10}" \
      --methods keep-prompt,drop-prompt --out "$scratch/$(short "$model")-squad-refs"
    incontext compare --model "$model" --task hotpotqa --split "$split" --seed "$seed" --episodes "${HOTPOT_EPISODES:-5}" \
      --methods keep-prompt,drop-prompt --out "$scratch/$(short "$model")-hotpotqa-refs"
    for kind in niah_single_2 niah_multikey_1 vt; do
      for length in ${LENGTHS:-1024 2048}; do
        incontext compare --model "$model" --task ruler --set kind=$kind --set length=$length --split "$split" \
          --seed "$seed" --episodes "${RULER_EPISODES:-5}" --methods keep-prompt,drop-prompt \
          --out "$scratch/$(short "$model")-ruler_${kind}_${length}-refs"
      done
    done
  done
elif [ "$phase" = wording ]; then
  # the squad question's wording, chosen on validation by keep-prompt's F1 over both models (ruler: RULER's QA
  # instruction, the default; bare: the question alone)
  for model in $models; do
    incontext compare --model "$model" --task squad --split "$split" --seed "$seed" --episodes "${EPISODES:-10}" \
      --methods keep-prompt,drop-prompt --set wording=bare --out "$scratch/$(short "$model")-squad_bare-refs"
  done
elif [ "$phase" = presses ]; then
  # kvpress's presses at each kept share, with keep-prompt on the same episodes (the compare's reference)
  for model in $models; do
    for ratio in ${RATIOS:-0.5 0.25 0.1 0.05}; do
      incontext compare --model "$model" --task squad --split "$split" --seed "$seed" --episodes "${EPISODES:-10}" \
        --ratio "$ratio" --methods "drop-prompt,${press_methods%,}" "${press_sets[@]}" \
        --out "$scratch/$(short "$model")-squad-$ratio"
    done
  done
elif [ "$phase" = ruler-presses ]; then
  for model in $models; do
    for ratio in ${RATIOS:-0.25 0.1}; do
      incontext compare --model "$model" --task ruler --set kind=${KIND:-niah_single_2} --set length=${LENGTH:-2048} \
        --split "$split" --seed "$seed" --episodes "${RULER_EPISODES:-5}" --ratio "$ratio" \
        --methods "drop-prompt,${press_methods%,}" "${press_sets[@]}" \
        --out "$scratch/$(short "$model")-ruler_${KIND:-niah_single_2}_${LENGTH:-2048}-$ratio"
    done
  done
elif [ "$phase" = hotpotqa-presses ]; then
  for model in $models; do
    for ratio in ${RATIOS:-0.25 0.1}; do
      incontext compare --model "$model" --task hotpotqa --split "$split" --seed "$seed" --episodes "${HOTPOT_EPISODES:-4}" \
        --ratio "$ratio" --methods "drop-prompt,${press_methods%,}" "${press_sets[@]}" \
        --out "$scratch/$(short "$model")-hotpotqa-$ratio"
    done
  done
elif [ "$phase" = methods ]; then
  # the demo's methods at their defaults (each at its own bytes) on a RULER kind or HotpotQA (TASK=ruler|hotpotqa)
  task=${TASK:-ruler}
  demo_methods=${METHODS:-keep-prompt,drop-prompt,iclca-approx,dynamic-eval,distill-lora,kv-prefix,kv-press}
  for model in $models; do
    if [ "$task" = ruler ]; then
      incontext compare --model "$model" --task ruler --set kind=${KIND:-niah_single_2} --set length=${LENGTH:-2048} \
        --split "$split" --seed "$seed" --episodes "${RULER_EPISODES:-5}" --methods "$demo_methods" \
        --out "$scratch/$(short "$model")-ruler_${KIND:-niah_single_2}_${LENGTH:-2048}-methods"
    else
      incontext compare --model "$model" --task "$task" --split "$split" --seed "$seed" \
        --episodes "${HOTPOT_EPISODES:-4}" --methods "$demo_methods" --out "$scratch/$(short "$model")-$task-methods"
    fi
  done
elif [ "$phase" = absorber ]; then
  # issue 79: the trained absorber chosen on validation (results/absorber-choice) beside KVzip in the same run, on squad
  # or (TASK=ruler) a RULER kind at LENGTH
  task=${TASK:-squad}
  if [ "$task" = ruler ]; then
    task_args=(--task ruler --set kind=${KIND:-niah_single_2} --set length=${LENGTH:-2048} --episodes "${RULER_EPISODES:-5}")
    name=ruler_${KIND:-niah_single_2}_${LENGTH:-2048}
  else
    task_args=(--task "$task" --episodes "${EPISODES:-10}")
    name=$task
  fi
  for model in $models; do
    for ratio in ${RATIOS:-0.25 0.1}; do
      incontext compare --model "$model" "${task_args[@]}" --split "$split" --seed "$seed" \
        --ratio "$ratio" --methods "drop-prompt,kv-press:kvzip,kv-prefix:${CHOSEN:-press}${EXTRA_METHODS:+,$EXTRA_METHODS}" \
        --set kv-press:kvzip.press=kvzip ${CHOSEN_SETS---set kv-prefix:press.init=press} ${EXTRA_SETS:-} \
        --out "$scratch/$(short "$model")-$name-$ratio-trained"
    done
  done
else
  echo "phase: references, wording, presses, ruler-presses, hotpotqa-presses, methods or absorber" >&2
  exit 2
fi
