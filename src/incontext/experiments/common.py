"""Pieces shared by experiments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dataclasses import dataclass

from ..config import merge
from ..models import Transformer
from ..train import latest_checkpoint, load_for_eval, train
from ..train.config import OptimizerConfig, RunConfig, ScheduleConfig, TrainConfig, config_from_dict, replace_run

GPT2_BLOCK = {"positions": "learned", "norm": "layernorm", "mlp": "gelu_tanh", "attention": "softmax"}
GPT2_ADAMW = {"name": "adamw", "weight_decay": 0.1, "betas": (0.9, 0.95)}
# an experiment's training run: evaluated and checkpointed at the end only (the experiment evaluates the model)
EXPERIMENT_RUN = {"eval_every": 0, "eval_sequences": 256, "checkpoint_every": 0, "log_every": 10}


@dataclass
class TrainedModelOptions:
    """The options of an experiment that trains a Transformer through the trainer (flat keys for --set);
    an experiment's config inherits them and may change the defaults."""

    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    steps: int = 1500
    batch_size: int = 32
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self):  # checked before training, not minutes later
        for name in ("n_layer", "d_model", "n_head", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"the learning rate must satisfy lr > 0, got {self.lr}")

    def train_config(self, task: dict[str, Any], *, model: dict[str, Any] | None = None,
                     optimizer: dict[str, Any] | None = None, warmup_steps: int = 100, **run: Any) -> TrainConfig:
        """The training run these options describe on `task`: `model` adds TransformerConfig fields,
        `optimizer` OptimizerConfig fields, `run` RunConfig fields (over EXPERIMENT_RUN)."""
        return TrainConfig(
            model={"n_layer": self.n_layer, "d_model": self.d_model, "n_head": self.n_head, **(model or {})},
            task=task,
            optimizer=OptimizerConfig(lr=self.lr, **(optimizer or {})),
            schedule=ScheduleConfig(total_steps=self.steps, warmup_steps=warmup_steps),
            run=RunConfig(**{**EXPERIMENT_RUN, "batch_size": self.batch_size, "seed": self.seed, **run}),
        )


# An experiment's output folder carries this file (naming the experiment): a later run of the same experiment
# may replace what is in it; any other non-empty folder is refused, so no command writes over a user's files.
EXPERIMENT_MARKER = ".incontext-experiment"
_TRAIN_MARKER = ".incontext-train-fresh"  # in out_dir/train: written by train_fresh, which alone may remove it
_TRAINER_OUTPUTS = {"config.yaml", "metrics.jsonl", "tensorboard", "checkpoints", "results.json", "loss.png", _TRAIN_MARKER}


def claim_output_folder(out_dir: Path, experiment: str) -> None:
    """Make out_dir the output folder of `experiment`: it must be new, empty, or an earlier output of the same
    experiment (one written before markers existed is recognised by its results.json and table.md)."""
    out_dir = Path(out_dir)
    marker = out_dir / EXPERIMENT_MARKER
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file, not a folder")
    if marker.is_file():
        try:
            owner = json.loads(marker.read_text()).get("experiment")
        except (ValueError, AttributeError):
            owner = None
        if owner != experiment:
            raise FileExistsError(f"--out {out_dir} holds the output of experiment {owner!r}, not {experiment!r}: "
                                  "choose another --out")
        return
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not {"results.json", "table.md"} <= set(entries):
        raise FileExistsError(f"--out {out_dir} is not empty (it holds {', '.join(entries[:3])}"
                              f"{', ...' if len(entries) > 3 else ''}) and is no output of {experiment!r}: choose a new "
                              "or empty folder (incontext never writes over files it did not create)")
    out_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"experiment": experiment}) + "\n")


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


def train_fresh(out_dir: Path, settings: TrainConfig | dict[str, Any]) -> tuple[Transformer, TrainConfig, dict[str, Any]]:
    """Train a model for an experiment into out_dir/train (replacing an earlier run of it there, never other
    files) through the ordinary trainer; returns the trained model in eval mode, its config and the results.
    `settings`: a TrainConfig, or its plain sections."""
    train_dir = Path(out_dir) / "train"
    if isinstance(settings, TrainConfig):
        config = replace_run(settings, out_dir=str(train_dir))
    else:
        config = config_from_dict(merge(settings, {"run": {"out_dir": str(train_dir)}}))
    _remove_earlier_training(train_dir)
    train_dir.mkdir(parents=True)
    (train_dir / _TRAIN_MARKER).write_text("written by incontext train_fresh; the next run of the experiment replaces this folder\n")
    results = train(config)
    model, _ = load_for_eval(latest_checkpoint(train_dir))
    return model, config, results
