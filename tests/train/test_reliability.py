"""What the trainer and its checkpoints do when something goes wrong: divergence after the update, interrupted
saves, dangling `latest`, finished runs, changed configs, and strict result files."""

import json
import shutil

import pytest
import torch

from incontext.cli.commands import main
from incontext.fileio import sha256_file, strict_json
from incontext.train import NonFiniteLossError, latest_checkpoint, train
from incontext.train.checkpoint import is_finite_checkpoint, save_checkpoint
from train_helpers import checkpoint_tensors, tiny_args, tiny_config


def strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"bare {constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def task_yaml(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text("task: {name: linear_regression}\n")
    return path


def test_non_finite_weights_after_the_update_stop_before_anything_is_written(tmp_path, monkeypatch):
    """The loss and the gradient are finite, the update is not: step 3 must leave no trace."""
    original = torch.optim.AdamW.step
    calls = {"n": 0}

    def poisoned_step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned_step)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"after the update of step 3 .*verified finite\) is .*step_00000002"):
        train(tiny_config(run, "run.checkpoint_every=2", "run.eval_every=0"), progress=False)
    assert latest_checkpoint(run).name == "step_00000002" and is_finite_checkpoint(latest_checkpoint(run))
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000002"]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not (run / "results.json").exists()


def test_the_divergence_message_skips_a_checkpoint_that_is_not_finite(tmp_path, monkeypatch):
    """The named checkpoint is checked, not assumed: a NaN-holding newest checkpoint is passed over."""
    run = tmp_path / "run"
    train(tiny_config(run, "schedule.total_steps=4", "run.checkpoint_every=2", "run.keep_checkpoints=3"), progress=False)
    newest = run / "checkpoints" / "step_00000004" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:-4] + b"\x00\x00\xc0\x7f")  # last float32 -> NaN (digest now differs)
    assert not is_finite_checkpoint(newest.parent) and is_finite_checkpoint(run / "checkpoints" / "step_00000002")
    from incontext.train import trainer

    assert trainer._last_finite_checkpoint(run).name == "step_00000002"


def test_checkpoints_record_digests_and_clean_up_interrupted_saves(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / ".step_00000009.x1y2").mkdir()  # a save killed before its rename
    (root / ".step_00000009.x1y2" / "model.safetensors").write_bytes(b"partial")
    (root / ".latest.abc").write_text("step_00000009")
    path = save_checkpoint(tmp_path, 1, model, None, {})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000001"]
    state = json.loads((path / "state.json").read_text())
    assert state["sha256"] == {name: sha256_file(path / name) for name in ("model.safetensors", "optimizer.safetensors")}


def test_resume_past_a_dangling_latest_continues_from_the_older_checkpoint_bit_identically(tmp_path, task_yaml, capsys):
    straight = tmp_path / "straight"
    train(tiny_config(straight, "run.checkpoint_every=4", "run.keep_checkpoints=3"), progress=False)
    damaged = tmp_path / "damaged"
    shutil.copytree(straight, damaged)
    (damaged / "checkpoints" / "step_00000010").rename(damaged / "checkpoints" / "step_00000010.broken")
    (damaged / "checkpoints" / "step_00000008" / "state.json").unlink()  # `latest` names step 10; 8 is incomplete
    (damaged / "checkpoints" / "latest").write_text("step_00000008\n")
    assert latest_checkpoint(damaged).name == "step_00000004"
    assert main(["train", str(task_yaml), "--resume", "--no-progress",
                 *tiny_args(damaged, "run.checkpoint_every=4", "run.keep_checkpoints=3")]) == 0
    assert "names an incomplete checkpoint; resuming from" in capsys.readouterr().err
    expected, again = checkpoint_tensors(straight, 10), checkpoint_tensors(damaged, 10)
    assert expected.keys() == again.keys() and all(torch.equal(expected[k], again[k]) for k in expected)


def test_resuming_a_finished_run_adds_nothing(tmp_path, task_yaml, capsys):
    run = tmp_path / "run"
    args = ["train", str(task_yaml), "--no-progress", *tiny_args(run, "schedule.total_steps=4", "run.tensorboard=false")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tensorboard/" not in out and "metrics.jsonl" in out  # only what was written is announced
    before = snapshot(run)
    assert main(args + ["--resume"]) == 0
    assert "already finished at step 4" in capsys.readouterr().out
    assert snapshot(run) == before


def test_force_resumes_with_a_changed_batch_size(tmp_path, task_yaml, capsys):
    run = tmp_path / "run"
    assert main(["train", str(task_yaml), "--no-progress", *tiny_args(run, "schedule.total_steps=4")]) == 0
    changed = tiny_args(run, "schedule.total_steps=8", "run.batch_size=16")
    assert main(["train", str(task_yaml), "--no-progress", "--resume", *changed]) == 2
    assert "run.batch_size: 8 -> 16" in capsys.readouterr().err
    assert main(["train", str(task_yaml), "--no-progress", "--resume", "--force", *changed]) == 0
    assert latest_checkpoint(run).name == "step_00000008"


def test_a_run_that_died_before_its_first_checkpoint_restarts_cleanly(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("old: run\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 9.0}\n')
    train(tiny_config(run, "schedule.total_steps=3"), progress=False)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps.count(1) == 1  # the dead run's records are gone


def test_results_are_strict_json(tmp_path):
    assert strict_json({"a": float("nan"), "b": [1.0, float("inf")], "c": (2, -float("inf"))}) == strict_json(
        {"a": None, "b": [1.0, None], "c": [2, None]})
    train(tiny_config(tmp_path / "run", "schedule.total_steps=2"), progress=False)
    strict_loads((tmp_path / "run" / "results.json").read_text())
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        strict_loads(line)


def test_an_experiment_reruns_into_its_own_folder(tmp_path):
    settings = ["steps=2", "n_layer=1", "d_model=8", "n_head=2", "n_points=4", "d_in=2", "eval_sequences=8", "warmup=1"]
    args = ["run", "regression-demo", *[a for s in settings for a in ("--set", s)], "--out", str(tmp_path / "demo")]
    assert main(args) == 0
    first = json.loads((tmp_path / "demo" / ".incontext-experiment").read_text())
    assert first == {"experiment": "regression-demo"}
    assert main(args) == 0  # its own earlier output (train/ included) is replaced
    assert (tmp_path / "demo" / "results.json").is_file() and (tmp_path / "demo" / "train" / "checkpoints").is_dir()
