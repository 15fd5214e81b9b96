"""benchmarks/residual_overhead.py: its arguments (presets, overrides, one-line errors) and one tiny timing round that
writes both files with the command (no timing is asserted: the numbers depend on the machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "2", "--width", "16", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "32",
        "--steps", "1", "--repeats", "1", "--warmup", "0"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import residual_overhead

    return residual_overhead


def test_presets_and_overrides(bench):
    small = bench.parse_args([])
    assert (small.layers, small.width, small.heads, small.seq_len, small.batch, small.vocab) == (4, 128, 8, 64, 32, 1024)
    assert small.streams == ["v"] and small.threads == 1 and small.device == "cpu"
    paper = bench.parse_args(["--preset", "paper", "--vocab", "8192", "--streams", "v", "q", "v"])
    assert (paper.layers, paper.width, paper.heads, paper.seq_len, paper.batch, paper.vocab) == (8, 256, 16, 256, 64, 8192)
    assert paper.streams == ["v", "q"]


def test_one_tiny_round_writes_the_table_and_the_json_with_its_command(bench, tmp_path):
    out = tmp_path / "overhead.json"
    threads = torch.get_num_threads()
    try:
        result = bench.main([*TINY, "--streams", "v", "value_residual", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)  # the script sets its own (--threads)
    saved = json.loads(out.read_text())
    assert saved["command"] == "python benchmarks/residual_overhead.py " + " ".join([*TINY, "--streams", "v", "value_residual",
                                                                                    "--out", str(out)])
    assert [r["stream"] for r in saved["rows"]] == ["none", "v", "value_residual"] == [r["stream"] for r in result["rows"]]
    classic, v, mixed = saved["rows"]
    assert classic["parameters"] == v["parameters"] == mixed["parameters"] - 2  # the V stream adds no parameter
    assert all(len(r["ms_per_step_all"]) == 1 and r["ms_per_step"] > 0 for r in saved["rows"])
    text = out.with_suffix(".md").read_text()
    assert saved["command"] in text and "| residual V | 7,232 |" in text and "+3.6%" in text


@pytest.mark.parametrize("argv, named", [(["--preset", "huge"], "--preset"), (["--width", "10", "--heads", "4"], "divisible"),
                                         (["--steps", "0"], "--steps"), (["--streams", "x"], "--streams")])
def test_bad_arguments_are_one_line_errors(argv, named, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "residual_overhead.py"), *argv, "--out",
                           str(tmp_path / "x.json")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and named in last and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
