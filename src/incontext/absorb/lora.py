"""LoRA on this project's causal LMs, through peft's own layers: the shared place of distill-lora (which trains one
by distillation) and dynamic-eval (whose `lora_rank` takes its gradient steps on one). W + (alpha / r) B A on the
named linears; the backend names the modules (our fused linears, or the family's own from the families table)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..models.lm import CausalLM

# linear layers of a Transformer block a LoRA can target (fused qkv and, for SwiGLU, fused gate/up)
LORA_TARGETS = ("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")


@dataclass(frozen=True)
class LoRASpec:
    rank: int
    alpha: float
    modules: tuple[str, ...]  # full module names in the CausalLM, e.g. "blocks.0.attn.qkv"

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def lora_targets(value) -> tuple[str, ...]:
    """Target roles as given (a comma string from --set, or a sequence), checked against LORA_TARGETS."""
    targets = tuple(t.strip() for t in value.split(",")) if isinstance(value, str) else tuple(value)
    if not targets or set(targets) - set(LORA_TARGETS):
        raise ValueError(f"target_modules must be a non-empty subset of {','.join(LORA_TARGETS)}, got {value!r}")
    return targets


def lora_spec(model: CausalLM, rank: int, alpha: float, targets: tuple[str, ...], layers: range | None = None) -> LoRASpec:
    """A LoRA on the `targets` (roles, see LORA_TARGETS) of the given blocks (all by default)."""
    return LoRASpec(int(rank), float(alpha), model.lora_modules(tuple(targets), layers))


def linear_shape(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of a linear layer: nn.Linear, or transformers' Conv1D (weight stored (in, out))."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.weight.shape[0], module.weight.shape[1]


def inject_lora(model: CausalLM, spec: LoRASpec, generator: torch.Generator | None) -> list[nn.Parameter]:
    """peft LoRA layers (dropout 0) on the named linears of `model`, in place, everything else frozen; initialised
    as peft does (A ~ kaiming-uniform(a=sqrt(5)), B = 0), from `generator` when given. Returns the factors."""
    from peft import LoraConfig, inject_adapter_in_model

    conv1d = any(not isinstance(model.get_submodule(name), nn.Linear) for name in spec.modules)  # GPT-2: (in, out)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0, target_modules=list(spec.modules),
                        fan_in_fan_out=conv1d)
    with torch.random.fork_rng(devices=[]):  # peft initialises from the global generator; leave it untouched
        inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    if generator is not None:
        init_lora_factors(injected_factors(model, spec).values(), generator)
    return [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def init_lora_factors(factors, generator: torch.Generator) -> None:
    """peft's initialisation (A ~ kaiming-uniform(a=sqrt(5)), B = 0) from our seeded generator."""
    for a, b in factors:
        bound = 1.0 / math.sqrt(a.shape[1])
        a.copy_(torch.empty(a.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator))
        b.zero_()


def injected_factors(model: CausalLM, spec: LoRASpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    layers = {name: model.get_submodule(name) for name in spec.modules}
    return {name: (layer.lora_A["default"].weight, layer.lora_B["default"].weight) for name, layer in layers.items()}


@torch.no_grad()
def merge_lora(model: CausalLM, spec: LoRASpec) -> None:
    """W <- W + scaling B A in each of spec's modules, and peft's layers replaced by the plain linears, in place."""
    for name in spec.modules:
        parent_name, child = name.rsplit(".", 1)
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, child)
        layer.merge()  # peft: base weight += scaling * B @ A
        setattr(parent, child, layer.base_layer)


@torch.no_grad()
def add_lora_delta(layer: nn.Module, a: torch.Tensor, b: torch.Tensor, scaling: float, sign: float = 1.0) -> None:
    """W <- W + sign * scaling B A in float64 (transposed for a Conv1D's (in, out) weight), in place."""
    delta = sign * scaling * (b.to(torch.float64) @ a.to(torch.float64))  # (out, in)
    delta = delta if isinstance(layer, nn.Linear) else delta.T
    layer.weight.copy_((layer.weight.to(torch.float64) + delta).to(layer.weight.dtype))
