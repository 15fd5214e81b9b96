"""AMICL: the one-step associative memory model of in-context learning (Burns et al., sec. 2).

Keys = queries = (a x_{i-1} + x_i) / (a + 1) (x_0 := x_s, the zeroed final token); values = inputs. The final
token retrieves  projection(separation(similarity(K, q_s)), V)  over the earlier tokens (universal associative
memory framework, Millidge et al. 2022), with similarity dot | pearson | manhattan | euclidean (distances
negated) and separation identity | softmax | argmax; projection is the weighted sum of values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..config import check_choices


@dataclass
class AMICLModelConfig:
    a: float = 2.0
    similarity: Literal["dot", "pearson", "manhattan", "euclidean"] = "dot"
    separation: Literal["identity", "softmax", "argmax"] = "argmax"

    def __post_init__(self):
        check_choices(self)
        if self.a < 0:
            raise ValueError(f"a must be >= 0, got {self.a}")


def similarity(keys: torch.Tensor, query: torch.Tensor, kind: str) -> torch.Tensor:
    """Scores (B, N) of keys (B, N, D) against a query (B, D)."""
    if kind == "dot":
        return (keys * query[:, None]).sum(-1)
    if kind == "pearson":
        k = keys - keys.mean(-1, keepdim=True)
        q = query - query.mean(-1, keepdim=True)
        return (k * q[:, None]).sum(-1) / (k.norm(dim=-1) * q.norm(dim=-1)[:, None]).clamp_min(1e-12)
    if kind == "manhattan":
        return -(keys - query[:, None]).abs().sum(-1)
    return -(keys - query[:, None]).norm(dim=-1)


def separate(scores: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "identity":
        return scores
    if kind == "softmax":
        return torch.softmax(scores, dim=-1)
    return torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).to(scores.dtype)


class AMICL(nn.Module):
    """No parameters: forward(inputs (B, s, D)) -> outputs (B, s, D), the retrieved value at the last position."""

    def __init__(self, config: AMICLModelConfig | None = None):
        super().__init__()
        self.config = config or AMICLModelConfig()

    def keys(self, inputs: torch.Tensor) -> torch.Tensor:
        a = self.config.a
        previous = torch.roll(inputs, shifts=1, dims=1)  # x_{i-1}, with x_0 := x_s (the zeroed final token)
        return (a * previous + inputs) / (a + 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        keys = self.keys(inputs)
        scores = similarity(keys[:, :-1], keys[:, -1], self.config.similarity)  # the query is the last key
        weights = separate(scores, self.config.separation)
        outputs = torch.zeros_like(inputs)
        outputs[:, -1] = (weights[..., None] * inputs[:, :-1]).sum(1)
        return outputs
