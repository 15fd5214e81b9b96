"""Approximate ICLCA for softmax attention (the paper's sec. 6.4 and Algorithm 2, corrected).

The prompt runs through the model exactly (its tokens attend with ordinary softmax). At every layer its keys
and values are then absorbed into FAVOR+ random-feature sums (b_KV, b_D), and the query's tokens attend to
the prompt through those features while attending to each other exactly (ops/prefix_attention.py). With m
features the relative error of each attention weight falls like 1/sqrt(m); the conversion costs one forward
pass over the prompt, and per query the memory no longer grows with the prompt (m x d per head instead of M x d).

features="favor" draws FAVOR+ random features; features=<folder> uses learned per-head feature maps trained by
attention distillation (train/attention_transfer.py), whose phi(q) . phi(k) targets the same exp(q.k * scale)
with far less error on a pretrained model's large-norm queries and keys.

Choices (specs/iclca.md): RoPE rotates keys and queries at their absolute positions before the feature map (the
estimate then targets the rotated model's own scores; the query keeps positions M, M+1, ..., as absolute
positions do); features are drawn once per layer, shared by heads, seeded, optionally orthogonal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models import Cache, Transformer
from ..ops.feature_maps import LearnedFeatures, draw_favor_projection
from ..ops.prefix_attention import FeaturePrefix, absorb_keys
from .base import AbsorbMethod, AdaptedModel
from ..train.attention_transfer import load_feature_maps
from .iclca import ConversionError


def convert_approximately(model: Transformer, prompt: torch.Tensor, *, n_features: int = 256,
                          orthogonal: bool = True, seed: int = 0, exact_sinks: int = 0,
                          maps: list[LearnedFeatures] | None = None) -> Cache:
    """Per layer, the prompt's keys/values as FAVOR+ sums (or sums of the learned `maps`, one per layer); the
    first `exact_sinks` prompt tokens stay exact keys (attention sinks: a token most heads attend to strongly
    makes the random-feature estimate noisy)."""
    c = model.config
    if c.attention != "softmax":
        raise ConversionError("the approximate conversion is for softmax attention; linear attention converts exactly (ICLCA)")
    if maps is not None and (len(maps) != c.n_layer or any(m.n_head != c.n_head or m.dim != c.dim_head for m in maps)):
        raise ConversionError(f"the learned feature maps ({len(maps)} layers, {maps[0].n_head if maps else 0} heads of "
                              f"dim {maps[0].dim if maps else 0}) do not fit this model ({c.n_layer} layers, "
                              f"{c.n_head} heads of dim {c.dim_head})")
    cache = Cache.empty(c.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    scale = 1.0 / c.dim_head**0.5 if c.scale_attn else 1.0
    groups = c.n_head // c.kv_heads
    layers = []
    for i, (k, v) in enumerate(cache.layers):
        projection, learned = None, None
        if maps is None:
            generator = torch.Generator().manual_seed(seed + i)
            projection = draw_favor_projection(n_features, c.dim_head, orthogonal=orthogonal, generator=generator,
                                               dtype=k.dtype).to(k.device)
        else:
            learned = maps[i].to(device=k.device, dtype=k.dtype)
        sink_k, sink_v = k[:, :, :exact_sinks], v[:, :, :exact_sinks]
        k, v = k[:, :, exact_sinks:].repeat_interleave(groups, dim=1), v[:, :, exact_sinks:].repeat_interleave(groups, dim=1)
        with torch.no_grad():
            prefix = absorb_keys(k, v, projection, scale, learned=learned)
        layers.append(prefix.extend(sink_k, sink_v) if exact_sinks else prefix)
    return Cache(layers=layers, position=cache.position)


class SoftmaxFeaturePrefix(AdaptedModel):
    """The base softmax model plus, per layer, the prompt's random-feature sums."""

    method = "iclca-approx"

    def __init__(self, base: Transformer, state: Cache):
        super().__init__(base)
        learned = [prefix.learned for prefix in state.layers]
        self.maps = nn.ModuleList(learned) if learned[0] is not None else None  # saved with the adapted model
        for i, prefix in enumerate(state.layers):
            # clones: slices of the prompt's cache would share storage (and safetensors refuses to save views)
            self.register_buffer(f"prefix_kv_{i}", prefix.kv.clone())
            self.register_buffer(f"prefix_d_{i}", prefix.normalizer.clone())
            self.register_buffer(f"prefix_scale_{i}", prefix.log_scale.clone())
            if prefix.projection is not None:
                self.register_buffer(f"projection_{i}", prefix.projection.clone())
            if prefix.k is not None:  # exact sink tokens
                self.register_buffer(f"sink_k_{i}", prefix.k.clone())
                self.register_buffer(f"sink_v_{i}", prefix.v.clone())
        self.position = state.position

    def state(self) -> Cache:
        layers = [FeaturePrefix(getattr(self, f"prefix_kv_{i}"), getattr(self, f"prefix_d_{i}"),
                                getattr(self, f"prefix_scale_{i}"), getattr(self, f"projection_{i}", None),
                                getattr(self, f"sink_k_{i}", None), getattr(self, f"sink_v_{i}", None),
                                self.maps[i] if self.maps is not None else None)
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
        maps = {"n_head": self.maps[0].n_head, "dim": self.maps[0].dim, "n_features": self.maps[0].n_features} if self.maps else None
        return {"position": self.position, "kv_shape": list(self.prefix_kv_0.shape), "learned": maps,
                "projection_shape": list(self.projection_0.shape) if maps is None else None, "sink_shape": sinks}

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "SoftmaxFeaturePrefix":
        b, h, m, d = extra["kv_shape"]
        sinks, learned = extra.get("sink_shape"), extra.get("learned")
        layers = []
        for _ in range(base.config.n_layer):  # placeholders; the saved tensors are loaded into them
            maps = LearnedFeatures(learned["n_head"], learned["dim"], learned["n_features"], scale=1.0) if learned else None
            layers.append(FeaturePrefix(torch.zeros(b, h, m, d), torch.zeros(b, h, m), torch.zeros(b, h, 1),
                                        None if learned else torch.zeros(extra["projection_shape"]),
                                        torch.zeros(sinks) if sinks else None, torch.zeros(sinks) if sinks else None, maps))
        return cls(base, Cache(layers=layers, position=extra["position"]))


class ICLCAApprox(AbsorbMethod):
    """Approximate prompt conversion for softmax attention through FAVOR+ random features (features="favor")
    or learned feature maps (features=<folder saved by train/attention_transfer.py>; n_features then comes from
    the maps)."""

    name = "iclca-approx"

    def __init__(self, n_features: int = 256, orthogonal: bool = True, seed: int = 0, exact_sinks: int = 0,
                 features: str = "favor"):
        self.n_features, self.orthogonal, self.seed, self.exact_sinks = n_features, orthogonal, seed, exact_sinks
        self.features = str(features)
        self.maps = None if self.features == "favor" else load_feature_maps(Path(self.features))

    needs = "softmax attention"
    batched = True

    def unsupported(self, model) -> str | None:
        if not isinstance(model, Transformer) or model.config.attention != "softmax":
            return "needs softmax attention; linear attention converts exactly (iclca)"
        return None

    def _absorb(self, model, prompt, loss_mask, train_queries) -> SoftmaxFeaturePrefix:
        state = convert_approximately(model, prompt, n_features=self.n_features, orthogonal=self.orthogonal,
                                      seed=self.seed, exact_sinks=self.exact_sinks, maps=self.maps)
        return SoftmaxFeaturePrefix(model, state)
