"""The device check's checks (scripts/device_check.py) under pytest, on a GPU: every method through the harness on
both backends, bfloat16, a family that runs only on the Hugging Face backend, training with a checkpoint and a
bit-identical resume (float32 and bf16 autocast), cgt-fold, and the absorb/generate commands. Marked `cuda`:
skipped where no CUDA device is present (CI on CPUs). Their CPU dry run is tests/test_device_check.py."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import device_check  # noqa: E402

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("check", device_check.CHECKS, ids=lambda fn: fn.__name__)
def test_device_check(check, tmp_path):
    check("cuda", tmp_path)
