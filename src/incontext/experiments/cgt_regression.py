"""CGT Figure 4 (paper sec. 4.3, App. D.2): in-context linear regression with a frozen context.

Error against the clean target U x + b by the number of examples seen, for: the baseline Transformer (width
d_x), the CGT with dynamic y, the CGT with y frozen after k examples (k in `freeze_after`: y taken at the k-th
y token, examples 1..k dropped, the x-only model reads the rest with positions restarting), and ridge regression
(the Bayes-optimal reference). Diagnosis of the frozen y: `y_probe_r2` is how much of the task (U, b) a
linear map recovers from y at each freezing point (ridge fit on half of the sequences, R^2 on the other half):
low R^2 means y does not hold the task; high R^2 with a poor frozen MSE means the x-only model does not read it. Reduced scale by default (deviations from the paper: d_in 8 not 16, 40 points not
64, 4 layers with l = 3 not 8 with l = 7, d_x 64 / d_y 32 not 128 / 64).

Where the frozen y is read (`readout`): "y_token" (default) y^l at the k-th y token, which has read all k
examples; "x_token" y^l at the k-th x token (one label fewer); "mean" the mean of y^l over the k y tokens.
`aux_horizon` (Delta) limits the auxiliary loss to the first Delta + 1 tokens after each cut.
scripts/cgt_regression_pilots.py runs a grid of these settings through `train_models` and `evaluate`.

    incontext run cgt-regression [--set steps=4000]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..config import check_choices, choices
from ..outputs import Result, markdown_table, pyplot
from ..tasks.regression import Ridge, error_by_examples
from ..train.cgt_metrics import probe_r2
from ..train.fresh import train_fresh
from .common import CGTOptions
from .registry import register_experiment


@dataclass
class RegressionConfig(CGTOptions):
    d_in: int = 8
    n_points: int = 40
    noise: float = 0.1
    aux_horizon: int | None = None  # score only the first aux_horizon + 1 tokens of each auxiliary chunk
    readout: Literal["y_token", "x_token", "mean"] = "y_token"  # where the frozen y is read (module docstring)
    freeze_after: list[int] = field(default_factory=lambda: [5, 10, 20])
    eval_sequences: int = 1024

    def __post_init__(self):
        bad = [k for k in self.freeze_after if not 1 <= k < self.n_points]
        if bad:
            raise ValueError(f"freeze_after values {bad} must lie in [1, n_points={self.n_points})")
        check_choices(self)


READOUTS = choices(RegressionConfig)["readout"]  # the values of `readout` (scripts/cgt_regression_pilots.py runs each)


def frozen_context(contexts: torch.Tensor, k: int, readout: str) -> torch.Tensor:
    """The context (B, d_y) frozen after k examples from the per-position contexts (B, 2N, d_y)."""
    if readout == "y_token":
        return contexts[:, 2 * k - 1]
    if readout == "x_token":
        return contexts[:, 2 * k - 2]
    return contexts[:, 1 : 2 * k : 2].mean(1)


def settings(config: RegressionConfig, cgt: bool) -> dict:
    if cgt:
        model, loss = config.cgt_sections()
        if config.aux_horizon is not None:
            loss["aux_horizon"] = config.aux_horizon
    else:
        model, loss = config.baseline_model(), {}
    task = {"name": "linear_regression", "d_in": config.d_in, "n_points": config.n_points, "noise": config.noise}
    return config.trainer_sections(task, model, loss)


def train_models(config: RegressionConfig, out_dir: Path, baseline: bool = True):
    """Trains the baseline (unless `baseline=False`) and the CGT into out_dir; returns (baseline or None, cgt,
    the task)."""
    base = train_fresh(out_dir / "baseline", settings(config, cgt=False))[0] if baseline else None
    cgt, train_config, _ = train_fresh(out_dir / "cgt", settings(config, cgt=True))
    return base, cgt, train_config.build_task()


def evaluate(baseline, cgt, task, config: RegressionConfig) -> dict:
    """Error curves by examples seen (baseline when given, CGT dynamic, frozen after each k, ridge) on
    `eval_sequences` fresh sequences, and the probe R^2 of the task from each frozen y."""
    batch = task.sample(config.eval_sequences, torch.Generator().manual_seed(config.seed + 777))
    clean = batch.info["clean"]
    curves: dict[str, list[float | None]] = {}
    with torch.no_grad():
        if baseline is not None:
            curves["baseline"] = error_by_examples(baseline(batch.inputs), clean).tolist()
        curves["cgt dynamic"] = error_by_examples(cgt(batch.inputs), clean).tolist()
        contexts = cgt.context(batch.inputs)
        for k in config.freeze_after:
            # y read after k examples; the model then reads examples k+1.. alone
            rest = cgt(batch.inputs[:, 2 * k :], y=frozen_context(contexts, k, config.readout))
            curves[f"cgt frozen after {k}"] = [None] * k + error_by_examples(rest, clean[:, 2 * k :]).tolist()
        curves["ridge"] = error_by_examples(Ridge(lam=config.noise**2)(batch.inputs), clean).tolist()
        task_vectors = torch.cat([batch.info["U"].flatten(1), batch.info["b"]], dim=1)
        probe = {str(k): probe_r2(frozen_context(contexts, k, config.readout), task_vectors) for k in config.freeze_after}
    return {"mse_by_examples": curves, "y_probe_r2": probe}


@register_experiment("cgt-regression", "CGT Fig. 4: linear regression error by examples, dynamic vs frozen y vs ridge", RegressionConfig)
def run(config: RegressionConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = evaluate(*train_models(config, out_dir), config)
    return Result(results, tables={"table.md": lambda r: table(r, config)},
                  figures={"cgt_regression.png": lambda r: plot(r["mse_by_examples"], config)})


def table(results: dict, config: RegressionConfig) -> str:
    curves, probe, n = results["mse_by_examples"], results["y_probe_r2"], config.n_points
    marks = sorted({*config.freeze_after, min(n - 1, 2 * max(config.freeze_after)), n - 1})
    lines = [(f"MSE against U x + b after k examples (d_in {config.d_in}, noise {config.noise}, {config.eval_sequences} "
             f"sequences; CGT {config.n_layer} layers, l = {config.split_layer}, d_x {config.d_x}, d_y {config.d_y}, "
             f"{config.steps} steps)."), ""]
    lines += markdown_table(["model", *(f"k={k}" for k in marks)],
                            [[name, *("–" if curve[k] is None else f"{curve[k]:.3f}" for k in marks)] for name, curve in curves.items()])
    return "\n".join(lines + ["", "Linear probe of the task (U, b) from the frozen y (held-out R^2): "
                              + ", ".join(f"after {k} examples {r2:.2f}" for k, r2 in probe.items()) + "."])


def plot(curves: dict, config: RegressionConfig):
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    for name, curve in curves.items():
        xs = [k for k, v in enumerate(curve) if v is not None]
        ax.plot(xs, [curve[k] for k in xs], label=name, ls="--" if name == "ridge" else "-")
    for k in config.freeze_after if "baseline" in curves else []:  # the baseline's error after k examples (the paper's lines)
        ax.axhline(curves["baseline"][k], color="gray", lw=0.6, ls=":")
    ax.set(yscale="log", xlabel="examples seen k", ylabel="MSE vs U x + b", title=f"linear regression, d_in = {config.d_in}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
