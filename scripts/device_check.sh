#!/usr/bin/env bash
# On a machine with a GPU and only torch, transformers and peft installed (nothing downloaded, no SmolLM2 file):
# the cuda checks (scripts/device_check.py: every method through the harness on both backends, training with a
# bit-identical resume, bf16, the commands) and the GPU benchmark (benchmarks/gpu_backends.py: ours vs
# transformers, every absorb method's costs at 512 / 2,048 / 4,096 prompt tokens on SmolLM2's shapes). Results go
# to benchmarks/results/ (or $OUT when set, e.g. on the lent device machine); commit them.
#   bash scripts/device_check.sh            # ~5 min on an H100
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
stamp="$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
export PYTHONPATH=src
python3="${PYTHON:-python3}"
"$python3" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
"$python3" scripts/device_check.py --device cuda --out "$out/device_check-$stamp.json"
checks=$?
"$python3" benchmarks/gpu_backends.py --device cuda --dtype bfloat16 --out "$out/gpu_backends-$stamp.json"
bench=$?
echo "device check exit $checks, benchmark exit $bench"
exit $(( checks || bench ))
