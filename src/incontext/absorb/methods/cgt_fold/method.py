"""CGT folding: freeze the context y at the end of a prompt and fold every T(.; y) into the next linear layer.

With y constant, each stage-2 operator is affine, T h = h + L R_x^T h + L r_b (R = [R_x; r_b^T]), so the linear
layer (W, b) that reads T h (the fused qkv, or the MLP's fc_in) becomes

    W' = W + (W L) R_x^T,    b' = b + W L r_b.

The result is an ordinary `Transformer` of width d_x: the x-only model plus a rank-r update per stage-2 linear
layer, i.e. a LoRA adapter with B = W L, A = R_x^T and a bias B_b = W L r_b (absorb/methods/cgt_fold/export.py exports it).
The prompt is no longer in the context: queries start at position 0, as in the paper's specialised models.

The same holds for a CGT adapter over a frozen pretrained model (models/cgt_adapter.py): its guided blocks' q/k/v
and gate/up projections get the rank-r update. A base without biases (Llama, SmolLM2) gets them: the folded model
is the base with bias=True, zero biases everywhere except the shifts W L r_b on q/k/v and gate/up (exported as a
LlamaForCausalLM with attention_bias = mlp_bias = True, or as a LoRA adapter with lora_bias: absorb/methods/cgt_fold/export.py).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch

from ....config import option
from ....models.cgt import CGT
from ....models.cgt_adapter import CGTAdapter
from ....models.lm import is_causal_lm
from ....models.transformer import Transformer
from ...protocol import AbsorbMethod, AdaptedModel, BaseAlone


@dataclasses.dataclass
class CGTFoldOptions:
    adapter: str = option("", "a folder of a CGT adapter trained on this model (a plain Transformer needs one)")


def _dtype(model: CGT | CGTAdapter) -> torch.dtype:
    return next(model.parameters()).dtype


def guided_linears(model: CGT | CGTAdapter) -> list[tuple[str, torch.nn.Module, torch.nn.Linear]]:
    """(name in the Transformer, generator T, linear layer reading T's output) for every stage-2 operator."""
    if isinstance(model, CGTAdapter):
        blocks = [(i, t_attn, t_mlp, model.base.blocks[i]) for i, t_attn, t_mlp in model.guided_layers()]
    else:
        blocks = [(i, b.t_attn, b.t_mlp, b) for i, b in enumerate(model.blocks) if i >= model.config.split_layer]
    return [pair for i, t_attn, t_mlp, block in blocks for pair in
            ((f"blocks.{i}.attn.qkv", t_attn, block.attn.qkv), (f"blocks.{i}.mlp.fc_in", t_mlp, block.mlp.fc_in))]


def prompt_context(model: CGT | CGTAdapter, prompt: torch.Tensor) -> torch.Tensor:
    """The context y^l (d_y,) at the last token of one prompt ((T,) or (1, T) ids, or (1, T, d_input) vectors)."""
    if getattr(model.config, "tokens", True) and prompt.dim() == 1:
        prompt = prompt[None]
    if prompt.shape[0] != 1:
        raise ValueError(f"fold one prompt at a time (a folded model has one set of weights); got batch {prompt.shape[0]}")
    return model.context(prompt)[0, -1]


def lora_factors(model: CGT | CGTAdapter, y: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each linear layer that reads a T output, named as in `Transformer`: (B, A, bias) with
    W' = W + B A and b' = b + bias, B = W L(y) (out x r), A = R_x(y)^T (r x d_x), bias = W L(y) r_b(y)."""
    if y.shape != (model.config.d_y,):
        raise ValueError(f"fold one context y of shape ({model.config.d_y},); got {tuple(y.shape)}")
    factors = {}
    with torch.no_grad():
        for name, generator, linear in guided_linears(model):
            left, right = generator.factors(y)
            b_factor = linear.weight @ left  # (out, r)
            factors[name] = (b_factor, right[:-1].T, b_factor @ right[-1])
    return factors


def biased_copy(base: Transformer) -> Transformer:
    """A copy of `base` with biases on every linear (zero where base has none): room for the folded shifts."""
    if base.config.bias:
        return copy.deepcopy(base).eval()
    reference = next(base.parameters())
    folded = Transformer(dataclasses.replace(base.config, bias=True)).to(device=reference.device, dtype=reference.dtype)
    missing, unexpected = folded.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(name.endswith(".bias") for name in missing), (missing, unexpected)
    with torch.no_grad():
        for name in missing:
            folded.get_parameter(name).zero_()
    return folded.eval()


@torch.no_grad()
def fold(model: CGT | CGTAdapter, y: torch.Tensor) -> Transformer:
    """The ordinary Transformer equal to `model` run with the frozen context y (d_y,)."""
    folded = biased_copy(model.base) if isinstance(model, CGTAdapter) else model.x_only_transformer()
    modules = dict(folded.named_modules())
    for name, (b_factor, a_factor, bias) in lora_factors(model, y.to(_dtype(model))).items():
        linear = modules[name]
        linear.weight += b_factor @ a_factor
        linear.bias += bias
    return folded


class FoldedContext(BaseAlone):
    """A CGT with its prompt folded into the weights: an ordinary Transformer, queries start at position 0."""

    method = "cgt-fold"


class CGTFold(AbsorbMethod):
    """Fold the context y at the end of the prompt into the weights. The model is a CGT or a CGT adapter, or a
    plain Transformer with `adapter` naming a folder of a CGT adapter trained on it (`CGTAdapter.save_guide`,
    e.g. results/cgt-pretrained/adapter for SmolLM2)."""

    name = "cgt-fold"
    Options = CGTFoldOptions
    needs = "a CGT model, or a CGT adapter trained on this model (option adapter=FOLDER)"
    summary = "its context vector folded into the weights"

    def setup(self) -> None:
        self.options.adapter = str(self.options.adapter)
        self.needs_internals = bool(self.options.adapter)  # the adapter guides our Transformer
        self._loaded: tuple[int, CGTAdapter] | None = None  # (id of the base, its adapter)

    def check_model(self, model) -> str | None:
        if isinstance(model, (CGT, CGTAdapter)):
            return None
        if is_causal_lm(model) and self.options.adapter:
            try:
                self._adapter_for(model)
            except (OSError, ValueError) as error:
                return f"the CGT adapter {self.options.adapter} does not apply: {error}"
            return None
        return f"needs a CGT model or a CGT adapter trained on this model (option adapter=FOLDER), got {type(model).__name__}"

    def _adapter_for(self, base: Transformer) -> CGTAdapter:
        if self._loaded is None or self._loaded[0] != id(base):
            self._loaded = (id(base), CGTAdapter.load_guide(base, Path(self.options.adapter)).eval())
        return self._loaded[1]

    def _absorb(self, model, given) -> AdaptedModel:
        prompt = given.prompt
        if not isinstance(model, (CGT, CGTAdapter)):
            model = self._adapter_for(model)
        return FoldedContext(fold(model, prompt_context(model, prompt)))
