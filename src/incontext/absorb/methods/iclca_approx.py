"""Approximate ICLCA for softmax attention (the paper's sec. 6.4 and Algorithm 2, corrected).

The prompt runs through the model exactly (its tokens attend with ordinary softmax). At every layer its keys
and values are then absorbed into FAVOR+ random-feature sums (b_KV, b_D), and the query's tokens attend to
the prompt through those features while attending to each other exactly (ops/prefix_attention.py). With m
features the relative error of each attention weight falls like 1/sqrt(m); the conversion costs one forward
pass over the prompt, and per query the memory no longer grows with the prompt (m x d per head instead of M x d).

features="favor" draws FAVOR+ random features; features=<folder> uses learned per-head feature maps trained by
attention distillation (train/attention_transfer.py), whose phi(q) . phi(k) targets the same exp(q.k * scale)
with far less error on a pretrained model's large-norm queries and keys.

layers="0-14" (say) converts only those layers; the others keep the prompt's exact keys and values. This hybrid
trades memory for fidelity and locates where a conversion loses what the prompt carries (README: which layers cost
the facts).

Choices (specs/iclca.md): RoPE rotates keys and queries at their absolute positions before the feature map (the
estimate then targets the rotated model's own scores; the query keeps positions M, M+1, ..., as absolute
positions do); features are drawn once per layer, shared by heads, seeded, optionally orthogonal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection

import torch
from torch import nn

from ...models import Cache
from ...models.lm import is_causal_lm

if TYPE_CHECKING:  # annotations only: the method runs on the model the protocol hands it
    from ...models import Transformer
from ...config import limit, option
from ...ops.feature_maps import LearnedFeatures, draw_favor_projection
from ...ops.prefix_attention import FeaturePrefix, absorb_layer
from ...train.attention_transfer import load_feature_maps
from ..protocol import AbsorbMethod, AdaptedModel, ConversionError


def convert_approximately(model: Transformer, prompt: torch.Tensor, *, n_features: int = 256,
                          orthogonal: bool = True, seed: int = 0, exact_sinks: int = 0,
                          maps: list[LearnedFeatures] | None = None,
                          layers: Collection[int] | None = None) -> Cache:
    """Per layer, the prompt's keys/values as FAVOR+ sums (or sums of the learned `maps`, one per layer); the
    first `exact_sinks` prompt tokens stay exact keys (attention sinks: a token most heads attend to strongly
    makes the random-feature estimate noisy). With `layers`, only those layers convert; the others keep the
    prompt's exact (k, v) cache."""
    c = model.config
    if c.attention != "softmax":
        raise ConversionError("the approximate conversion is for softmax attention; linear attention converts exactly (ICLCA)")
    if maps is not None and (len(maps) != c.n_layer or any(m.n_head != c.n_head or m.dim != c.dim_head for m in maps)):
        raise ConversionError(f"the learned feature maps ({len(maps)} layers, {maps[0].n_head if maps else 0} heads of "
                              f"dim {maps[0].dim if maps else 0}) do not fit this model ({c.n_layer} layers, "
                              f"{c.n_head} heads of dim {c.dim_head})")
    if layers is not None and (not layers or any(not 0 <= i < c.n_layer for i in layers)):
        raise ConversionError(f"layers must name at least one of the model's layers 0-{c.n_layer - 1}, got {sorted(layers)}")
    cache = Cache.empty(c.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    scale = 1.0 / c.dim_head**0.5 if c.scale_attn else 1.0
    groups = c.n_head // c.kv_heads
    states = []
    for i, (k, v) in enumerate(cache.layers):
        if layers is not None and i not in layers:
            states.append((k, v))
            continue
        projection, learned = None, None
        if maps is None:
            generator = torch.Generator().manual_seed(seed + i)
            projection = draw_favor_projection(n_features, c.dim_head, orthogonal=orthogonal, generator=generator,
                                               dtype=k.dtype).to(k.device)
        else:
            learned = maps[i].to(device=k.device, dtype=k.dtype)
        with torch.no_grad():
            states.append(absorb_layer(k, v, scale=scale, groups=groups, exact_sinks=exact_sinks,
                                       projection=projection, learned=learned))
    return Cache(layers=states, position=cache.position)


class SoftmaxFeaturePrefix(AdaptedModel):
    """The base softmax model plus, per layer, the prompt's feature sums (or, for layers left unconverted, its
    exact keys and values)."""

    method = "iclca-approx"

    def __init__(self, base: Transformer, state: Cache):
        super().__init__(base)
        converted = {i: prefix for i, prefix in enumerate(state.layers) if isinstance(prefix, FeaturePrefix)}
        if not converted:
            raise ConversionError("an approximate conversion needs at least one converted layer")
        learned = {str(i): prefix.learned for i, prefix in converted.items() if prefix.learned is not None}
        self.maps = nn.ModuleDict(learned) if learned else None  # saved with the adapted model
        for i, prefix in enumerate(state.layers):
            if i not in converted:  # kept exact: the prompt's (k, v)
                self.register_buffer(f"exact_k_{i}", prefix[0].clone())
                self.register_buffer(f"exact_v_{i}", prefix[1].clone())
                continue
            # clones: slices of the prompt's cache would share storage (and safetensors refuses to save views)
            self.register_buffer(f"prefix_kv_{i}", prefix.kv.clone())
            self.register_buffer(f"prefix_d_{i}", prefix.normalizer.clone())
            self.register_buffer(f"prefix_scale_{i}", prefix.log_scale.clone())
            if prefix.projection is not None:
                self.register_buffer(f"projection_{i}", prefix.projection.clone())
            if prefix.k is not None:  # exact sink tokens
                self.register_buffer(f"sink_k_{i}", prefix.k.clone())
                self.register_buffer(f"sink_v_{i}", prefix.v.clone())
        self.converted = sorted(converted)
        self.position = state.position

    def _layer_state(self, i: int):
        if i not in self.converted:
            return getattr(self, f"exact_k_{i}"), getattr(self, f"exact_v_{i}")
        return FeaturePrefix(getattr(self, f"prefix_kv_{i}"), getattr(self, f"prefix_d_{i}"),
                             getattr(self, f"prefix_scale_{i}"), getattr(self, f"projection_{i}", None),
                             getattr(self, f"sink_k_{i}", None), getattr(self, f"sink_v_{i}", None),
                             self.maps[str(i)] if self.maps is not None else None)

    def state(self) -> Cache:
        return Cache(layers=[self._layer_state(i) for i in range(self.base.config.n_layer)], position=self.position)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.state())

    def query_cache(self) -> Cache:
        return self.state()

    def generate(self, query: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        return self.base.generate(query, max_new_tokens, cache=self.state(), **kwargs)

    def extra_state(self) -> dict[str, Any]:
        first = self.converted[0]
        sink = getattr(self, f"sink_k_{first}", None)
        maps = self.maps[str(first)] if self.maps is not None else None
        learned = {"n_head": maps.n_head, "dim": maps.dim, "n_features": maps.n_features} if maps is not None else None
        exact = [i for i in range(self.base.config.n_layer) if i not in self.converted]
        return {"position": self.position, "kv_shape": list(getattr(self, f"prefix_kv_{first}").shape),
                "learned": learned, "projection_shape": None if learned else list(getattr(self, f"projection_{first}").shape),
                "sink_shape": list(sink.shape) if sink is not None else None, "exact_layers": exact,
                "exact_shape": list(getattr(self, f"exact_k_{exact[0]}").shape) if exact else None}

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "SoftmaxFeaturePrefix":
        b, h, m, d = extra["kv_shape"]
        sinks, learned = extra.get("sink_shape"), extra.get("learned")
        exact = set(extra.get("exact_layers") or ())  # saves from before hybrids convert every layer
        layers = []
        for i in range(base.config.n_layer):  # placeholders; the saved tensors are loaded into them
            if i in exact:
                layers.append((torch.zeros(extra["exact_shape"]), torch.zeros(extra["exact_shape"])))
                continue
            maps = LearnedFeatures(learned["n_head"], learned["dim"], learned["n_features"], scale=1.0) if learned else None
            layers.append(FeaturePrefix(torch.zeros(b, h, m, d), torch.zeros(b, h, m), torch.zeros(b, h, 1),
                                        None if learned else torch.zeros(extra["projection_shape"]),
                                        torch.zeros(sinks) if sinks else None, torch.zeros(sinks) if sinks else None, maps))
        return cls(base, Cache(layers=layers, position=extra["position"]))


def parse_layers(spec: str | int) -> list[int] | None:
    """"all" -> None (every layer); "0-9,20" -> [0, ..., 9, 20]. One-line ValueError on anything else."""
    text = str(spec).replace(" ", "")
    if text == "all":
        return None
    chosen: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            first, last = int(low), int(high) if high else int(low)
            if first < 0 or last < first:
                raise ValueError
            chosen.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"iclca-approx: layers must be 'all' or a list of layers and ranges like '0-9,20', "
                         f"got {spec!r}") from None
    return sorted(chosen)


