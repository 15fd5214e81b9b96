"""The device check script on the CPU (its dry run): every check passes, the record is written, an existing
record is never overwritten, and without CUDA the cuda run records that it skipped."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import device_check  # noqa: E402


def test_every_check_passes_on_the_cpu(tmp_path):
    out = tmp_path / "record.json"
    assert device_check.main(["--device", "cpu", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["passed"] and len(record["checks"]) == len(device_check.CHECKS)
    statuses = record["checks"]["every_method_through_the_harness"]["details"]
    assert statuses["hf"]["keep-prompt"] == "ok" and statuses["hf"]["iclca"].startswith("n/a")


def test_an_existing_record_is_not_overwritten(tmp_path):
    out = tmp_path / "record.json"
    out.write_text("mine")
    assert device_check.main(["--device", "cpu", "--out", str(out)]) == 2
    assert out.read_text() == "mine"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_the_cuda_run_skips(tmp_path):
    out = tmp_path / "record.json"
    assert device_check.main(["--device", "cuda", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["skipped"] == "no CUDA device here"
