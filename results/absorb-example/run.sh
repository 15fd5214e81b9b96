#!/bin/bash
# The absorb -> generate exchange on SmolLM2 (about 3 minutes on 2 CPU cores); writes exchange.md next to this file.
# Run from the repository root with the environment active: bash results/absorb-example/run.sh
# facts.txt: incontext.tasks.facts make_people(2, random.Random(123)) and facts_prompt with the same generator.
set -u
D=results/absorb-example
MODEL=${MODEL:-smollm2}  # any model name `incontext generate` takes (a tiny one to try the script)
OUT=$D/exchange.md
Q1=$'Q: Where was Thealcrath Kandairkkon born?\nA:'    # answer in the passage: Beaport
Q2=$'Q: What is Dalniol Louthixciom\'s job?\nA:'        # answer in the passage: potter
CHAT="Where was Thealcrath Kandairkkon born?"

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
step "absorb the passage (distill-lora)" absorb --model "$MODEL" --method distill-lora --prompt-file $D/facts.txt \
    --set steps=40 --set merge=false --set progress=false --out $D/adapted
step "Q1 from the adapted model" generate --model "$MODEL" --adapted $D/adapted --max-new-tokens 16 "$Q1"
step "Q1 from the adapted model, chat" generate --model "$MODEL" --adapted $D/adapted --chat --max-new-tokens 32 "$CHAT"
step "Q2 from the adapted model" generate --model "$MODEL" --adapted $D/adapted --max-new-tokens 16 "$Q2"
step "Q1 from the base model (no passage)" generate --model "$MODEL" --max-new-tokens 16 "$Q1"
step "Q1 from the base model (no passage), chat" generate --model "$MODEL" --chat --max-new-tokens 32 "$CHAT"
step "Q2 from the base model (no passage)" generate --model "$MODEL" --max-new-tokens 16 "$Q2"
KEEP=$(mktemp -d)
step "the reference: the passage kept in the context (keep-prompt)" absorb --model "$MODEL" --method keep-prompt \
    --prompt-file $D/facts.txt --out "$KEEP"
step "Q1 with the passage in the context" generate --model "$MODEL" --adapted "$KEEP" --max-new-tokens 16 "$Q1"
step "Q2 with the passage in the context" generate --model "$MODEL" --adapted "$KEEP" --max-new-tokens 16 "$Q2"
rm -r "$KEEP"
echo "wrote $OUT"