@dataclass
class ICLCAApproxOptions:
    n_features: int = limit(256, min=1, help="FAVOR+ random features per head")
    orthogonal: bool = option(True, "orthogonal random features")
    seed: int = limit(0, min=0, help="their draw")
    exact_sinks: int = limit(1, min=0, help="the first n prompt tokens keep their exact keys and values")
    features: str = option("favor", "favor, or a folder of learned feature maps (train/attention_transfer.py)")
    layers: str | int = option("all", "the layers converted (e.g. 0-14); the others keep the prompt's exact K/V")


class ICLCAApprox(AbsorbMethod):
    """Approximate prompt conversion for softmax attention through FAVOR+ random features (features="favor")
    or learned feature maps (features=<folder saved by train/attention_transfer.py>; n_features then comes from
    the maps); layers="all" or a list like "0-14" (the others keep the prompt's exact keys and values)."""

    name = "iclca-approx"
    Options = ICLCAApproxOptions

    def setup(self) -> None:
        self.options.layers = parse_layers(self.options.layers)
        self.options.features = str(self.options.features)
        self.maps = None if self.options.features == "favor" else load_feature_maps(Path(self.options.features))

    needs = "softmax attention (our Transformer, or a Hugging Face family that converts to it)"
    summary = "approximate conversion into FAVOR+ or learned feature sums (features=FOLDER; layers=0-14: only those layers)"
    batched = True

    needs_internals = True

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or getattr(model.config, "attention", None) != "softmax":
            return "needs softmax attention; linear attention converts exactly (iclca)"
        return None

    def _absorb(self, model, given) -> SoftmaxFeaturePrefix:
        prompt, o = given.prompt, self.options
        state = convert_approximately(model, prompt, n_features=o.n_features, orthogonal=o.orthogonal, seed=o.seed,
                                      exact_sinks=o.exact_sinks, maps=self.maps, layers=o.layers)
        return SoftmaxFeaturePrefix(model, state)
