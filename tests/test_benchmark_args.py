"""Bad arguments to the benchmark scripts that take task or method options: one line on stderr naming the problem, exit code 2,
before the model loads, and no result file written."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, named", [
    (["absorb_cost.py", "--task-set", "paraphrases=7"], "6 wordings"),
    (["absorb_cost.py", "--task-set", "foo=1"], "'foo=1'"),
    (["absorb_cost.py", "--task-set", "paraphrases"], "OPTION=VALUE"),
    (["data_stage_decodes.py", "--paraphrases", "7"], "6 wordings"),
    (["data_stage_decodes.py", "--episodes", "0"], "--episodes"),
    (["training_record.py", "--paraphrases", "7"], "6 wordings"),
    (["training_record.py", "--set", "passes=x"], "passes must be an integer"),
    (["training_record.py", "--set", "bogus=1"], "unknown option 'bogus'"),
    (["training_record.py", "--device", "tpu"], "tpu"),
    (["prefix_trajectory.py", "--seed", "0"], "test episodes"),
    (["prefix_trajectory.py", "--every", "0"], "--every"),
    (["prefix_trajectory.py", "--set", "init=nowhere"], "init must be one of"),
    (["chunked_teacher.py", "--seed", "0"], "test episodes"),
    (["chunked_teacher.py", "--chunks", "1"], "--chunks"),
    (["chunked_teacher.py", "--paraphrases", "7"], "6 wordings"),
])
def test_bad_task_options_are_one_line_errors(argv, named, tmp_path):
    extra = {"absorb_cost.py": ["--out", str(tmp_path / "cost")],
             "training_record.py": ["--out", str(tmp_path / "record.json")],
             "prefix_trajectory.py": ["--out", str(tmp_path / "trajectory.json")],
             "chunked_teacher.py": ["--out", str(tmp_path / "chunks.json")]}.get(argv[0], [])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:], *extra],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and named in last and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
