"""AMICL (Burns et al., sec. 2): one-step associative-memory retrieval performing in-context classification.

Sweeps over the key-mixing weight a, the embedding dimension D and the sequence length s, and the grid of
similarity x separation functions, each over `trials` fresh sequences; plots and a table next to the paper's
reported values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import choices
from ..models.amicl import AMICL, AMICLModelConfig
from ..outputs import Result, markdown_table, pyplot
from ..tasks import get_task
from .registry import register_experiment

TARGETS = {"a=1": 0.33, "a=1.25": 0.91, "a=1.5": 0.99, "a=1.75": 1.0, "a=2": 1.0, "pearson, a=2": 0.85,
           "D=10": 0.72, "D=20": 0.94, "D=40": 0.998, "D=100": 1.0}
SIMILARITIES, SEPARATIONS = (choices(AMICLModelConfig)[name] for name in ("similarity", "separation"))  # the grid


@dataclass
class AMICLConfig:
    trials: int = 1000
    a_values: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5])
    dims: list[int] = field(default_factory=lambda: [10, 20, 40, 100])
    seq_lens: list[int] = field(default_factory=lambda: [10, 20, 50, 100, 400, 1000])
    seed: int = 0


def accuracy(task_options: dict, model_options: dict, trials: int, seed: int) -> float:
    task = get_task("amicl", **task_options)
    batch = task.sample(trials, torch.Generator().manual_seed(seed))
    return task.evaluate(AMICL(AMICLModelConfig(**model_options))(batch.inputs), batch)["accuracy"]


@register_experiment("amicl", "AMICL associative-memory ICL: sweeps over a, similarity x separation, D and length", AMICLConfig)
def run(config: AMICLConfig, out_dir: Path) -> Result:
    n, seed = config.trials, config.seed
    a_sweep = {sim: [accuracy({}, {"a": a, "similarity": sim}, n, seed) for a in config.a_values] for sim in ("dot", "pearson")}
    grid = {f"{sim}/{sep}": accuracy({}, {"a": 2.0, "similarity": sim, "separation": sep}, n, seed)
            for sim in SIMILARITIES for sep in SEPARATIONS}
    dims = {d: accuracy({"n_classes": 50, "dim": d}, {"a": 2.0}, n, seed) for d in config.dims}
    lengths = {s: accuracy({"seq_len": s}, {"a": 2.0}, n, seed) for s in config.seq_lens}
    ours = {f"a={a:g}": acc for a, acc in zip(config.a_values, a_sweep["dot"])}
    ours["pearson, a=2"] = grid["pearson/argmax"]
    ours.update({f"D={d}": acc for d, acc in dims.items()})
    results = {"a_sweep": a_sweep, "grid_a2": grid, "dims_K50_a2": dims, "seq_lens_a2": lengths, "targets": TARGETS}
    return Result(results, {"table.md": lambda r: table(ours, grid, lengths, n)}, {"amicl.png": plot})


def table(ours: dict[str, float], grid: dict[str, float], lengths: dict[int, float], n: int) -> str:
    lines = markdown_table([f"setting (K=512, D=100, s=20 unless said; {n} trials)", "ours", "paper", "binomial std"], [
        [f"{name}{' (K=50, a=2)' if name.startswith('D=') else ''}", f"{ours[name]:.3f}", f"~{target}",
         f"{(target * (1 - target) / n) ** 0.5:.3f}"] for name, target in TARGETS.items() if name in ours])  # else not swept
    lines += ["", "Similarity x separation at a = 2 (exact-copy accuracy):", ""]
    lines += markdown_table(["similarity", *SEPARATIONS], [[sim, *(f"{grid[f'{sim}/{sep}']:.3f}" for sep in SEPARATIONS)]
                                                           for sim in SIMILARITIES])
    lines += ["", "Sequence length (a = 2): " + ", ".join(f"s={s}: {acc:.3f}" for s, acc in lengths.items())]
    return "\n".join(lines) + "\n"


def plot(results: dict):
    fig, axes = pyplot().subplots(1, 3, figsize=(14, 4))
    a_values = results["config"]["a_values"]
    for sim, accs in results["a_sweep"].items():
        axes[0].plot(a_values, accs, marker="o", label=f"{sim} + argmax")
    axes[0].set(xlabel="a (weight of the previous token in keys/queries)", ylabel="ICL accuracy", title="K=512, D=100, s=20")
    axes[0].legend()
    dims = results["dims_K50_a2"]
    axes[1].plot([int(d) for d in dims], list(dims.values()), marker="o")
    axes[1].set(xscale="log", xlabel="embedding dimension D", ylabel="ICL accuracy", title="K=50, a=2")
    lengths = results["seq_lens_a2"]
    axes[2].plot([int(s) for s in lengths], list(lengths.values()), marker="o")
    axes[2].set(xscale="log", xlabel="sequence length s", ylabel="ICL accuracy", title="K=512, D=100, a=2", ylim=(0, 1.05))
    fig.tight_layout()
    return fig
