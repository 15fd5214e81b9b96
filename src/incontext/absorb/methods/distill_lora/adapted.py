"""distill-lora's adapted model: the base with a LoRA adapter, merged or as peft's layers (DistilledLoRA), and
several documents' adapters summed into one (compose_loras)."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from ....models import Cache
from ....models.lm import CausalLM
from ...lora import (
    LoRASpec,
    inject_lora,
    injected_factors,
    linear_shape,
    merge_lora,
)
from ...protocol import AdaptedModel, tensor_bytes


def _factor_key(module: str, factor: str) -> str:
    return f"{module.replace('.', '_')}_{factor}"  # buffer names may not contain dots


class DistilledLoRA(AdaptedModel):
    """The base with a LoRA adapter W + (alpha / r) B A on `spec.modules`; queries start at position `offset`.

    merged: B A is added into the base's weights (queries at base speed) and the factors are kept as buffers
    (for export). Unmerged: the base carries peft's LoRA layers, which compute W x + (alpha / r) B A x."""

    method = "distill-lora"
    peft_only = True  # its PEFT adapter alone stands for it in an absorb folder (generate puts it back on the base)

    def __init__(self, base: CausalLM, spec: LoRASpec, offset: int, merged: bool):
        super().__init__(base)
        self.spec, self.offset, self.merged = spec, offset, merged
        self.history: dict[str, Any] = {}  # training record of absorb(); not saved
        if merged:
            self.factors = nn.Module()
            for name in spec.modules:
                linear = base.get_submodule(name)
                n_in, n_out = linear_shape(linear)
                self.factors.register_buffer(_factor_key(name, "A"), linear.weight.new_zeros(spec.rank, n_in))
                self.factors.register_buffer(_factor_key(name, "B"), linear.weight.new_zeros(n_out, spec.rank))
        else:
            inject_lora(base, spec, None)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, position_offset=self.offset)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer, position=self.offset)

    def lora_factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module name -> (A (r, in), B (out, r)); the update of each module's weight is spec.scaling * B @ A."""
        if self.merged:
            return {name: (getattr(self.factors, _factor_key(name, "A")), getattr(self.factors, _factor_key(name, "B")))
                    for name in self.spec.modules}
        return injected_factors(self.base, self.spec)

    @torch.no_grad()
    def merged_model(self) -> "DistilledLoRA":
        """A merged copy (W <- W + scaling B A in each target); `self` is left as it is."""
        if self.merged:
            return copy.deepcopy(self)
        base = copy.deepcopy(self.base)
        factors = {name: (a.detach().clone(), b.detach().clone()) for name, (a, b) in self.lora_factors().items()}
        merge_lora(base, self.spec)
        merged = DistilledLoRA(base, self.spec, self.offset, merged=True)
        for name, (a, b) in factors.items():
            getattr(merged.factors, _factor_key(name, "A")).copy_(a)
            getattr(merged.factors, _factor_key(name, "B")).copy_(b)
        merged.history = self.history
        return merged.eval()

    def kept_bytes(self, base: nn.Module) -> int:
        """The adapter's factors: all a prompt needs kept (merged weights are the base's plus scaling B A, rebuilt
        from them; the copy a merged model holds is the price of base-speed queries, not of the prompt)."""
        return tensor_bytes(t for pair in self.lora_factors().values() for t in pair)

    def extra_state(self) -> dict[str, Any]:
        return {"offset": self.offset, "merged": self.merged, "rank": self.spec.rank, "alpha": self.spec.alpha,
                "modules": list(self.spec.modules)}

    @classmethod
    def empty(cls, base, extra):
        spec = LoRASpec(extra["rank"], extra["alpha"], tuple(extra["modules"]))
        return cls(base, spec, extra["offset"], extra["merged"])


@torch.no_grad()
def compose_loras(*adapted: DistilledLoRA) -> DistilledLoRA:
    """Several documents distilled one by one, answered together: the adapters added (W + s B1 A1 + s B2 A2 + ...),
    kept as one adapter of the summed rank (A stacked by rows, B by columns) so it exports as a plain LoRA. Every
    adapter must be merged, on the same modules with the same scaling; queries start after the sum of the
    adapters' offsets (as after the documents concatenated)."""
    if len(adapted) < 2:
        raise ValueError("compose at least two adapters")
    first = adapted[0]
    for other in adapted[1:]:
        if not (other.merged and first.merged):
            raise ValueError("compose merged adapters (distill-lora merge=true)")
        if other.spec.modules != first.spec.modules or not math.isclose(other.spec.scaling, first.spec.scaling):
            raise ValueError("the adapters differ in their modules or scaling; compose adapters of one setting")
    rank = sum(a.spec.rank for a in adapted)
    spec = LoRASpec(rank, first.spec.scaling * rank, first.spec.modules)
    base = copy.deepcopy(first.base)  # already W + s B1 A1
    out = DistilledLoRA(base, spec, sum(a.offset for a in adapted), merged=True)
    factors = [a.lora_factors() for a in adapted]
    for name in spec.modules:
        weight = base.get_submodule(name).weight
        for f in factors[1:]:
            a, b = f[name]
            delta = spec.scaling * (b.to(torch.float64) @ a.to(torch.float64))  # (out, in)
            weight += (delta if isinstance(base.get_submodule(name), nn.Linear) else delta.T).to(weight.dtype)
        getattr(out.factors, _factor_key(name, "A")).copy_(torch.cat([f[name][0] for f in factors], 0))
        getattr(out.factors, _factor_key(name, "B")).copy_(torch.cat([f[name][1] for f in factors], 1))
    return out.eval()
