"""The task protocol: a task samples batches, scores a model's outputs, and offers baselines.

Models and baselines speak the same protocol: a Predictor maps `batch.inputs` to outputs shaped like a
model's ((B, T, V) logits for token tasks, (B, T, d_output) predictions for vector tasks), so
`task.evaluate(predictor(batch.inputs), batch)` scores either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

Predictor = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) int64 tokens, or (B, T, d_input) float vectors
    targets: torch.Tensor  # (B, T) int64 next-token ids, or (B, T, d_output) float
    mask: torch.Tensor  # (B, T) bool: positions that count for the loss and metrics
    info: dict[str, torch.Tensor] = field(default_factory=dict)  # task-specific ground truth

    @property
    def batch_size(self) -> int:
        return self.inputs.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            inputs=self.inputs.to(device),
            targets=self.targets.to(device),
            mask=self.mask.to(device),
            info={key: value.to(device) for key, value in self.info.items()},
        )


class Task(ABC):
    name: ClassVar[str]  # set by @register_task
    config_class: ClassVar[type]  # the task's own XConfig dataclass

    def __init__(self, config: Any | None = None):
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(self.config).__name__}"
            )

    @abstractmethod
    def model_io(self) -> dict[str, int]:
        """Transformer sizes: {"vocab_size": V} for token tasks, {"d_input": di, "d_output": do} for vector tasks."""

    @property
    @abstractmethod
    def sequence_length(self) -> int:
        """Length T of every sampled sequence."""

    @abstractmethod
    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A fresh batch; every random draw comes from `generator` (and lands on its device)."""

    @abstractmethod
    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Scalar training loss, a mean over the masked positions."""

    @abstractmethod
    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        """The task's own metrics for outputs shaped like a model's."""

    def baselines(self) -> dict[str, Predictor]:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


class TokenTask(Task):
    """A task on sequences of `config.seq_len` tokens with ids below `config.vocab_size`."""

    def model_io(self) -> dict[str, int]:
        return {"vocab_size": self.config.vocab_size}

    @property
    def sequence_length(self) -> int:
        return self.config.seq_len


# Config validation helpers: messages name the config field and the offending value.


def check_positive_int(config: Any, field_name: str) -> None:
    value = getattr(config, field_name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{type(config).__name__}.{field_name} must be a positive integer, got {value!r}")


def check_non_negative(config: Any, field_name: str) -> None:
    value = getattr(config, field_name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # `not >=` also rejects NaN
        raise ValueError(f"{type(config).__name__}.{field_name} must be a number >= 0, got {value!r}")
