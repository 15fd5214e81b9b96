#!/usr/bin/env bash
# Issue 76's GPU jobs in one lent-device call (about 8 minutes on an H100), each under its own time limit; what they
# write comes back in $OUT (else benchmarks/results/):
#   1. the residual streams' training-step overhead at the paper's LM size, alone on the GPU
#      (benchmarks/residual_overhead.py --preset paper: a ratio to the classic LM in one interleaved run);
#   2. at the same time, on the one GPU: ICLCA Table 2 in the paper's form (RoPE, LAYERS layers, default 12 as the
#      paper; width 128 and the recipe otherwise) over seeds 0-4, one process each; CGT's Figs 7-9 ablations
#      (cgt-ablations at cgt-table1's cpu preset, WORKERS runs at a time); and the device check
#      (scripts/device_check.py). The trainer puts a run on the GPU by itself (run.device=auto) with bf16 autocast
#      (run.autocast=auto); the evaluations run where each experiment puts them.
#   3. the runs' small files (results, records, learning curves; no checkpoint) packed into $OUT/papers.tar.gz:
#      unpack it into results/ with `tar xzf papers.tar.gz -C results/` (folders iclca-table2-rope-<LAYERS>layers and
#      cgt-ablations).
#   bash scripts/device_papers.sh                                 # on the lent machine
#   DEVICE=cpu TINY=1 bash scripts/env.sh bash scripts/device_papers.sh   # its dry run here: every step at toy size
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
device="${DEVICE:-cuda}"
layers="${LAYERS:-12}"
limit="${LIMIT:-400}"
work="${WORK:-$(mktemp -d)}"
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${THREADS:-2}"
py="${PYTHON:-python3}"
iclca=(--set positions=rope --set n_layer="$layers")
cgt=(--set workers="${WORKERS:-3}")
overhead=(--preset paper)
if [ "${TINY:-0}" = 1 ]; then  # the dry run: the same commands at toy size
  iclca+=(--set steps=20 --set eval_every=10 --set eval_sequences=20 --set warmup_steps=2)
  cgt+=(--set steps=10 --set eval_sequences=16 --set seeds=[0] --set ranks=[1] --set split_layers=[2] --set weights=[[0.0,0.0]] --set workers=1)
  overhead=(--layers 2 --width 32 --heads 2 --seq-len 16 --batch 2 --vocab 64 --repeats 2 --steps 1)
fi
mkdir -p "$out" "$work/iclca-table2-rope-${layers}layers"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
timeout 150 "$py" benchmarks/residual_overhead.py "${overhead[@]}" --device "$device" --out "$out/residual_overhead_paper_${device}.json" 2>&1 | tail -25
for seed in 0 1 2 3 4; do
  timeout "$limit" "$py" -m incontext.cli run iclca-table2 "${iclca[@]}" --set seed="$seed" \
      --out "$work/iclca-table2-rope-${layers}layers/seed$seed" > "$work/iclca-table2-rope-${layers}layers/seed$seed.log" 2>&1 &
done
timeout "$limit" "$py" -m incontext.cli run cgt-ablations "${cgt[@]}" --out "$work/cgt-ablations" > "$work/cgt-ablations.log" 2>&1 &
timeout 200 "$py" scripts/device_check.py --device "$device" --out "$out/device_check_${device}.json" 2>&1 | tail -30
wait
for log in "$work"/*.log "$work"/*/*.log; do echo "== $log"; tr '\r' '\n' < "$log" | grep -v '^ *$' | tail -4; done
tar czf "$out/papers.tar.gz" --exclude=checkpoints --exclude=tensorboard --exclude='*.pt' --exclude='*.safetensors' -C "$work" .
ls -la "$out"
