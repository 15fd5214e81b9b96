"""The CGT training objective (paper eq. 3, App. A.1):

    L' = eta L_task + (1 - eta) L_aux + w_C R_C + w_D R_D  [+ beta KL(q(y) || GP prior) for the VAE variant]
         [+ w_P R_P, the distribution-matching regulariser of App. A.2]

- L_task: the task's loss (cross-entropy, or L2 for regression) of the dynamic pass.
- L_aux: cut each sequence at `aux_cuts` random points s; the x-only model with the context frozen at
  y~ = y^l_{s-1} (taken from the dynamic pass, NOT detached: gradients flow into y) reads the chunk that
  starts at s alone, positions restarting at 0. All chunks of a sequence run in ONE pass: a block-diagonal
  causal mask keeps chunks apart, position ids restart per chunk, each position gets its chunk's y~. The
  tokens before the first cut are not scored. `aux_horizon` (Delta) scores only the first Delta + 1 tokens
  of each chunk.
- R_C = mean_s zeta(s) ||n_s - n_{s-1}||^2 and R_D = mean_{s,a,b} zeta(s) (n_s^a . n_s^b - delta_ab)^2 with
  n = y / ||y|| and a, b two sequences of the batch; zeta is a position profile (constant by default).
- KL: exact Gaussian KL per y dimension between q = N(mu_s, sigma_s^2) (independent positions) and the GP
  prior N(0, K) over positions, K = nu I + (1 - nu) RBF(lambda) or the ICL kernel K_st = 1 + eps^2 min(s,t)/(st)
  (eq. 1), summed over dimensions and divided by the number of positions (a per-token loss like the CE).
- R_P (App. A.2, eq. 8's Gaussian-process example): y's batch statistics matched to a stationary zero-mean GP,
  R_P = (1/N) sum_s ||mu_s||^2 + (1/N^2) sum_{s,t,i,j} (<dy_si dy_tj> - K_|s-t| delta_ij)^2, mu_s = <y_s> and
  dy = y - mu over the batch, K the prior's kernel (rbf); on `rp_positions` positions drawn at random each step
  (the paper's suggested saving), all of them when the sequence is no longer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from ..config import check_choices


class GuidedModel(Protocol):
    """What the objective needs of a model (the CGT, the CGT adapter: they import this module, not it them): `run`
    returns the dynamic pass's outputs with `.logits`, `.y` and, for a VAE, `.mu` and `.logvar`; a call with a
    frozen context `y` (per position) gives the x-only outputs of the auxiliary chunks."""

    config: Any  # has `vae`

    def run(self, inputs: torch.Tensor, *, generator: torch.Generator | None = None) -> Any: ...

    def __call__(self, inputs: torch.Tensor, *, y: torch.Tensor, positions: torch.Tensor,
                 segments: torch.Tensor) -> torch.Tensor: ...


@dataclass
class CGTLossConfig:
    eta: float = 0.5  # weight of the dynamic-pass loss; 1 - eta goes to the auxiliary loss
    aux_cuts: int = 4  # truncation points per sequence in the auxiliary pass
    aux_min_start: int = 2  # earliest cut (the prompt before it is never empty)
    aux_horizon: int | None = None  # Delta: score the first Delta + 1 tokens of each chunk; None = the whole chunk
    w_c: float = 0.0  # continuity regulariser R_C
    w_d: float = 0.0  # decorrelation regulariser R_D
    profile: Literal["constant", "linear", "quadratic"] = "constant"  # zeta(s), normalised to mean 1
    beta: float = 0.0  # VAE: weight of the KL term (the model needs vae: true)
    prior: Literal["rbf", "icl"] = "rbf"
    prior_nugget: float = 0.03  # nu
    prior_length: float = 0.1  # lambda as a fraction of the sequence length
    prior_eps: float = 1.0  # eps of the ICL kernel
    w_p: float = 0.0  # the distribution-matching regulariser R_P (App. A.2), with the prior's kernel
    rp_positions: int = 64  # R_P's positions drawn per step (all when the sequence is no longer)

    def __post_init__(self):
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"CGTLossConfig.eta must lie in [0, 1], got {self.eta}")
        for name in ("w_c", "w_d", "beta", "w_p"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"CGTLossConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.rp_positions < 2:
            raise ValueError(f"CGTLossConfig.rp_positions must be >= 2, got {self.rp_positions}")
        if self.aux_cuts < 1 or self.aux_min_start < 1:
            raise ValueError(f"CGTLossConfig.aux_cuts and aux_min_start must be >= 1, got {self.aux_cuts}, {self.aux_min_start}")
        if self.aux_horizon is not None and self.aux_horizon < 0:
            raise ValueError(f"CGTLossConfig.aux_horizon must be >= 0 or null, got {self.aux_horizon}")
        check_choices(self)
        if not (0.0 < self.prior_nugget <= 1.0 and self.prior_length > 0 and self.prior_eps > 0):
            raise ValueError("CGTLossConfig: prior_nugget must lie in (0, 1], prior_length and prior_eps must be > 0")


# ----------------------------------------------------------------------------- auxiliary loss


@dataclass
class AuxChunks:
    """Chunks of the auxiliary pass, all (B, T): chunk id (0 = before the first cut, not scored), position
    inside the chunk, the position whose context the chunk uses (its start - 1), and which tokens are scored."""

    segments: torch.Tensor
    positions: torch.Tensor
    context_at: torch.Tensor
    scored: torch.Tensor


def sample_aux_chunks(batch: int, length: int, cuts: int, generator: torch.Generator, *, min_start: int = 2,
                      horizon: int | None = None, device=None) -> AuxChunks:
    """`cuts` distinct random cut points per sequence in [min_start, length - 1]."""
    candidates = length - min_start
    if candidates < 1:
        raise ValueError(f"sequences of length {length} leave no cut point at or after aux_min_start={min_start}")
    cuts = min(cuts, candidates)
    scores = torch.rand(batch, candidates, generator=generator, device=generator.device).to(device)
    starts = min_start + scores.topk(cuts, dim=1).indices  # distinct cut points per row
    is_start = torch.zeros(batch, length, dtype=torch.bool, device=device)
    is_start.scatter_(1, starts, True)
    index = torch.arange(length, device=device).expand(batch, -1)
    segments = is_start.long().cumsum(dim=1)
    chunk_start = torch.where(is_start, index, torch.zeros_like(index)).cummax(dim=1).values
    positions = index - chunk_start
    scored = segments > 0
    if horizon is not None:
        scored &= positions <= horizon
    return AuxChunks(segments, positions, (chunk_start - 1).clamp_min(0), scored)


def aux_outputs(model: GuidedModel, inputs: torch.Tensor, y: torch.Tensor, chunks: AuxChunks) -> torch.Tensor:
    """Outputs of the x-only model on every chunk at once, each chunk with its frozen context y~ (from `y`,
    the dynamic pass's (B, T, d_y) contexts; gradients flow back into them)."""
    y_tilde = torch.gather(y, 1, chunks.context_at[..., None].expand(-1, -1, y.shape[-1]))
    return model(inputs, y=y_tilde, positions=chunks.positions, segments=chunks.segments)


# ----------------------------------------------------------------------------- regularisers


def position_profile(length: int, kind: str, device=None, dtype=torch.float32) -> torch.Tensor:
    """zeta(s) for s = 0..length-1, normalised to mean 1: constant, or growing linearly or quadratically."""
    s = torch.arange(1, length + 1, device=device, dtype=dtype)
    zeta = {"constant": torch.ones_like(s), "linear": s, "quadratic": s**2}[kind]
    return zeta / zeta.mean()


def _unit(y: torch.Tensor) -> torch.Tensor:
    return y / y.norm(dim=-1, keepdim=True).clamp_min(1e-8)


def continuity_penalty(y: torch.Tensor, profile: str = "constant") -> torch.Tensor:
    """R_C = mean over sequences and s >= 1 of zeta(s) ||n_s - n_{s-1}||^2 (y: (B, T, d_y))."""
    n = _unit(y)
    zeta = position_profile(y.shape[1], profile, y.device, y.dtype)[1:]
    return ((n[:, 1:] - n[:, :-1]).square().sum(-1) * zeta).mean()


def decorrelation_penalty(y: torch.Tensor, profile: str = "constant") -> torch.Tensor:
    """R_D = mean over s, a, b of zeta(s) (n_s^a . n_s^b - delta_ab)^2 across the batch (y: (B, T, d_y))."""
    n = _unit(y).transpose(0, 1)  # (T, B, d)
    gram = n @ n.transpose(1, 2)  # (T, B, B)
    eye = torch.eye(y.shape[0], device=y.device, dtype=y.dtype)
    zeta = position_profile(y.shape[1], profile, y.device, y.dtype)
    return ((gram - eye).square().mean(dim=(1, 2)) * zeta).mean()


def distribution_matching_penalty(y: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """R_P (App. A.2): (1/N) sum_s ||<y_s>||^2 + (1/N^2) sum_{s,t,i,j} (<dy_si dy_tj> - K_st delta_ij)^2, the
    averages <.> over the batch; y (B, N, d), kernel (N, N) the positions' prior covariance."""
    mean = y.mean(0)  # (N, d)
    centred = y - mean
    covariance = torch.einsum("bsi,btj->stij", centred, centred) / y.shape[0]
    eye = torch.eye(y.shape[-1], device=y.device, dtype=y.dtype)
    target = kernel.to(y.dtype)[:, :, None, None] * eye
    n = y.shape[1]
    return mean.square().sum() / n + (covariance - target).square().sum() / n**2


# ----------------------------------------------------------------------------- VAE prior


def prior_kernel(length: int, kind: str, *, nugget: float = 0.03, length_scale: float = 0.1, eps: float = 1.0,
                 dtype=torch.float64) -> torch.Tensor:
    """The GP prior covariance over positions 1..length: RBF + nugget, or the ICL kernel of eq. (1)."""
    s = torch.arange(1, length + 1, dtype=dtype)
    if kind == "rbf":
        lam = length_scale * length
        rbf = torch.exp(-(s[:, None] - s[None, :]).square() / (2 * lam**2))
        return nugget * torch.eye(length, dtype=dtype) + (1 - nugget) * rbf
    if kind == "icl":
        return 1 + eps**2 * torch.minimum(s[:, None], s[None, :]) / (s[:, None] * s[None, :])
    raise ValueError(f"unknown prior kernel {kind!r}; use 'rbf' or 'icl'")


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, diag exp(logvar)) || N(0, K)) per sequence, summed over the d_y dimensions: (B,).

    mu, logvar (B, T, d); kernel (T, T). Per dimension: 0.5 [tr(K^-1 S) + mu^T K^-1 mu - T + log|K| - log|S|].
    """
    t = mu.shape[1]
    chol = torch.linalg.cholesky(kernel.to(torch.float64))
    inverse = torch.cholesky_inverse(chol).to(mu.dtype)
    logdet = 2 * chol.diagonal().log().sum().to(mu.dtype)
    trace = (inverse.diagonal()[None, :, None] * logvar.exp()).sum(dim=(1, 2))
    quadratic = torch.einsum("bsd,st,btd->b", mu, inverse, mu)
    d = mu.shape[-1]
    return 0.5 * (trace + quadratic - d * t + d * logdet - logvar.sum(dim=(1, 2)))


# ----------------------------------------------------------------------------- the objective


def cgt_loss(model: GuidedModel, inputs: torch.Tensor, task_loss: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
             config: CGTLossConfig, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its parts. `task_loss(outputs, scored)` is the task's loss of outputs shaped like the
    model's, over the task's own mask and, when `scored` (B, T) is given, those positions only."""
    if config.beta > 0 and not model.config.vae:
        raise ValueError("CGTLossConfig.beta > 0 needs a VAE model (model.vae: true)")
    out = model.run(inputs, generator=generator)
    main = task_loss(out.logits, None)
    total, parts = config.eta * main, {"loss_task": float(main.detach())}
    if config.eta < 1:
        chunks = sample_aux_chunks(inputs.shape[0], inputs.shape[1], config.aux_cuts, generator,
                                   min_start=config.aux_min_start, horizon=config.aux_horizon, device=inputs.device)
        aux = task_loss(aux_outputs(model, inputs, out.y, chunks), chunks.scored)
        total = total + (1 - config.eta) * aux
        parts["loss_aux"] = float(aux.detach())
    y = out.y.float()
    if config.w_c > 0:
        r_c = continuity_penalty(y, config.profile)
        total, parts["r_c"] = total + config.w_c * r_c, float(r_c.detach())
    if config.w_d > 0:
        r_d = decorrelation_penalty(y, config.profile)
        total, parts["r_d"] = total + config.w_d * r_d, float(r_d.detach())
    if config.w_p > 0:
        t = inputs.shape[1]
        kernel = prior_kernel(t, config.prior, nugget=config.prior_nugget, length_scale=config.prior_length,
                              eps=config.prior_eps).to(inputs.device)
        if t > config.rp_positions:  # a random subset of positions, the kernel's rows and columns with them
            keep = torch.randperm(t, generator=generator, device=generator.device)[: config.rp_positions].sort().values
            keep = keep.to(inputs.device)
            sampled, kernel = y[:, keep], kernel[keep][:, keep]
        else:
            sampled = y
        r_p = distribution_matching_penalty(sampled, kernel)
        total, parts["r_p"] = total + config.w_p * r_p, float(r_p.detach())
    if config.beta > 0:
        kernel = prior_kernel(inputs.shape[1], config.prior, nugget=config.prior_nugget,
                              length_scale=config.prior_length, eps=config.prior_eps).to(inputs.device)
        kl = gaussian_kl(out.mu.float(), out.logvar.float(), kernel).mean() / inputs.shape[1]
        total, parts["kl"] = total + config.beta * kl, float(kl.detach())
    return total, parts
