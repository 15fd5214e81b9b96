#!/bin/bash
# The absorb -> generate exchange on SmolLM2 (about 3-6 minutes on 2 CPU cores); writes DIR/exchange.md.
# Run from the repository root with the environment active: bash results/absorb-example/run.sh [DIR]
# DIR (default results/absorb-example) holds facts.txt, the passage, and questions.txt, one "question|answer" per
# line: every fact of the passage except the worked example's, as the facts task asks it.
#   results/absorb-example: incontext.tasks.facts make_people(2, random.Random(123)) and facts_prompt with the
#     same generator (two people);
#   results/absorb-example/one-person: the same with make_people(1, random.Random(123)).
# METHOD (default distill-lora) picks the absorb method: distill-lora writes DIR/adapted/ and DIR/exchange.md, any
# other method DIR/adapted-METHOD/ and DIR/exchange-METHOD.md (METHOD=kv-prefix: its adapted.safetensors holds the prefix
# alone, 1.9 MB, over the repository's 1 MB limit for weight files, so not committed: re-run the script to make it). distill-lora's folder holds absorb.json and the PEFT adapter only: generate
# puts it back on the base model. exchanges.md gathers the committed runs (command, answers); their transcripts and
# absorb folders are in git at the commits it names.
set -u
export PYTHONWARNINGS="ignore::FutureWarning"  # a transformers deprecation notice would name a local path
D=${1:-results/absorb-example}
MODEL=${MODEL:-smollm2}  # any model name `incontext generate` takes (a tiny one to try the script)
METHOD=${METHOD:-distill-lora}
# SETS: more `--set KEY=VALUE` options for the absorb (space-separated), with NAME naming the run's folder and
# transcript (DIR/adapted-NAME/, DIR/exchange-NAME.md); e.g. SETS="study.n_questions=16" NAME=distill-lora-questions
SETS=${SETS:-}
# TRAIN: a --train-queries file for the absorb (questions it may train on, never the ones asked below; e.g.
# TRAIN=results/absorb-example/train-queries.txt, three other wordings of each question, with SETS="study.wording_ensemble=true")
TRAIN=${TRAIN:-}
NAME=${NAME:-$METHOD}
if [ "$NAME" = distill-lora ]; then A=$D/adapted OUT=$D/exchange.md; else A=$D/adapted-$NAME OUT=$D/exchange-$NAME.md; fi
EXTRA=()
for s in $SETS; do EXTRA+=(--set "$s"); done
if [ -n "$TRAIN" ]; then EXTRA+=(--train-queries "$TRAIN"); fi
mapfile -t QUESTIONS < "$D/questions.txt"
LAST=$((${#QUESTIONS[@]} - 1))
Q1="Q: ${QUESTIONS[0]%|*}"$'\nA:'

step() {  # step TITLE ARGS...: run `incontext ARGS...`, append the command, its output and its time; output in $output
    local title=$1; shift
    local start=$SECONDS
    output=$(incontext "$@" 2>&1; echo "exit $?")
    status=${output##*exit }
    output=$(printf '%s\n' "${output%exit *}" | grep -v '^Loading weights')
    {
        echo "## $title"; echo; echo '```'
        printf 'incontext'; printf ' %q' "$@"; echo; echo '```'; echo; echo '```'; echo "$output"; echo '```'
        echo; echo "($((SECONDS - start)) s)"; echo
    } >> "$OUT"
}

printf '# absorb ('"$METHOD${SETS:+ with $SETS}${TRAIN:+, training queries from $TRAIN}"') -> generate on SmolLM2-135M-Instruct\n\nThe passage (%s):\n\n```\n%s\n```\n\n' "$D/facts.txt" "$(cat $D/facts.txt)" > "$OUT"
step "absorb the passage ($METHOD, ${SETS:-default options}${TRAIN:+, --train-queries $TRAIN})" absorb --model "$MODEL" --method "$METHOD" \
    --prompt-file $D/facts.txt --set progress=false "${EXTRA[@]}" --out "$A"
if [ "$status" != 0 ]; then echo "the absorb failed (see $OUT): $output" >&2; exit 1; fi
right=0
for qa in "${QUESTIONS[@]}"; do
    q=${qa%|*} a=${qa#*|}
    step "chat, adapted model: $q (the passage says: $a)" generate --model "$MODEL" --adapted "$A" --chat \
        --max-new-tokens 32 "$q"
    if [[ $output == *"$a"* ]]; then right=$((right + 1)); echo "right" >> "$OUT"; else echo "wrong" >> "$OUT"; fi
    echo >> "$OUT"
done
for qa in "${QUESTIONS[0]}" "${QUESTIONS[LAST - 1]}"; do
    step "chat, base model (no passage): ${qa%|*}" generate --model "$MODEL" --chat --max-new-tokens 32 "${qa%|*}"
done
for qa in "${QUESTIONS[0]}" "${QUESTIONS[LAST - 1]}"; do  # the teacher distill-lora learns from: the passage in the user turn
    step "chat, base model with the passage in the user turn: ${qa%|*}" generate --model "$MODEL" --chat \
        --max-new-tokens 32 "$(cat $D/facts.txt)"$'\n\n'"${qa%|*}"
done
step "plain Q/A, adapted model" generate --model "$MODEL" --adapted "$A" --max-new-tokens 12 "$Q1"
printf '## summary\n\nThe adapted model (chat, without the passage) names the passage'"'"'s answer in %d of %d answers.\n' \
    "$right" "${#QUESTIONS[@]}" >> "$OUT"
echo "wrote $OUT: $right of ${#QUESTIONS[@]} answers right"
