"""Pieces shared by experiments."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..config import merge
from ..models import Transformer
from ..train import latest_checkpoint, load_for_eval, train
from ..train.config import TrainConfig, config_from_dict


def train_fresh(out_dir: Path, settings: dict[str, Any]) -> tuple[Transformer, TrainConfig, dict[str, Any]]:
    """Train a model for an experiment into out_dir/train (replacing an earlier run of it there) through the
    ordinary trainer; returns the trained model in eval mode, its config and the trainer's results."""
    train_dir = Path(out_dir) / "train"
    if train_dir.exists():
        shutil.rmtree(train_dir)
    config = config_from_dict(merge(settings, {"run": {"out_dir": str(train_dir)}}))
    results = train(config)
    model, _ = load_for_eval(latest_checkpoint(train_dir))
    return model, config, results
