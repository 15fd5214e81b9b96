#!/usr/bin/env bash
# One lent-GPU session's work, in order of importance, each step under its own time limit so that a slow one cannot
# take the others' time; every result is written as it is measured (to $OUT on the lent machine, else
# benchmarks/results/):
#   0. where a kv-prefix absorb's time goes at 489 tokens (benchmarks/absorb_profile.py: data-stage parts with the static
#      and the plain decode, kernels per decode and training step, replayed step time per batch size);
#   1. kv-prefix and distill-lora absorb cost at 165 / 489 / 1,871 prompt tokens (benchmarks/absorb_cost.py) on
#      random weights of SmolLM2's shapes with SmolLM2's tokenizer (the model file cannot travel; the tokenizer
#      folder is saved here first: see below), median of 3 after a warm-up;
#   2. the device check (scripts/device_check.py: every method on both backends, resume, bf16, the commands);
#   3. ours vs transformers and every absorb method's cost at 512 / 2,048 / 4,096 tokens (benchmarks/gpu_backends.py).
# Before: python -c "from incontext.interop.pretrained import load_smollm2; load_smollm2()[1].save_pretrained('.carry/smollm2-tokenizer')"
#   (.carry/ ignored; name it in the device tool's carry).  Then: bash scripts/device_run.sh   (~8 min on an H100)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
device="${DEVICE:-cuda}"
limits=(${LIMITS:-150 170 170})
probe=${PROBE_LIMIT:-90}
export PYTHONPATH=src PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
timeout "$probe" "$py" benchmarks/absorb_profile.py --device "$device" --tokenizer .carry/smollm2-tokenizer \
    --out "$out/absorb_profile_${device}.json" 2>&1 | grep -v Warning | tail -20
timeout "${limits[0]}" "$py" benchmarks/absorb_cost.py --device "$device" --random-weights --tokenizer .carry/smollm2-tokenizer \
    --warmup --repeats "${REPEATS:-3}" ${COST_ARGS:-} --people ${PEOPLE:-2 7 27} --out "$out/absorb_cost_${device}" 2>&1 | tee "$out/absorb_cost.log"
cost=$?
timeout "${limits[1]}" "$py" scripts/device_check.py --device "$device" --out "$out/device_check_${device}.json" 2>&1 | tail -40
checks=$?
[ "${BACKENDS:-1}" = 1 ] && timeout "${limits[2]}" "$py" benchmarks/gpu_backends.py --device "$device" --dtype "${DTYPE:-bfloat16}" ${BACKENDS_ARGS:-} \
    --out "$out/gpu_backends_${device}.json" 2>&1 | tail -60
bench=$?
echo "absorb cost exit $cost, device check exit $checks, benchmark exit $bench"
