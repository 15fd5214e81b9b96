import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from incontext.config import ConfigError
from incontext.tasks.regression import LinearRegression
from incontext.train import NonFiniteLossError, evaluate_checkpoint, latest_checkpoint, lr_at, train
from incontext.train.config import OptimizerConfig, ScheduleConfig
from train_helpers import checkpoint_tensors, tiny_args, tiny_config


def run_cli(args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "incontext.cli", *args], capture_output=True, text=True, env=env, timeout=300)


def test_schedule_warmup_then_cosine_to_min_ratio():
    opt, sched = OptimizerConfig(lr=1.0), ScheduleConfig(total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, opt, sched) == pytest.approx(0.1) and lr_at(9, opt, sched) == pytest.approx(1.0)
    assert lr_at(10, opt, sched) == pytest.approx(1.0)
    assert lr_at(60, opt, sched) == pytest.approx(0.55)
    assert lr_at(110, opt, sched) == pytest.approx(0.1)


def test_training_writes_metrics_checkpoints_plot_and_eval_reproduces(tmp_path):
    results = train(tiny_config(tmp_path / "run"), progress=False)
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "results.json", "loss.png"):
        assert (run / name).is_file(), name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 11))
    logged = [r for r in records if r["split"] == "eval" and r["step"] == 10][0]
    again = evaluate_checkpoint(latest_checkpoint(run))
    assert again == {k: v for k, v in logged.items() if k not in ("step", "split")}  # bit-identical re-evaluation
    assert results["eval"]["loss"] == logged["loss"]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000008", "step_00000010"]


def test_refuses_to_overwrite_a_run_without_resume(tmp_path):
    train(tiny_config(tmp_path / "run", "schedule.total_steps=4"), progress=False)
    with pytest.raises(FileExistsError, match="resume it, or choose another run folder"):
        train(tiny_config(tmp_path / "run", "schedule.total_steps=4"), progress=False)


@pytest.mark.parametrize("accumulate", [False, True])
def test_killed_and_resumed_run_is_bit_identical(tmp_path, accumulate):
    extra = ["model.dropout=0.1"] + (["run.grad_accum=2"] if accumulate else [])  # dropout: RNG state matters
    train(tiny_config(tmp_path / "straight", *extra), progress=False)
    # the run dies like `kill -9` right after step 6 (the trainer's after_step callback, in its own process)
    script = ("import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
              "from train_helpers import tiny_config; from incontext.train import train; "
              "train(tiny_config(Path(sys.argv[2]), *sys.argv[3:]), progress=False, "
              "after_step=lambda step: step == 6 and os._exit(137))")
    killed = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(tmp_path / "killed"), *extra],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert latest_checkpoint(tmp_path / "killed").name == "step_00000004"  # step 6 was lost with the process
    resumed = run_cli(["train", str(empty_yaml(tmp_path)), "--resume", "--no-progress", *tiny_args(tmp_path / "killed", *extra)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight, again = checkpoint_tensors(tmp_path / "straight", 10), checkpoint_tensors(tmp_path / "killed", 10)
    assert straight.keys() == again.keys()
    for name in straight:
        assert torch.equal(straight[name], again[name]), name
    steps = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # the lost steps' records were dropped, then logged again


def empty_yaml(tmp_path):
    """A config that names only the task (an empty one is refused); the tests give the rest with --set."""
    path = tmp_path / "task.yaml"
    path.write_text("task: {name: linear_regression}\n")
    return path


def test_resume_with_a_different_config_is_refused(tmp_path):
    train(tiny_config(tmp_path / "run", "schedule.total_steps=4"), progress=False)
    with pytest.raises(ConfigError, match="different configuration"):
        train(tiny_config(tmp_path / "run", "schedule.total_steps=8", "model.d_model=32"), resume=True, progress=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(tiny_config(tmp_path / "other"), resume=True, progress=False)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    original = LinearRegression.loss
    calls = {"n": 0}

    def loss_that_blows_up(self, outputs, batch):
        calls["n"] += 1
        value = original(self, outputs, batch)
        return value * float("nan") if calls["n"] == 6 else value

    monkeypatch.setattr(LinearRegression, "loss", loss_that_blows_up)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\).*step 6.*step_00000004"):
        train(tiny_config(run, "run.eval_every=0"), progress=False)
    assert latest_checkpoint(run).name == "step_00000004"
    weights = checkpoint_tensors(run, 4)
    assert all(torch.isfinite(t).all() for name, t in weights.items() if t.is_floating_point())


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    result = run_cli(["train", str(empty_yaml(tmp_path)), "--set", "optimizer.lr=-1", "--out", str(tmp_path / "x")])
    assert result.returncode == 2
    assert "lr must be > 0" in result.stderr and "Traceback" not in result.stderr
