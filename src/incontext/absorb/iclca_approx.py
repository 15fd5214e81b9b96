"""Approximate ICLCA for softmax attention (the paper's sec. 6.4 and Algorithm 2, corrected).

The prompt runs through the model exactly (its tokens attend with ordinary softmax). At every layer its keys
and values are then absorbed into FAVOR+ random-feature sums (b_KV, b_D), and the query's tokens attend to
the prompt through those features while attending to each other exactly (ops/prefix_attention.py). With m
features the relative error of each attention weight falls like 1/sqrt(m); the conversion costs one forward
pass over the prompt, and per query the memory no longer grows with the prompt (m x d per head instead of M x d).

Choices (specs/iclca.md): RoPE rotates keys and queries at their absolute positions before the feature map (the
estimate then targets the rotated model's own scores; the query keeps positions M, M+1, ..., as absolute
positions do); features are drawn once per layer, shared by heads, seeded, optionally orthogonal.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models import Cache, Transformer
from ..ops.feature_maps import draw_favor_projection
from ..ops.prefix_attention import FeaturePrefix, absorb_keys
from .base import AbsorbMethod, AdaptedModel
from .iclca import ConversionError


def convert_approximately(model: Transformer, prompt: torch.Tensor, *, n_features: int = 256,
                          orthogonal: bool = True, seed: int = 0, exact_sinks: int = 0) -> Cache:
    """Per layer, the prompt's keys/values as FAVOR+ sums; the first `exact_sinks` prompt tokens stay exact
    keys (attention sinks: a token most heads attend to strongly makes the random-feature estimate noisy)."""
    c = model.config
    if c.attention != "softmax":
        raise ConversionError("the approximate conversion is for softmax attention; linear attention converts exactly (ICLCA)")
    cache = Cache.empty(c.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    scale = 1.0 / c.dim_head**0.5 if c.scale_attn else 1.0
    groups = c.n_head // c.kv_heads
    layers = []
    for i, (k, v) in enumerate(cache.layers):
        generator = torch.Generator().manual_seed(seed + i)
        projection = draw_favor_projection(n_features, c.dim_head, orthogonal=orthogonal, generator=generator,
                                           dtype=k.dtype).to(k.device)
        sink_k, sink_v = k[:, :, :exact_sinks], v[:, :, :exact_sinks]
        k, v = k[:, :, exact_sinks:].repeat_interleave(groups, dim=1), v[:, :, exact_sinks:].repeat_interleave(groups, dim=1)
        prefix = absorb_keys(k, v, projection, scale)
        layers.append(prefix.extend(sink_k, sink_v) if exact_sinks else prefix)
    return Cache(layers=layers, position=cache.position)


class SoftmaxFeaturePrefix(AdaptedModel):
    """The base softmax model plus, per layer, the prompt's random-feature sums."""

    method = "iclca-approx"

    def __init__(self, base: Transformer, state: Cache):
        super().__init__(base)
        for i, prefix in enumerate(state.layers):
            # clones: slices of the prompt's cache would share storage (and safetensors refuses to save views)
            self.register_buffer(f"prefix_kv_{i}", prefix.kv.clone())
            self.register_buffer(f"prefix_d_{i}", prefix.normalizer.clone())
            self.register_buffer(f"prefix_scale_{i}", prefix.log_scale.clone())
            self.register_buffer(f"projection_{i}", prefix.projection.clone())
            if prefix.k is not None:  # exact sink tokens
                self.register_buffer(f"sink_k_{i}", prefix.k.clone())
                self.register_buffer(f"sink_v_{i}", prefix.v.clone())
        self.position = state.position

    def state(self) -> Cache:
        layers = [FeaturePrefix(getattr(self, f"prefix_kv_{i}"), getattr(self, f"prefix_d_{i}"),
                                getattr(self, f"prefix_scale_{i}"), getattr(self, f"projection_{i}"),
                                getattr(self, f"sink_k_{i}", None), getattr(self, f"sink_v_{i}", None))
                  for i in range(self.base.config.n_layer)]
        return Cache(layers=layers, position=self.position)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.state())

    def query_cache(self) -> Cache:
        return self.state()

    def generate(self, query: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        return self.base.generate(query, max_new_tokens, cache=self.state(), **kwargs)

    def extra_state(self) -> dict[str, Any]:
        sinks = list(self.sink_k_0.shape) if hasattr(self, "sink_k_0") else None
        return {"position": self.position, "kv_shape": list(self.prefix_kv_0.shape),
                "projection_shape": list(self.projection_0.shape), "sink_shape": sinks}

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "SoftmaxFeaturePrefix":
        b, h, m, d = extra["kv_shape"]
        sinks = extra.get("sink_shape")
        layer = FeaturePrefix(torch.zeros(b, h, m, d), torch.zeros(b, h, m), torch.zeros(b, h, 1),
                              torch.zeros(extra["projection_shape"]),
                              torch.zeros(sinks) if sinks else None, torch.zeros(sinks) if sinks else None)
        return cls(base, Cache(layers=[layer] * base.config.n_layer, position=extra["position"]))


class ICLCAApprox(AbsorbMethod):
    """Approximate prompt conversion for softmax attention through FAVOR+ random features."""

    name = "iclca-approx"

    def __init__(self, n_features: int = 256, orthogonal: bool = True, seed: int = 0, exact_sinks: int = 0):
        self.n_features, self.orthogonal, self.seed, self.exact_sinks = n_features, orthogonal, seed, exact_sinks

    needs = "softmax attention"
    batched = True

    def unsupported(self, model) -> str | None:
        if not isinstance(model, Transformer) or model.config.attention != "softmax":
            return "needs softmax attention; linear attention converts exactly (iclca)"
        return None

    def _absorb(self, model, prompt, loss_mask, train_queries) -> SoftmaxFeaturePrefix:
        state = convert_approximately(model, prompt, n_features=self.n_features, orthogonal=self.orthogonal,
                                      seed=self.seed, exact_sinks=self.exact_sinks)
        return SoftmaxFeaturePrefix(model, state)
