#!/usr/bin/env bash
# Issue 67's compression curve on VALIDATION episodes (where settings are chosen): every method's exact-match share of
# keep-prompt's answers against the kept share of the document's K/V, SmolLM2-135M-Instruct, the document alone as
# the system turn. One compare per (task, budget) into runs/press-curve/ (scratch), then summary.py writes the one
# table and plot here (curve.md, curve.json, curve.png).
#   bash scripts/env.sh bash results/press-curve/run.sh presses    # kvpress's presses at 50/25/10/5% (minutes)
#   bash scripts/env.sh bash results/press-curve/run.sh trained    # kv-prefix (document / press starts), distill-lora
#   bash scripts/env.sh python results/press-curve/summary.py
# The one test run (fresh episodes, after the choice on validation; results/press-curve/test.sh):
#   SPLIT=test SEED=100 RATIOS="0.25 0.1" bash results/press-curve/run.sh presses
#   SPLIT=test SEED=100 STARTS=document,press bash results/press-curve/run.sh trained
set -euo pipefail
phase=${1:-presses}
split=${SPLIT:-validation}
seed=${SEED:-0}
scratch=runs/press-curve-$split
presses=(kvzip snapkv expectedattention knorm tova streamingllm)
press_methods=$(printf 'kv-press:%s,' "${presses[@]}")
press_sets=()
for p in "${presses[@]}"; do press_sets+=(--set "kv-press:$p.press=$p"); done
declare -A task_sets=([facts]="--task facts --set people=2" [documents]="--task documents"
                      [long]="--task facts --set people=14")
declare -A press_episodes=([facts]=6 [documents]=6 [long]=${LONG_EPISODES:-3})
if [ "$phase" = presses ]; then
  for task in facts documents long; do
    for ratio in ${RATIOS:-0.5 0.25 0.1 0.05}; do
      incontext compare --model smollm2 ${task_sets[$task]} --split "$split" --seed "$seed" \
        --episodes "${press_episodes[$task]}" --ratio "$ratio" --methods "${press_methods%,}" "${press_sets[@]}" \
        --out "$scratch/$task-$ratio"
    done
  done
elif [ "$phase" = trained ]; then
  # kv-prefix from the document's first p tokens (its default) and from KVzip's kept K/V at their own positions, and
  # re-rotated from SnapKV's (same count per head) to 0..p-1; distill-lora at its default rank (its bytes are its own)
  episodes=${TRAINED_EPISODES:-2}
  starts=${STARTS:-document,press,rerotated}
  for task in facts documents; do
    for ratio in 0.25 0.1; do
      extra=()
      [ "$ratio" = 0.25 ] && extra=(--set distill-lora.progress=false)
      methods=$(echo "$starts" | sed 's/\([a-z]*\)/kv-prefix:\1/g')
      methods="kv-press:kvzip,$methods"  # the best press on the same episodes (paired)
      [ "$ratio" = 0.25 ] && methods="$methods,distill-lora"
      incontext compare --model smollm2 ${task_sets[$task]} --split "$split" --seed "$seed" --episodes "$episodes" \
        --ratio "$ratio" --methods "$methods" \
        $(for s in ${starts//,/ }; do echo "--set kv-prefix:$s.progress=false"; done) \
        $([[ $starts == *press* ]] && echo "--set kv-prefix:press.init=press --set kv-prefix:press.press=kvzip") \
        $([[ $starts == *rerotated* ]] && echo "--set kv-prefix:rerotated.init=press-rerotated --set kv-prefix:rerotated.press=snapkv") \
        --set kv-press:kvzip.press=kvzip "${extra[@]}" --out "$scratch/trained-$task-$ratio"
    done
  done
else
  echo "phase: presses or trained" >&2
  exit 2
fi
