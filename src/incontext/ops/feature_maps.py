"""Feature maps phi for kernelized (linear) attention: sim(q, k) = phi(q) . phi(k).

- identity: phi(x) = x (plain linear attention).
- elu: phi(x) = elu(x) + 1 (Katharopoulos et al. 2020), always positive.
- taylor: the second-order Taylor expansion of exp (the "Based" feature map, Arora et al. 2024),
  phi(x) = [1, x, vec(x x^T) / sqrt(2), 0], so phi(q) . phi(k) = 1 + q.k + (q.k)^2 / 2 >= 1/2 (always a positive
  normalizer); 2 + d + d^2 features, the trailing zero making the size even for RoPE.
- favor: Performer FAVOR+ positive random features (Choromanski et al. 2020),
  phi(x) = exp(W x - |x|^2 / 2) / sqrt(m), rows of W ~ N(0, I) (optionally block-orthogonal), so that
  E[phi(q) . phi(k)] = exp(q . k). The projection is fixed and seeded: it is a buffer, not a parameter.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FEATURE_MAPS = ("identity", "elu", "taylor", "favor")


def draw_favor_projection(
    n_features: int, dim: int, *, orthogonal: bool, generator: torch.Generator, dtype=torch.float32
) -> torch.Tensor:
    """W of shape (n_features, dim). Orthogonal: stacked blocks of random orthonormal rows, each row
    rescaled by the norm of a fresh Gaussian vector so the marginal of every row stays N(0, I)."""
    if not orthogonal:
        return torch.randn(n_features, dim, generator=generator, dtype=torch.float64).to(dtype)
    blocks, remaining = [], n_features
    while remaining > 0:
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gaussian)
        q = q * torch.sign(torch.diagonal(r))  # sign fix: Householder QR alone is not Haar-distributed
        blocks.append(q.T[: min(dim, remaining)])
        remaining -= dim
    rows = torch.cat(blocks, dim=0)
    norms = torch.randn(n_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (rows * norms).to(dtype)


class FavorFeatures(nn.Module):
    """Fixed positive random features; one projection shared by all heads of a layer (as in Performer)."""

    def __init__(self, dim: int, n_features: int, *, orthogonal: bool = True, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        projection = draw_favor_projection(n_features, dim, orthogonal=orthogonal, generator=generator)
        self.register_buffer("projection", projection)
        self.n_features = n_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No max-subtraction for stability: a data-dependent constant would break the equality of the
        # parallel, recurrent and cached forms (and exact prompt conversion).
        projected = x @ self.projection.to(x.dtype).T
        return torch.exp(projected - 0.5 * x.pow(2).sum(-1, keepdim=True)) / math.sqrt(self.n_features)


def apply_feature_map(x: torch.Tensor, kind: str, favor: FavorFeatures | None = None) -> torch.Tensor:
    if kind == "identity":
        return x
    if kind == "elu":
        return F.elu(x) + 1.0
    if kind == "taylor":
        second = (x[..., :, None] * x[..., None, :]).flatten(-2) * 2**-0.5
        ones = torch.ones_like(x[..., :1])
        return torch.cat([ones, x, second, torch.zeros_like(ones)], dim=-1)
    if kind == "favor":
        if favor is None:
            raise ValueError("the favor feature map needs its FavorFeatures module")
        return favor(x)
    raise ValueError(f"unknown feature map {kind!r}; choose one of {FEATURE_MAPS}")
