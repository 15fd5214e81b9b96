"""ICLCA: exact conversion of a prompt into bias terms of a linear-attention transformer.

In kernelized attention a prompt X' of length M reaches later tokens only through two running sums per
layer and head, S = sum_j R_j phi(k_j) v_j^T and z = sum_j phi(k_j). One forward pass over the prompt gives
their final values; stored as bias terms

    b_KV = R_{-M} S_M,    b_D = z_M                      (Theorem 4.5, eqs. 14-15)

the biased model on a query alone equals the original model on [prompt; query] up to rounding. With RoPE the
query restarts at position 0 and the rotation R_{-M} re-aligns the prompt's keys; with absolute (learned)
positions the query keeps position ids M, M+1, ... instead. A bias is the recurrent view's initial state
(sec. 7): converting a second prompt on top of a first one is running it from that state (exact; summing two
independently converted biases is not).

Errata of the paper handled here (specs/iclca.md): the normalizer is the causal prefix sum (eq. 5); the
denominator is never rotated (eqs. 17, Alg. 2 step 8); R_{a+b} = R_a R_b (eq. 23); Algorithm 1 step (d) as
printed lets prompt tokens see the new bias (the whole prompt twice), which `algorithm_1(printed_step_d=True)`
reproduces as a negative control.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...models import Cache
from ...models.lm import is_causal_lm

if TYPE_CHECKING:  # annotations only: the method runs on the model the protocol hands it
    from ...models import Transformer
from ...ops import apply_rope, rope_cos_sin
from ..protocol import AbsorbMethod, AdaptedModel, ConversionError


def check_exactly_convertible(model: Transformer) -> None:
    c = model.config
    if c.attention != "linear":
        raise ConversionError(
            f"exact ICLCA conversion needs linear (kernelized) attention; this model uses attention={c.attention!r}, "
            "whose exp(q.k) does not factor through a fixed-size state. Use the approximate conversion "
            "(incontext.absorb.methods.iclca_approx, FAVOR+ random features) for softmax attention."
        )
    if model.training and (c.dropout > 0 or c.attn_dropout > 0):
        raise ConversionError("the model is in training mode with dropout: call model.eval() before converting")


def rotates_features(model: Transformer) -> bool:
    """RoPE on the features (eq. 12): the query restarts at 0 and the state rotates by R_{-M}. Learned features
    read queries and keys rotated at absolute positions instead: the state stays, the query keeps M, M+1, ..."""
    return model.config.positions == "rope" and model.config.feature_map != "learned"


def rotate_state(S: torch.Tensor, shift: int, model: Transformer) -> torch.Tensor:
    """R_shift S for a state S of shape (B, H, F, D): every column of S rotated in feature space."""
    cos, sin = rope_cos_sin(torch.tensor([shift], device=S.device), model.rope_dim, model.config.rope_theta, S.dtype)
    return apply_rope(S.transpose(-1, -2), cos, sin).transpose(-1, -2)


def convert(model: Transformer, prompt: torch.Tensor, initial: Cache | None = None) -> Cache:
    """Bias terms (as the initial decoding state) that make `model` behave as if `prompt` preceded the query.

    `initial` holds biases from earlier prompts (Theorem 4.5 with a pre-existing bias): the new prompt is run
    from them, so several prompts compose exactly in order.
    """
    check_exactly_convertible(model)
    cache = Cache(layers=list(initial.layers), position=initial.position) if initial else Cache.empty(model.config.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    if rotates_features(model):
        m = prompt.shape[1]
        # b_KV = R_{-M} S_M: rotating the final state (rather than writing R_{j-M} per key) avoids off-by-ones
        cache.layers = [(rotate_state(S, -m, model), z) for S, z in cache.layers]
        cache.position -= m
    return cache


class LinearAttentionBias(AdaptedModel):
    """The base model plus per-layer, per-head bias terms b_KV (B, H, F, D) and b_D (B, H, F).

    B is the number of prompts; a bias with B = 1 serves a batch of queries. `position` is where the query's
    position ids start (M for learned positions; 0 with RoPE, whose offset lives in the rotation).
    """

    method = "iclca"

    def __init__(self, base: Transformer, state: Cache):
        super().__init__(base)
        for i, (S, z) in enumerate(state.layers):
            self.register_buffer(f"bias_kv_{i}", S.detach().clone())
            self.register_buffer(f"bias_d_{i}", z.detach().clone())
        self.position = state.position

    def state(self) -> Cache:
        layers = [(getattr(self, f"bias_kv_{i}"), getattr(self, f"bias_d_{i}")) for i in range(self.base.config.n_layer)]
        return Cache(layers=layers, position=self.position)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.state())

    def query_cache(self) -> Cache:
        return self.state()

    def absorb_more(self, prompt: torch.Tensor) -> "LinearAttentionBias":
        """Convert a further prompt on top of this one (as if [earlier prompts; prompt] preceded the query)."""
        return LinearAttentionBias(self.base, convert(self.base, prompt, initial=self.state()))

    def extra_state(self) -> dict[str, Any]:
        S, z = self.state().layers[0]
        return {"position": self.position, "kv_shape": list(S.shape), "d_shape": list(z.shape)}

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "LinearAttentionBias":
        layers = [(torch.zeros(extra["kv_shape"]), torch.zeros(extra["d_shape"])) for _ in range(base.config.n_layer)]
        return cls(base, Cache(layers=layers, position=extra["position"]))


class ICLCA(AbsorbMethod):
    """Exact prompt-to-bias conversion for linear-attention transformers."""

    name = "iclca"
    needs = "linear attention"
    summary = "exact conversion into bias terms"
    batched = True
    needs_internals = True

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model):
            return f"needs linear attention (a causal LM), got {type(model).__name__}"
        try:
            check_exactly_convertible(model)
        except ConversionError as error:
            return str(error)
        return None

    def _absorb(self, model, given) -> LinearAttentionBias:
        prompt = given.prompt
        return LinearAttentionBias(model, convert(model, prompt))


# ----------------------------------------------------------------------------- the paper's algorithm, layer by layer


@torch.no_grad()
def algorithm_1(model: Transformer, prompt: torch.Tensor, *, printed_step_d: bool = False) -> Cache:
    """Algorithm 1 of the paper, layer by layer: propagate the prompt, take each layer's final state as its bias.

    printed_step_d=False (correct): the prompt tokens of layer l use the OLD biases and their causal prefix
    only; the result equals `convert`. printed_step_d=True (the erratum): after the bias of layer l is set,
    the prompt is propagated through layer l again WITH the new bias, so every prompt token sees the whole
    prompt twice; it is several percent off, and kept only as a negative control.
    """
    check_exactly_convertible(model)
    m = prompt.shape[1]
    x, rope = model.embed(prompt, 0)
    previous, layers = None, []
    for block in model.blocks:
        out, raw, (S, z) = block(x, rope, previous, None)
        if printed_step_d:
            out, raw, _ = block(x, rope, previous, (S, z))
        x, previous = out, raw
        layers.append((S, z))
    if rotates_features(model):
        return Cache(layers=[(rotate_state(S, -m, model), z) for S, z in layers], position=0)
    return Cache(layers=layers, position=m)
