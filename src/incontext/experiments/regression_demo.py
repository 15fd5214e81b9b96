"""The main job until the training issue lands: train a small transformer on in-context linear regression
(CPU, about two minutes) and compare its error with least squares and ridge by number of in-context examples.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..outputs import Result, markdown_table, pyplot
from ..tasks.regression import error_by_examples
from ..train.fresh import train_fresh
from ..train.metrics import read_metrics
from .common import TrainedModelOptions, check_settings
from .registry import register_experiment


@dataclass
class RegressionDemoConfig(TrainedModelOptions):
    # sized to train in about two minutes on 2 CPU cores; `--set steps=20000` trains further
    d_model: int = 64
    steps: int = 4500
    batch_size: int = 64
    lr: float = 3e-3
    d_in: int = 4
    n_points: int = 16
    noise: float = 0.1
    warmup: int = 100
    eval_sequences: int = 2000
    threads: int = 0  # 0: torch's default

    def __post_init__(self):
        super().__post_init__()
        check_settings(self, counts=("d_in", "n_points", "eval_sequences"))
        if self.noise < 0 or self.warmup < 0 or self.threads < 0:
            raise ValueError("noise, warmup and threads must be >= 0")


@register_experiment(
    "regression-demo",
    "train a small transformer on in-context linear regression (~2 min) and compare with least squares / ridge",
    RegressionDemoConfig,
)
def run(config: RegressionDemoConfig, out_dir: Path) -> Result:
    start = time.perf_counter()
    task = {"name": "linear_regression", "d_in": config.d_in, "d_out": 1, "n_points": config.n_points, "noise": config.noise}
    model, train_config, _ = train_fresh(out_dir, config.train_config(task, warmup_steps=config.warmup, threads=config.threads))
    train_seconds = time.perf_counter() - start
    task = train_config.build_task()

    # evaluation on held-out sequences (a generator seeded apart from training)
    eval_batch = task.sample(config.eval_sequences, torch.Generator().manual_seed(10_000 + config.seed))
    with torch.no_grad():
        curves = {"transformer": error_by_examples(model(eval_batch.inputs), eval_batch)}
    for name, baseline in task.baselines().items():
        curves[name] = error_by_examples(baseline(eval_batch.inputs), eval_batch)
    curves = {name: [float(v) for v in curve] for name, curve in curves.items()}
    losses = [(r["step"], r["loss"]) for r in read_metrics(Path(train_config.run.out_dir)) if r["split"] == "train"]
    results = {
        "task": dataclasses.asdict(task.config),
        "parameters": model.num_parameters(),
        "train_seconds": round(train_seconds, 1),
        "final_train_loss": sum(loss for _, loss in losses[-10:]) / len(losses[-10:]),
        "mse_by_examples": curves,
        "mean_mse": {name: sum(c) / len(c) for name, c in curves.items()},
    }
    return Result(results, {"table.md": lambda r: curve_table(curves, config.d_in)},
                  {"regression_demo.png": lambda r: plot(curves, losses, config)})


def curve_table(curves: dict[str, list[float]], d_in: int) -> str:
    names = list(curves)
    n = len(curves[names[0]])
    shown = sorted({0, 1, 2, 4, d_in // 2, d_in, d_in + 1, d_in + 2, 2 * d_in, n - 1} & set(range(n)))
    return "\n".join(markdown_table(["in-context examples", *names], [[k, *(f"{curves[name][k]:.3f}" for name in names)] for k in shown])) + "\n"


def plot(curves: dict[str, list[float]], losses: list[tuple[int, float]], config: RegressionDemoConfig):
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4))
    for name, curve in curves.items():
        left.plot(range(len(curve)), curve, label=name, marker="o" if name == "transformer" else None, markersize=3)
    left.axvline(config.d_in + 1, color="grey", linestyle=":", label=f"d_in + 1 = {config.d_in + 1}")
    left.set(yscale="log", xlabel="in-context examples seen", ylabel="squared error vs. clean target",
             title=f"in-context linear regression (d_in={config.d_in}, noise={config.noise})")
    left.legend()
    right.plot(*zip(*losses))
    right.set(yscale="log", xlabel="step", ylabel="training loss (mean over 10 steps)", title="training")
    fig.tight_layout()
    return fig
