"""Context distillation ("prompt baking") into a LoRA adapter: the practical baseline the other methods are
weighed against. A peft LoRA on a copy of the frozen base (the student, without the prompt) is trained to match
the next-token distributions of the base with the prompt (the teacher) over the pipeline's data stage, by its
objective and its one training loop (absorb/distill.py). The student runs as it will at query time: its inputs
start at position M (the prompt's length), as for dynamic evaluation (`UpdatedWeights`).

    adapted = get_absorb_method("distill-lora", rank=8).absorb(model, prompt, codec=tokenizer)
    logits = adapted(query)        # the LoRA merged into a copy of the base: base speed
    distill_lora_export.save_peft_adapter(adapted, to_hf_llama(model), folder)  # the adapter alone, for peft
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ....config import limit, option
from ....models import Cache
from ....models.lm import CausalLM, is_causal_lm
from ...distill import Distiller, Student, TrainOptions
from ...lora import (
    LoRASpec,
    add_lora_delta,
    init_lora_factors,
    inject_lora,
    injected_factors,
    linear_shape,
    lora_spec,
    lora_targets,
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


@dataclass
class DistillLoRAOptions(TrainOptions):
    rank: int = limit(8, min=1, help="the adapter's rank r")
    alpha: float = limit(16.0, gt=0, help="its scale alpha (the update is alpha / r B A)")
    target_modules: tuple[str, ...] | str = option(("attn.qkv", "attn.out"),
        "the linears it adapts (attn.qkv,attn.out,mlp.fc_in,mlp.fc_out)")
    merge: bool = option(True, "merged into a copy of the base (queries at base speed), or peft's layers")
    steps: int = limit(48, min=0, help="train at least this many steps (0: no training)")
    passes: int = limit(12, min=0, help="and at least this many passes over the data stage")
    learning_rate: float = limit(3e-3, gt=0, help="AdamW's rate on the factors (halved at each rollback)")
    patience: int = limit(8, min=1, help="the divergence guard's window in steps; the plateau's (at least one pass)")
    argmax_weight: float = limit(1.0, min=0, help="plus this times the cross-entropy of the teacher's top token")
    autocast: Literal["none", "bfloat16", "float16"] = option("none",
        "training's matmuls in this dtype (\"none\": the model's)")

    def __post_init__(self):
        self.target_modules = lora_targets(self.target_modules)


class DistillLoRA(Distiller):
    """Distil the prompted model into a LoRA on the model without the prompt (see the module docstring and
    docs/absorb-methods.md, where the options' ablations are). compose_steps: `compose` trains the summed adapter
    that many steps on the documents' data stages (0: the plain sum)."""

    name = "distill-lora"
    Options = DistillLoRAOptions
    needs = "a token-input causal LM"
    summary = "context distillation into a LoRA adapter (a PEFT folder for the family's own transformers class)"

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model):
            return f"needs a token-input causal LM, got {type(model).__name__}"
        if not model.config.tokens:
            return "needs a token-input causal LM; this model reads vectors"
        return None

    def learns_nothing(self) -> str | None:
        if self.steps == 0:
            return ("steps=0 trains nothing: the adapter's B factors stay zero, so the adapted model is the base model "
                    "without the prompt (give steps >= 1)")
        return None

    def student(self, model, prompt, generator, sequences, queries=None) -> Student:
        spec = lora_spec(model, self.rank, self.alpha, self.target_modules)
        adapted = DistilledLoRA(copy.deepcopy(model), spec, offset=prompt.shape[0], merged=False).eval()
        init_lora_factors(adapted.lora_factors().values(), generator)
        return self.lora_student(adapted)

    @staticmethod
    def lora_student(adapted: "DistilledLoRA") -> Student:
        student = Student([t for pair in adapted.lora_factors().values() for t in pair], adapted)
        student.adapted = adapted
        return student

    def adapted(self, model, student: Student) -> "DistilledLoRA":
        return student.adapted.merged_model() if self.merge else student.adapted

    def join(self, adapted: list["DistilledLoRA"]) -> "DistilledLoRA":
        return compose_loras(*adapted)

    def join_student(self, joined: "DistilledLoRA", adapted: list) -> tuple[Student, Any]:
        """The summed adapter as one trainable LoRA of the summed rank on the base's own weights (the merged sum
        taken back out, in float64)."""
        spec, factors = joined.spec, joined.lora_factors()
        base = copy.deepcopy(joined.base)
        if hasattr(base, "peft_config"):  # left by the merged adapter's peft layers, which merging removed
            del base.peft_config
        for name, (a, b) in factors.items():
            add_lora_delta(base.get_submodule(name), a, b, spec.scaling, sign=-1.0)
        trainable = DistilledLoRA(base, spec, joined.offset, merged=False)
        with torch.no_grad():
            for name, (a, b) in trainable.lora_factors().items():
                a.copy_(factors[name][0])
                b.copy_(factors[name][1])
        return self.lora_student(trainable), lambda s: s.adapted.merged_model()
