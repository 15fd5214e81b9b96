"""train_fresh: an experiment's training run into <out>/train, reused only when trained to its end with the same
settings (run settings that change nothing trained, such as threads, may differ)."""

import json

import torch

from incontext.train.config import config_from_dict
from incontext.train.fresh import RUN_RECORD, finished_record, finished_training, train_fresh, train_many
from incontext.train.trainer import load_for_eval
from incontext.train import latest_checkpoint

TINY = {"model": {"n_layer": 1, "d_model": 16, "n_head": 2},
        "task": {"name": "linear_regression", "d_in": 2, "n_points": 4},
        "schedule": {"total_steps": 3, "warmup_steps": 1},
        "run": {"batch_size": 4, "eval_every": 0, "eval_sequences": 8, "checkpoint_every": 0, "log_every": 1,
                "tensorboard": False, "threads": 1}}


def with_changes(**sections):
    return {name: {**TINY.get(name, {}), **sections.get(name, {})} for name in {*TINY, *sections}}


def checkpoint_stamp(out):
    return sorted((p.name, p.stat().st_mtime_ns) for p in (out / "train" / "checkpoints").rglob("*") if p.is_file())


def test_reuse_keeps_a_finished_run_of_the_same_settings(tmp_path):
    model, config, first = train_fresh(tmp_path, TINY)
    stamp = checkpoint_stamp(tmp_path)
    again, _, results = train_fresh(tmp_path, with_changes(run={"threads": 2}), reuse=True)
    assert results["reused"] is True and checkpoint_stamp(tmp_path) == stamp
    assert results["eval"] == first["eval"]
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_changed_settings_or_an_unfinished_run_train_again(tmp_path):
    train_fresh(tmp_path, TINY)
    assert finished_training(tmp_path / "train", config_from_dict(TINY)) is not None
    _, _, results = train_fresh(tmp_path, with_changes(optimizer={"lr": 1e-4}), reuse=True)
    assert "reused" not in results
    _, _, results = train_fresh(tmp_path, with_changes(optimizer={"lr": 1e-4}, run={"seed": 5}), reuse=True)
    assert "reused" not in results  # the seed changes what is trained
    (tmp_path / "train" / "results.json").write_text(json.dumps({"steps": 2}))  # as if cut short
    _, _, results = train_fresh(tmp_path, with_changes(optimizer={"lr": 1e-4}, run={"seed": 5}), reuse=True)
    assert "reused" not in results
    (tmp_path / "train" / "config.yaml").write_text("{not yaml")
    assert finished_training(tmp_path / "train", config_from_dict(TINY)) is None


def test_without_reuse_an_identical_run_is_trained_again(tmp_path):
    train_fresh(tmp_path, TINY)
    stamp = checkpoint_stamp(tmp_path)
    _, _, results = train_fresh(tmp_path, TINY)
    assert "reused" not in results and checkpoint_stamp(tmp_path) != stamp


def test_train_many_in_processes_equals_one_after_the_other(tmp_path):
    runs = {seed: with_changes(run={"seed": seed}) for seed in (0, 1)}
    sequential = train_many({seed: (tmp_path / "a" / str(seed), s) for seed, s in runs.items()}, workers=1)
    parallel = train_many({seed: (tmp_path / "b" / str(seed), s) for seed, s in runs.items()}, workers=2)
    for seed in runs:
        assert sequential[seed]["train_eval"] == parallel[seed]["train_eval"]
        assert json.loads((tmp_path / "b" / str(seed) / RUN_RECORD).read_text()) == parallel[seed]
        a, _ = load_for_eval(latest_checkpoint(tmp_path / "a" / str(seed) / "train"))
        b, _ = load_for_eval(latest_checkpoint(tmp_path / "b" / str(seed) / "train"))
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), name
    assert sequential[0]["train_eval"] != sequential[1]["train_eval"]  # the seeds differ
    assert finished_record(tmp_path / "a" / "0", runs[0]) == sequential[0]
    assert finished_record(tmp_path / "a" / "0", runs[1]) is None  # other settings
    assert train_many({}, workers=2) == {}
