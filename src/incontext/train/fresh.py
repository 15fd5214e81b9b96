"""Training a model for an experiment into <out>/train through the ordinary trainer, replacing an earlier run of
the same experiment there and never a folder incontext did not write; or reusing that earlier run when it was
trained to its end with the same settings. `train_many` trains a study's runs, several processes at a time, each
with a record of its training (run.json) that outlives its checkpoints."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ..config import merge
from ..models import Transformer
from ..outputs import EXPERIMENT_MARKER
from .checkpoint import latest_checkpoint
from .config import TrainConfig, config_from_dict, load_config, replace_run
from .trainer import load_for_eval, train

_TRAIN_MARKER = ".incontext-train-fresh"  # in out_dir/train: written by train_fresh, which alone may remove it
_TRAINER_OUTPUTS = {"config.yaml", "metrics.jsonl", "tensorboard", "checkpoints", "results.json", "loss.png", _TRAIN_MARKER}


def _claimed(folder: Path) -> bool:
    return any((parent / EXPERIMENT_MARKER).is_file() for parent in folder.resolve().parents)


def _remove_earlier_training(train_dir: Path) -> None:
    """Remove out_dir/train of an earlier run of the experiment, and nothing that incontext did not write."""
    if not train_dir.exists():
        return
    entries = {p.name for p in train_dir.iterdir()} if train_dir.is_dir() else {"(a file)"}
    ours = (train_dir / _TRAIN_MARKER).is_file() or _claimed(train_dir)
    if not ours or not entries <= _TRAINER_OUTPUTS:
        foreign = sorted(entries - _TRAINER_OUTPUTS) or sorted(entries)
        raise FileExistsError(f"{train_dir} exists and was not written by an earlier run of this experiment (it holds "
                              f"{', '.join(foreign[:3])}): remove it or choose another output folder")
    shutil.rmtree(train_dir)


# run settings that do not change what is trained (where it runs, how it logs)
_RUN_INDEPENDENT = ("out_dir", "threads", "device", "tensorboard", "log_every", "compile")


def finished_training(train_dir: Path, config: TrainConfig) -> dict[str, Any] | None:
    """The trainer's results of the run in train_dir if it was trained to its last step with `config`'s settings
    (apart from _RUN_INDEPENDENT ones), else None."""
    try:
        results = json.loads((Path(train_dir) / "results.json").read_text())
        saved = load_config(Path(train_dir) / "config.yaml")
    except (OSError, ValueError):  # none, or unreadable: train again
        return None

    def settings(c: TrainConfig) -> dict[str, Any]:
        plain = c.to_dict()
        plain["run"] = {k: v for k, v in plain["run"].items() if k not in _RUN_INDEPENDENT}
        return plain

    same = settings(saved) == settings(config) and results.get("steps") == config.schedule.total_steps
    return results if same and latest_checkpoint(Path(train_dir)) is not None else None


def train_fresh(out_dir: Path, settings: TrainConfig | dict[str, Any], reuse: bool = False
                ) -> tuple[Transformer, TrainConfig, dict[str, Any]]:
    """Train a model for an experiment into out_dir/train (replacing an earlier run of it there, never other
    files) through the ordinary trainer; returns the trained model in eval mode, its config and the results.
    `settings`: a TrainConfig, or its plain sections. reuse=True keeps an earlier run of the same settings
    trained to its end (`finished_training`); its results then say "reused": True."""
    train_dir = Path(out_dir) / "train"
    if isinstance(settings, TrainConfig):
        config = replace_run(settings, out_dir=str(train_dir))
    else:
        config = config_from_dict(merge(settings, {"run": {"out_dir": str(train_dir)}}))
    earlier = finished_training(train_dir, config) if reuse else None
    if earlier is not None:
        return load_for_eval(latest_checkpoint(train_dir))[0], config, {**earlier, "reused": True}
    _remove_earlier_training(train_dir)
    train_dir.mkdir(parents=True)
    (train_dir / _TRAIN_MARKER).write_text("written by incontext train_fresh; the next run of the experiment replaces this folder\n")
    results = train(config)
    model, _ = load_for_eval(latest_checkpoint(train_dir))
    return model, config, results


RUN_RECORD = "run.json"  # in a study's run folder, next to its train/ folder


def train_recorded(run_dir: Path | str, settings: dict[str, Any]) -> dict[str, Any]:
    """train_fresh into run_dir/train, then its record in run_dir/run.json: the trainer's final evaluation,
    training seconds, seconds per step and parameters."""
    start = time.perf_counter()
    _, _, results = train_fresh(Path(run_dir), settings)
    seconds = time.perf_counter() - start
    record = {"train_eval": results["eval"], "seconds": seconds, "seconds_per_step": seconds / settings["schedule"]["total_steps"],
              "parameters": results["parameters"]}
    (Path(run_dir) / RUN_RECORD).write_text(json.dumps(record, indent=2))
    return record


def finished_record(run_dir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a run trained to its last step earlier with these settings (`train_recorded`), or None."""
    done = finished_training(Path(run_dir) / "train", config_from_dict(settings)) and (Path(run_dir) / RUN_RECORD).is_file()
    return json.loads((Path(run_dir) / RUN_RECORD).read_text()) if done else None


def train_many(runs: dict[Any, tuple[Path, dict[str, Any]]], workers: int = 1) -> dict[Any, dict[str, Any]]:
    """`train_recorded` for every run (key -> (run folder, settings)), `workers` processes at a time (spawned:
    each sets its own torch threads from its settings); workers=1 trains them one after the other in this
    process. Returns each run's record."""
    if workers == 1:
        return {key: train_recorded(run_dir, settings) for key, (run_dir, settings) in runs.items()}
    if not runs:
        return {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {key: pool.submit(train_recorded, str(run_dir), settings) for key, (run_dir, settings) in runs.items()}
        return {key: future.result() for key, future in futures.items()}
