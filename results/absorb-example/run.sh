#!/bin/bash
# The absorb -> generate exchange on SmolLM2 (about 5 minutes on 2 CPU cores); writes exchange.md next to this file.
# Run from the repository root with the environment active: bash results/absorb-example/run.sh
# facts.txt: incontext.tasks.facts make_people(2, random.Random(123)) and facts_prompt with the same generator.
set -u
D=results/absorb-example
MODEL=${MODEL:-smollm2}  # any model name `incontext generate` takes (a tiny one to try the script)
OUT=$D/exchange.md
C1="Where was Thealcrath Kandairkkon born?"         # answer in the passage: Beaport
C2="What is Dalniol Louthixciom's job?"             # answer in the passage: potter
C3="What is the name of Thealcrath Kandairkkon's pet?"  # answer in the passage: Caszio
Q1=$'Q: Where was Thealcrath Kandairkkon born?\nA:'

step() {  # step TITLE ARGS...: run `incontext ARGS...` and append the command, its output and its time
    local title=$1; shift
    local start=$SECONDS
    local output
    output=$(incontext "$@" 2>&1 | grep -v '^Loading weights')
    {
        echo "## $title"; echo; echo '```'
        printf 'incontext'; printf ' %q' "$@"; echo; echo '```'; echo; echo '```'; echo "$output"; echo '```'
        echo; echo "($((SECONDS - start)) s)"; echo
    } >> "$OUT"
}

printf '# absorb -> generate on SmolLM2-135M-Instruct\n\nThe passage (%s):\n\n```\n%s\n```\n\n' "$D/facts.txt" "$(cat $D/facts.txt)" > "$OUT"
step "absorb the passage (distill-lora, default options)" absorb --model "$MODEL" --method distill-lora \
    --prompt-file $D/facts.txt --set merge=false --set progress=false --out $D/adapted
for q in "$C1" "$C2" "$C3"; do
    step "chat, adapted model: $q" generate --model "$MODEL" --adapted $D/adapted --chat --max-new-tokens 32 "$q"
done
for q in "$C1" "$C2"; do
    step "chat, base model (no passage): $q" generate --model "$MODEL" --chat --max-new-tokens 32 "$q"
done
for q in "$C1" "$C2"; do  # the teacher distill-lora learns from: the passage in the user turn
    step "chat, base model with the passage in the user turn: $q" generate --model "$MODEL" --chat --max-new-tokens 32 \
        "$(cat $D/facts.txt)"$'\n\n'"$q"
done
step "plain Q/A, adapted model" generate --model "$MODEL" --adapted $D/adapted --max-new-tokens 12 "$Q1"
echo "wrote $OUT"
