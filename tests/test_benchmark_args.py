"""Bad arguments to the benchmark scripts that take task or method options: one line on stderr naming the problem, exit code 2,
before the model loads, and no result file written."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, named", [
    (["absorb_cost.py", "--task-set", "questions=paraphrases:7"], "6 wordings"),
    (["absorb_cost.py", "--task-set", "foo=1"], "'foo=1'"),
    (["absorb_cost.py", "--task-set", "paraphrases"], "OPTION=VALUE"),
    (["data_stage_decodes.py", "--paraphrases", "7"], "6 wordings"),
    (["data_stage_decodes.py", "--episodes", "0"], "--episodes"),
    (["training_record.py", "--paraphrases", "7"], "6 wordings"),
    (["training_record.py", "--set", "passes=x"], "passes must be an integer"),
    (["training_record.py", "--set", "bogus=1"], "unknown option 'bogus'"),
    (["training_record.py", "--device", "tpu"], "tpu"),
    (["prefix_trajectory.py", "--seed", "1000000"], "test split"),
    (["prefix_trajectory.py", "--every", "0"], "--every"),
    (["prefix_trajectory.py", "--set", "init=nowhere"], "init must be one of"),
    (["chunked_teacher.py", "--seed", "1000000"], "test split"),
    (["chunked_teacher.py", "--chunks", "1"], "--chunks"),
    (["chunked_teacher.py", "--paraphrases", "7"], "6 wordings"),
    (["wording_consistency.py", "--seed", "1000000"], "test split"),
    (["wording_consistency.py", "--paraphrases", "7"], "6 wordings"),
    (["wording_consistency.py", "--student", "--set", "prefix_tokens=0"], "prefix_tokens"),
    (["pipeline_before_after.py", "--before", "HEAD", "--methods", "kv-prefix", "--set", "bogus=1"], "unknown option 'bogus'"),
    (["pipeline_before_after.py", "--before", "HEAD", "--methods", "nope"], "nope"),
    (["pipeline_before_after.py", "--before", "HEAD", "--set", "ratio"], "KEY=VALUE"),
])
def test_bad_task_options_are_one_line_errors(argv, named, tmp_path):
    extra = {"absorb_cost.py": ["--out", str(tmp_path / "cost")],
             "training_record.py": ["--out", str(tmp_path / "record.json")],
             "prefix_trajectory.py": ["--out", str(tmp_path / "trajectory.json")],
             "chunked_teacher.py": ["--out", str(tmp_path / "chunks.json")],
             "wording_consistency.py": ["--out", str(tmp_path / "wordings.json")]}.get(argv[0], [])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:], *extra],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and named in last and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_wording_consistency_scores_a_training_wording_as_the_harness_scores_a_question(monkeypatch):
    """A query from tokens (token_query, what the probe scores) has text_query's layout; the probe's summary counts
    facts by the training wordings the teacher answers right, and the student's hits in each group."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import wording_consistency as wc

    from incontext.tasks.episodes import text_query, token_query

    class Codec:
        def encode(self, text):
            return [ord(c) for c in text]

    reference = text_query(Codec(), "Q: who?\nA:", " Ada")
    built = token_query(reference.inputs[:len("Q: who?\nA:")], wc.answer_ids(reference))
    for name in ("inputs", "targets", "mask"):
        assert torch.equal(getattr(built, name), getattr(reference, name))
    facts = [{"teacher_eval": True, "teacher_train": [True, True, False], "student_eval": True,
              "student_train": [True, False, False]},
             {"teacher_eval": True, "teacher_train": [False, False, False], "student_eval": False,
              "student_train": [False, False, False]},
             {"teacher_eval": False, "teacher_train": [True, True, True], "student_eval": True,
              "student_train": [True, True, True]}]
    out = wc.summarise(facts, 3, student=True)
    assert out["teacher_eval"] == 2 and out["teacher_by_wording"] == [2, 2, 1]
    assert out["teacher_right_by_train_hits"] == {"0": 1, "1": 0, "2": 1, "3": 0}
    assert out["student_right_by_train_hits"] == {"0": 0, "1": 0, "2": 1, "3": 0}
    assert out["student_eval_of_teacher_right"] == 1 and out["student_right_teacher_wrong"] == 1
    assert out["student_train_matches_teacher"] == 8
