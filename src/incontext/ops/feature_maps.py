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


# ----------------------------------------------------------------------------- learned (Hedgehog-style) features


class LearnedFeatures(nn.Module):
    """Trainable positive features of one layer, one map per query head for queries and one for keys
    (Hedgehog, Zhang et al. 2024; LoLCATs): in log space

        log phi(x) = [W x, -W x] - a |x|^2 + b        (W: m x d, a scalar, b: 2m, per head; 2m features)

    applied to queries and keys after RoPE (keys already repeated to the query heads, GQA). It starts as the
    antithetic FAVOR+ estimator of exp(q . k * scale) (W = sqrt(scale) P with P random orthogonal Gaussian rows,
    a = scale / 2, b = -log(2m) / 2), so training starts from the unbiased random-feature estimate and keeps its
    absolute scale: phi(q) . phi(k) targets exp(q . k * scale) itself, which the approximate conversion needs to
    mix feature terms with exact ones.
    """

    def __init__(self, n_head: int, dim: int, n_features: int, *, scale: float, seed: int = 0):
        super().__init__()
        if n_features < 2 or n_features % 2:
            raise ValueError(f"learned features come in +/- pairs: n_features must be even and >= 2, got {n_features}")
        m = n_features // 2
        generator = torch.Generator().manual_seed(seed)
        projection = torch.stack([draw_favor_projection(m, dim, orthogonal=True, generator=generator)
                                  for _ in range(n_head)]) * math.sqrt(scale)
        self.n_head, self.dim, self.n_features = n_head, dim, n_features
        self.weight_q = nn.Parameter(projection.clone())
        self.weight_k = nn.Parameter(projection.clone())
        self.quad_q = nn.Parameter(torch.full((n_head,), scale / 2))
        self.quad_k = nn.Parameter(torch.full((n_head,), scale / 2))
        self.bias_q = nn.Parameter(torch.full((n_head, n_features), -0.5 * math.log(n_features)))
        self.bias_k = nn.Parameter(torch.full((n_head, n_features), -0.5 * math.log(n_features)))
        # a per-head constant subtracted from the keys' log-features in linear attention: normalized attention
        # does not see it, and it keeps exp() in float range (set from the training data by the trainer)
        self.register_buffer("key_offset", torch.zeros(n_head))

    @staticmethod
    def _log(x, weight, quad, bias):
        projected = torch.einsum("bhtd,hmd->bhtm", x, weight.to(x.dtype))
        return (torch.cat([projected, -projected], dim=-1) - quad.to(x.dtype)[:, None, None] * x.pow(2).sum(-1, keepdim=True)
                + bias.to(x.dtype)[:, None, :])

    def log_q(self, q: torch.Tensor) -> torch.Tensor:
        """log phi(q) (B, H, T, 2m) for rotated queries (B, H, T, d)."""
        self._check(q)
        return self._log(q, self.weight_q, self.quad_q, self.bias_q)

    def log_k(self, k: torch.Tensor) -> torch.Tensor:
        """log phi(k) (B, H, T, 2m) for rotated keys repeated to the query heads (B, H, T, d)."""
        self._check(k)
        return self._log(k, self.weight_k, self.quad_k, self.bias_k)

    def phi_q(self, q: torch.Tensor) -> torch.Tensor:
        # a per-query constant cancels between the numerator and the normalizer: shift by the row's largest
        log_phi = self.log_q(q)
        return torch.exp(log_phi - log_phi.amax(-1, keepdim=True).detach())

    def phi_k(self, k: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.log_k(k) - self.key_offset.to(k.dtype)[:, None, None])

    def _check(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.n_head or x.shape[-1] != self.dim:
            raise ValueError(f"learned features expect (B, {self.n_head}, T, {self.dim}) inputs, got {tuple(x.shape)}")


def log_kernel(log_phi_q: torch.Tensor, log_phi_k: torch.Tensor) -> torch.Tensor:
    """log(phi(q_i) . phi(k_j)) (B, H, T, S) from log-features, through one matmul with per-row shifts."""
    shift_q = log_phi_q.amax(-1, keepdim=True).detach()
    shift_k = log_phi_k.amax(-1, keepdim=True).detach()
    kernel = torch.exp(log_phi_q - shift_q) @ torch.exp(log_phi_k - shift_k).transpose(-2, -1)
    return torch.log(kernel.clamp_min(torch.finfo(kernel.dtype).tiny)) + shift_q + shift_k.transpose(-2, -1)


def attention_distillation_losses(maps: LearnedFeatures, q: torch.Tensor, k: torch.Tensor, scale: float,
                                  splits: tuple[int | torch.Tensor | None, ...] = (None,)) -> list[torch.Tensor]:
    """KL divergence (the cross-entropy less the target's entropy, so 0 is perfect) from the causal softmax
    attention weights of rotated q, k (B, H, T, d; k repeated to the query heads) to the weights the features
    give, averaged over query rows; one loss per split, sharing the scores and the features.

    split=None: every key through the features (linear attention, normalized phi(q) . phi(k) weights).
    split=M: keys before M through the features, the others exact exp(q . k * scale), rows from M on (the
    approximate conversion of an M-token prompt); this one sees the features' absolute scale. A (B,) tensor of
    splits gives each window its own M (e.g. where its prompt ends)."""
    t = q.shape[-2]
    positions = torch.arange(t, device=q.device)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    exact = ((q @ k.transpose(-2, -1)) * scale).masked_fill(~causal, float("-inf"))
    log_target = torch.log_softmax(exact, dim=-1)
    approx = log_kernel(maps.log_q(q), maps.log_k(k)).masked_fill(~causal, float("-inf"))
    losses = []
    for split in splits:
        if isinstance(split, torch.Tensor):  # per window: every row, those before the window's split weighted 0
            split = split.to(q.device)[:, None, None, None]
            log_weights = torch.log_softmax(torch.where(positions < split, approx, exact), dim=-1)
            gap = (log_target - log_weights).masked_fill(~causal, 0.0)
            rows = (positions[:, None] >= split).to(q.dtype).expand(-1, q.shape[1], -1, -1)  # (B, H, T, 1)
            losses.append((log_target.exp() * gap * rows).sum() / rows.sum())
            continue
        first = 0 if split is None else split
        mixed = approx if split is None else torch.where(positions < split, approx, exact)
        log_weights = torch.log_softmax(mixed[..., first:, :], dim=-1)
        gap = (log_target[..., first:, :] - log_weights).masked_fill(~causal[first:], 0.0)
        losses.append((log_target[..., first:, :].exp() * gap).sum(-1).mean())
    return losses


def attention_distillation_loss(maps: LearnedFeatures, q: torch.Tensor, k: torch.Tensor, scale: float,
                                split: int | None = None) -> torch.Tensor:
    """One split's loss of `attention_distillation_losses`."""
    return attention_distillation_losses(maps, q, k, scale, (split,))[0]
