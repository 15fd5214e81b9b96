"""The AMICL in-context classification sequences (Burns et al., sec. 2; token statistics of Reddy 2024).

A sequence holds s tokens, (object, label) pairs: o_1 l_1 o_2 l_2 ... o_{s/2} l_{s/2}. Every class c has a
fixed object mean mu_c and a fixed label vector l_c, all ~ N(0, 1/D) per component. An object token is
(mu_c + eps * eta) / sqrt(1 + eps^2) with eta ~ N(0, 1/D) fresh per instance; a label token is l_c itself.
The final pair's object belongs to a class that appeared earlier in the sequence, and its label token is
replaced by the zero vector: the model must fill it in from the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Batch, Task, check_positive_int
from .registry import register_task


@dataclass
class AMICLConfig:
    n_classes: int = 512  # K
    dim: int = 100  # D
    seq_len: int = 20  # s tokens: s / 2 (object, label) pairs, the last label zeroed
    eps: float = 0.1  # inter-instance variability of objects
    class_seed: int = 0  # the fixed class means and labels are drawn from this seed

    def __post_init__(self):
        for name in ("n_classes", "dim", "seq_len"):
            check_positive_int(self, name)
        if self.seq_len < 4 or self.seq_len % 2:
            raise ValueError(f"AMICLConfig.seq_len must be an even number >= 4, got {self.seq_len}")
        if self.n_classes < self.seq_len // 2 - 1:
            raise ValueError(f"AMICLConfig.n_classes={self.n_classes} is fewer than the {self.seq_len // 2 - 1} context pairs")
        if self.eps < 0:
            raise ValueError(f"AMICLConfig.eps must be >= 0, got {self.eps}")


@register_task("amicl")
class AMICLTask(Task):
    config_class = AMICLConfig

    def __init__(self, config: AMICLConfig | None = None):
        super().__init__(config)
        g = torch.Generator().manual_seed(self.config.class_seed)
        scale = 1.0 / math.sqrt(self.config.dim)
        self.object_means = torch.randn(self.config.n_classes, self.config.dim, generator=g) * scale
        self.labels = torch.randn(self.config.n_classes, self.config.dim, generator=g) * scale

    def model_io(self) -> dict[str, int]:
        return {"d_input": self.config.dim, "d_output": self.config.dim}

    @property
    def sequence_length(self) -> int:
        return self.config.seq_len

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        c = self.config
        pairs = c.seq_len // 2
        # distinct classes for the context pairs; the query repeats one of them
        context = torch.rand(batch_size, c.n_classes, generator=generator).argsort(dim=1)[:, : pairs - 1]
        pick = torch.randint(pairs - 1, (batch_size, 1), generator=generator)
        classes = torch.cat([context, context.gather(1, pick)], dim=1)  # (B, pairs)
        eta = torch.randn(batch_size, pairs, c.dim, generator=generator) / math.sqrt(c.dim)
        objects = (self.object_means[classes] + c.eps * eta) / math.sqrt(1 + c.eps**2)
        labels = self.labels[classes].clone()
        target = labels[:, -1].clone()
        labels[:, -1] = 0.0
        inputs = torch.stack([objects, labels], dim=2).reshape(batch_size, c.seq_len, c.dim)
        targets = torch.zeros_like(inputs)
        targets[:, -1] = target
        mask = torch.zeros(batch_size, c.seq_len, dtype=torch.bool)
        mask[:, -1] = True
        return Batch(inputs, targets, mask, {"classes": classes, "query_pair": pick[:, 0]})

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return (outputs - batch.targets)[batch.mask].pow(2).sum(-1).mean()

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float]:
        predicted, target = outputs[:, -1], batch.targets[:, -1]
        exact = (predicted - target).abs().amax(-1) <= 1e-6 * target.abs().amax(-1)
        nearest = (predicted @ self.labels.T).argmax(-1) == batch.info["classes"][:, -1]
        return {"accuracy": float(exact.float().mean()), "nearest_label_accuracy": float(nearest.float().mean())}
