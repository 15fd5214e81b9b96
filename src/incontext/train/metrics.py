"""Metrics to a JSONL file (always) and TensorBoard (when installed and enabled), plus the loss plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fileio import strict_json


class MetricsLogger:
    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: JSONL is always written
                SummaryWriter = None
            if SummaryWriter is not None:
                self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": split, **values}
        with self.path.open("a") as handle:
            handle.write(strict_json(record, indent=None) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{split}/{key}", value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_losses(run_dir: Path, path: Path | None = None) -> Path | None:
    """Training and evaluation loss against step (log scale) from metrics.jsonl."""
    records = read_metrics(run_dir)
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train" and "loss" in r]
    evals = [(r["step"], r["loss"]) for r in records if r["split"] == "eval" and "loss" in r]
    if not train and not evals:
        return None
    try:
        import matplotlib
    except ImportError:  # a machine with only torch, transformers and peft (the device check): no plot
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train", alpha=0.8)
    if evals:
        ax.plot(*zip(*evals), marker="o", label="eval")
    ax.set(xlabel="step", ylabel="loss", yscale="log", title=Path(run_dir).name)
    ax.legend()
    fig.tight_layout()
    path = path or Path(run_dir) / "loss.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
