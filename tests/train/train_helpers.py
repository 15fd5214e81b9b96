"""Tiny training configs shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from incontext.train import load_config

TINY = [
    "model.n_layer=2", "model.d_model=16", "model.n_head=2",
    "task.name=linear_regression", "task.d_in=3", "task.n_points=6",
    "optimizer.lr=3e-3", "schedule.total_steps=10", "schedule.warmup_steps=2",
    "run.batch_size=8", "run.eval_every=5", "run.eval_sequences=32", "run.eval_batch_size=16",
    "run.checkpoint_every=4", "run.log_every=1", "run.tensorboard=false", "run.threads=1",
]


def tiny_config(out: Path, *extra: str):
    return load_config(None, TINY + [f"run.out_dir={out}", *extra])


def tiny_args(out: Path, *extra: str) -> list[str]:
    args = []
    for item in TINY + [*extra]:
        args += ["--set", item]
    return args + ["--out", str(out)]


def checkpoint_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    folder = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    return {**{f"model/{k}": v for k, v in load_file(str(folder / "model.safetensors")).items()},
            **{f"optim/{k}": v for k, v in load_file(str(folder / "optimizer.safetensors")).items()}}
