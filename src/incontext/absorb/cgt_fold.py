"""CGT folding: freeze the context y at the end of a prompt and fold every T(.; y) into the next linear layer.

With y constant, each stage-2 operator is affine, T h = h + L R_x^T h + L r_b (R = [R_x; r_b^T]), so the linear
layer (W, b) that reads T h (the fused qkv, or the MLP's fc_in) becomes

    W' = W + (W L) R_x^T,    b' = b + W L r_b.

The result is an ordinary `Transformer` of width d_x: the x-only model plus a rank-r update per stage-2 linear
layer, i.e. a LoRA adapter with B = W L, A = R_x^T and a bias B_b = W L r_b (interop/cgt_peft.py exports it).
The prompt is no longer in the context: queries start at position 0, as in the paper's specialised models.
"""

from __future__ import annotations

import torch

from ..models.cgt import CGT
from ..models.transformer import Cache, Transformer
from .base import AbsorbMethod, AdaptedModel


def prompt_context(model: CGT, prompt: torch.Tensor) -> torch.Tensor:
    """The context y^l (d_y,) at the last token of one prompt ((T,) or (1, T) ids, or (1, T, d_input) vectors)."""
    if model.config.tokens and prompt.dim() == 1:
        prompt = prompt[None]
    if prompt.shape[0] != 1:
        raise ValueError(f"fold one prompt at a time (a folded model has one set of weights); got batch {prompt.shape[0]}")
    return model.context(prompt)[0, -1]


def lora_factors(model: CGT, y: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each linear layer that reads a T output, named as in `Transformer`: (B, A, bias) with
    W' = W + B A and b' = b + bias, B = W L(y) (out x r), A = R_x(y)^T (r x d_x), bias = W L(y) r_b(y)."""
    if y.shape != (model.config.d_y,):
        raise ValueError(f"fold one context y of shape ({model.config.d_y},); got {tuple(y.shape)}")
    factors = {}
    for i, block in enumerate(model.blocks):
        if i < model.config.split_layer:
            continue
        for generator, linear, name in ((block.t_attn, block.attn.qkv, "attn.qkv"), (block.t_mlp, block.mlp.fc_in, "mlp.fc_in")):
            left, right = generator.factors(y)
            b_factor = linear.weight @ left  # (out, r)
            factors[f"blocks.{i}.{name}"] = (b_factor, right[:-1].T, b_factor @ right[-1])
    return factors


@torch.no_grad()
def fold(model: CGT, y: torch.Tensor) -> Transformer:
    """The ordinary Transformer equal to `model` run with the frozen context y (d_y,)."""
    folded = model.x_only_transformer()
    modules = dict(folded.named_modules())
    for name, (b_factor, a_factor, bias) in lora_factors(model, y.to(model.pos_emb.weight.dtype)).items():
        linear = modules[name]
        linear.weight += b_factor @ a_factor
        linear.bias += bias
    return folded


class FoldedContext(AdaptedModel):
    """A CGT with its prompt folded into the weights: an ordinary Transformer, queries start at position 0."""

    method = "cgt-fold"

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer)

    @classmethod
    def empty(cls, base, extra):
        return cls(base)


class CGTFold(AbsorbMethod):
    name = "cgt-fold"
    needs = "a CGT model"

    def unsupported(self, model) -> str | None:
        return None if isinstance(model, CGT) else f"needs a CGT model (a context stream), got {type(model).__name__}"

    def _absorb(self, model, prompt, loss_mask, train_queries) -> AdaptedModel:
        return FoldedContext(fold(model, prompt_context(model, prompt)))
