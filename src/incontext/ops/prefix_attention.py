"""Softmax attention whose earliest keys are absorbed into positive random features (ICLCA sec. 6.4).

The prompt's keys and values enter only through FAVOR+ sums, b_KV = sum_j phi(k_j) v_j^T and
b_D = sum_j phi(k_j), with phi(q) . phi(k) ~ exp(q . k * scale); later keys stay exact:

    o_i = [sum_{j<=i} exp(s_ij) v_j + phi(q_i)^T b_KV] / [sum_{j<=i} exp(s_ij) + phi(q_i)^T b_D]

Keys are rotated by RoPE at their absolute positions BEFORE the feature map, so the estimate targets the
rotated model's own scores exp((R_i q) . (R_j k) * scale). All terms are combined in log space: the prompt sums
are stored scaled by exp(-c) (c = their largest log-feature) and each row is shifted by its largest log-term,
which keeps exp() in range without changing the ratio (a per-row max taken on the exact scores alone would not
cancel against the feature terms).

The features are FAVOR+ (a projection) or a layer's learned maps (`LearnedFeatures`, one per query head, their
scale built in); both give log phi, and everything else is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .feature_maps import LearnedFeatures
from .softmax_attention import causal_mask


@dataclass
class FeaturePrefix:
    """A prompt absorbed into random features, for one layer; k, v hold the exact tokens seen after it."""

    kv: torch.Tensor  # (B, H, m, D): sum_j exp(log_phi(k_j) - c) v_j^T
    normalizer: torch.Tensor  # (B, H, m): sum_j exp(log_phi(k_j) - c)
    log_scale: torch.Tensor  # (B, H, 1): c
    projection: torch.Tensor | None  # (m, d): FAVOR+ directions (None with learned features)
    k: torch.Tensor | None = None  # (B, H_kv, P, d) exact keys after the prompt (rotated)
    v: torch.Tensor | None = None
    learned: LearnedFeatures | None = None  # the layer's learned maps, instead of FAVOR+

    def log_query_features(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        if self.learned is not None:
            return self.learned.log_q(q)
        return log_features(q * math.sqrt(scale), self.projection)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> "FeaturePrefix":
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return replace(self, k=k, v=v)

    def attend(self, q, k, v, *, scale, expand_kv):
        """The cache protocol of models.transformer (LayerState): attention over the absorbed prompt and the
        exact keys after it, new keys included; returns the output and the extended prefix."""
        extended = self.extend(k, v)
        out = prefix_softmax_attention(q, expand_kv(extended.k), expand_kv(extended.v), scale=scale, prefix=extended)
        return out, extended


def log_features(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """log phi(x) = W x - |x|^2 / 2 - log(m) / 2 (FAVOR+ positive features, in log space)."""
    m = projection.shape[0]
    return x @ projection.to(x.dtype).T - 0.5 * x.pow(2).sum(-1, keepdim=True) - 0.5 * math.log(m)


def absorb_keys(k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor | None, scale: float,
                learned: LearnedFeatures | None = None) -> FeaturePrefix:
    """Feature sums of keys k (B, H, M, d) and values v (B, H, M, D); k already rotated."""
    if learned is not None:
        log_phi = learned.log_k(k)
    else:
        log_phi = log_features(k * math.sqrt(scale), projection)  # exp(q.k*scale) = exp((q sqrt s).(k sqrt s))
    if log_phi.shape[-2] == 0:  # nothing to absorb
        c = log_phi.new_zeros(*log_phi.shape[:2], 1, 1)
    else:
        c = log_phi.amax(dim=(-2, -1), keepdim=True)  # (B, H, 1, 1)
    phi = torch.exp(log_phi - c)
    return FeaturePrefix(kv=phi.transpose(-2, -1) @ v, normalizer=phi.sum(-2), log_scale=c[..., 0], projection=projection,
                         learned=learned)


def absorb_layer(k: torch.Tensor, v: torch.Tensor, *, scale: float, groups: int = 1, exact_sinks: int = 0,
                 projection: torch.Tensor | None = None, learned: LearnedFeatures | None = None) -> FeaturePrefix:
    """One layer's cached prompt keys/values (B, H_kv, M, d), rotated, as a FeaturePrefix: the first `exact_sinks`
    tokens stay exact keys, the rest are repeated to the query heads (GQA) and absorbed into feature sums (the one
    path of the approximate conversion, used by absorb/iclca_approx and by the end-to-end tuning of learned maps)."""
    sink_k, sink_v = k[:, :, :exact_sinks], v[:, :, :exact_sinks]
    rest_k = k[:, :, exact_sinks:].repeat_interleave(groups, dim=1)
    rest_v = v[:, :, exact_sinks:].repeat_interleave(groups, dim=1)
    prefix = absorb_keys(rest_k, rest_v, projection, scale, learned=learned)
    return prefix.extend(sink_k, sink_v) if exact_sinks else prefix


def prefix_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, prefix: FeaturePrefix
) -> torch.Tensor:
    """q (B, H, T, d); k, v (B, H, P + T, d) the exact keys after the prompt (queries are the last T)."""
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    log_phi_q = prefix.log_query_features(q, scale) + prefix.log_scale[..., None]
    shift = torch.maximum(scores.amax(-1, keepdim=True), log_phi_q.amax(-1, keepdim=True))
    exact = torch.exp(scores - shift)
    approx = torch.exp(log_phi_q - shift)
    numerator = exact @ v + approx @ prefix.kv
    denominator = exact.sum(-1, keepdim=True) + (approx * prefix.normalizer[..., None, :]).sum(-1, keepdim=True)
    return numerator / denominator
