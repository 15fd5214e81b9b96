"""Train many small runs at once: a model whose parameters carry a leading run axis (R, ...), plain SGD.

The loss is the SUM over runs of each run's mean loss, so each run's gradient is exactly its own (runs share no
parameters); the update is p <- (1 - decay) p - lr * grad per step, the multiplicative weight decay of the
authors' code (torch.optim.SGD's weight_decay adds decay * p to the gradient instead, which scales with lr).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .trainer import NonFiniteLossError


def per_run_cross_entropy(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """(R, B, C) logits, (R, B) answers -> (R,) mean cross-entropy of each run."""
    runs, batch = answers.shape
    return F.cross_entropy(logits.flatten(0, 1), answers.flatten(), reduction="none").view(runs, batch).mean(1)


def train_runs(
    model: nn.Module,
    sample: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    lr: float,
    decay: float = 0.0,
    evaluate: Callable[[int], dict] | None = None,
    eval_every: int = 0,
    progress: bool = True,
) -> list[dict]:
    """sample(step) -> (inputs (R, B, ...), answers (R, B)); evaluate(step) -> a record, called at step 0, every
    eval_every steps and at the end. Returns the evaluation records. Raises NonFiniteLossError naming the runs
    whose loss is not finite."""
    records = []
    if evaluate is not None:
        records.append(evaluate(0))
    bar = tqdm(range(1, steps + 1), desc="train runs", disable=not progress, mininterval=2.0)
    params = [p for p in model.parameters() if p.requires_grad]
    for step in bar:
        model.train()
        inputs, answers = sample(step)
        losses = per_run_cross_entropy(model(inputs), answers)
        if not torch.isfinite(losses).all():
            bad = torch.nonzero(~torch.isfinite(losses)).flatten().tolist()
            raise NonFiniteLossError(f"step {step}: loss is not finite for run(s) {bad} (losses {losses.tolist()})")
        grads = torch.autograd.grad(losses.sum(), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if decay:
                    p.mul_(1.0 - decay)
                p.add_(g, alpha=-lr)
        if step % 100 == 0:
            bar.set_postfix(loss=f"{float(losses.detach().mean()):.3f}")
        if evaluate is not None and eval_every and (step % eval_every == 0 or step == steps):
            records.append(evaluate(step))
            bar.set_postfix(loss=f"{float(losses.detach().mean()):.3f}", **_summary(records[-1]))
    return records


def _summary(record: dict) -> dict[str, str]:
    """Short progress-bar fields: the mean over runs of each accuracy in the record."""
    out = {}
    for name, values in record.get("accuracy", {}).items():
        if values:
            out[name] = f"{sum(values) / len(values):.2f}"
    return out


@torch.no_grad()
def evaluate_runs(model: nn.Module, eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]],
                  to_runs: Callable[[torch.Tensor], torch.Tensor] = lambda x: x, chunk: int = 500) -> dict:
    """Per named evaluation set ((S, N, ...) inputs, (S, N) answers; `to_runs` maps its S rows to the model's R
    runs): the accuracy and mean cross-entropy of every run, in chunks of `chunk` sequences (bounded memory)."""
    model.eval()
    record: dict[str, dict[str, list[float]]] = {"accuracy": {}, "loss": {}}
    for name, (inputs, answers) in eval_sets.items():
        n = answers.shape[1]
        correct, losses = [], []
        for start in range(0, n, chunk):
            x, y = to_runs(inputs[:, start:start + chunk]), to_runs(answers[:, start:start + chunk])
            logits = model(x)
            correct.append((logits.argmax(-1) == y).float().sum(1))
            losses.append(per_run_cross_entropy(logits, y) * y.shape[1])
        record["accuracy"][name] = (sum(correct) / n).tolist()
        record["loss"][name] = (sum(losses) / n).tolist()
    return record


def first_crossing(steps: list[int], values: list[float], threshold: float) -> float:
    """The first step at which values exceed the threshold (NaN if never)."""
    for step, value in zip(steps, values):
        if value > threshold:
            return float(step)
    return math.nan
