#!/usr/bin/env bash
# Issue 79's choice among the trained absorbers, on SQuAD validation paragraphs (the document alone as the system
# turn), at a tenth of the document's K/V against KVzip (the best press there): kv-prefix from KVzip's kept pairs at
# their own positions (init=press), re-rotated with KVzip's per-head budgets (init=press-rerotated), with the
# reconstruction data (study.reconstruction) and with self-study messages the model writes (study.n_conversations).
#   bash scripts/env.sh bash results/absorber-choice/run.sh              # validation (MODELS, EPISODES, RATIO narrow it)
#   bash scripts/env.sh bash results/absorber-choice/run.sh steps        # issue 79 item 5: the chosen start with fewer
#       training steps (kv-prefix's default since: init=auto, study.reconstruction=8), at RATIO (0.1, then 0.25)
#   bash scripts/env.sh bash results/absorber-choice/run.sh kvzap        # item 4: KVzap's scorer trained here
#       (incontext run kvzap-train --out results/kvzap-smollm2) with KVzip's eviction rule (select=global, the
#       default) and with kvpress's KVzapPress (select=kvpress), against KVzip and SnapKV, at a tenth and a quarter
#   bash scripts/env.sh bash results/absorber-choice/run.sh keep-start   # the default against keep_start=true
#       (training undone where it raised the held-out KL) and a fifth of the rate, at a quarter and a tenth
set -euo pipefail
stage=${1:-}
if [ "$stage" = keep-start ]; then
  for model in ${MODELS:-smollm2}; do
    short=$(case $model in qwen2.5-coder-0.5b) echo qwen05;; *) echo "$model";; esac)
    for ratio in ${RATIOS:-0.25 0.1}; do
      incontext compare --model "$model" --task squad --split "${SPLIT:-validation}" --episodes "${EPISODES:-5}" \
        --ratio "$ratio" --methods keep-prompt,drop-prompt,kv-press:kvzip,kv-prefix,kv-prefix:keep,kv-prefix:lr01 \
        --set kv-press:kvzip.press=kvzip --set kv-prefix:keep.keep_start=true --set kv-prefix:lr01.learning_rate=0.01 \
        --out "results/absorber-choice/${SPLIT:-validation}-$short-$ratio-keep-start"
    done
  done
  exit 0
fi
if [ "$stage" = kvzap ]; then
  for model in ${MODELS:-smollm2}; do
    short=$(case $model in qwen2.5-coder-0.5b) echo qwen05;; *) echo "$model";; esac)
    for ratio in ${RATIOS:-0.1 0.25}; do
      incontext compare --model "$model" --task squad --split "${SPLIT:-validation}" --episodes "${EPISODES:-5}" \
        --ratio "$ratio" \
        --methods keep-prompt,drop-prompt,kv-press:kvzip,kv-press:kvzap,kv-press:kvzap-kvpress,kv-press:snapkv \
        --set kv-press:kvzip.press=kvzip --set kv-press:snapkv.press=snapkv \
        --set kv-press:kvzap.press=kvzap --set "kv-press:kvzap.weights=results/kvzap-$short/kvzap" \
        --set kv-press:kvzap-kvpress.press=kvzap --set "kv-press:kvzap-kvpress.weights=results/kvzap-$short/kvzap" \
        --set kv-press:kvzap-kvpress.select=kvpress \
        --out "results/absorber-choice/${SPLIT:-validation}-$short-$ratio-kvzap"
    done
  done
  exit 0
fi
if [ "$stage" = steps ]; then
  for model in ${MODELS:-smollm2}; do
    short=$(case $model in qwen2.5-coder-0.5b) echo qwen05;; *) echo "$model";; esac)
    incontext compare --model "$model" --task squad --split "${SPLIT:-validation}" --episodes "${EPISODES:-5}" \
      --ratio "${RATIO:-0.1}" --methods keep-prompt,kv-press:kvzip,kv-prefix,kv-prefix:steps32,kv-prefix:steps16 \
      --set kv-press:kvzip.press=kvzip \
      --set kv-prefix:steps32.steps=32 --set kv-prefix:steps32.passes=2 \
      --set kv-prefix:steps16.steps=16 --set kv-prefix:steps16.passes=1 \
      --out "results/absorber-choice/${SPLIT:-validation}-$short-${RATIO:-0.1}-steps"
  done
  exit 0
fi
split=${SPLIT:-validation}
for model in ${MODELS:-smollm2}; do
  short=$(case $model in qwen2.5-coder-0.5b) echo qwen05;; *) echo "$model";; esac)
  incontext compare --model "$model" --task squad --split "$split" --episodes "${EPISODES:-5}" --ratio "${RATIO:-0.1}" \
    --methods keep-prompt,drop-prompt,kv-press:kvzip,kv-prefix:press,kv-prefix:rerotated,kv-prefix:reconstruction,kv-prefix:selfstudy \
    --set kv-press:kvzip.press=kvzip \
    --set kv-prefix:press.init=press \
    --set kv-prefix:rerotated.init=press-rerotated \
    --set kv-prefix:reconstruction.init=press --set kv-prefix:reconstruction.study.reconstruction=8 \
    --set kv-prefix:selfstudy.init=press --set kv-prefix:selfstudy.study.n_conversations=8 \
    --out "results/absorber-choice/$split-$short-${RATIO:-0.1}"
done
