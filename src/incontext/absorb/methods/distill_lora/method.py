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
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ....config import limit, option, redefault
from ....models.lm import is_causal_lm
from ...distill import Distiller, Student, TrainOptions
from ...lora import (
    add_lora_delta,
    init_lora_factors,
    lora_spec,
    lora_targets,
)
from .adapted import DistilledLoRA, compose_loras


@dataclass
class DistillLoRAOptions(TrainOptions):
    rank: int = limit(8, min=1, help="the adapter's rank r")
    alpha: float = limit(16.0, gt=0, help="its scale alpha (the update is alpha / r B A)")
    target_modules: tuple[str, ...] | str = option(("attn.qkv", "attn.out"),
        "the linears it adapts (attn.qkv,attn.out,mlp.fc_in,mlp.fc_out)")
    merge: bool = option(True, "merged into a copy of the base (queries at base speed), or peft's layers")
    steps: int = redefault(TrainOptions, "steps", 48)
    passes: int = redefault(TrainOptions, "passes", 12)
    learning_rate: float = redefault(TrainOptions, "learning_rate", 3e-3)
    patience: int = redefault(TrainOptions, "patience", 8)
    argmax_weight: float = redefault(TrainOptions, "argmax_weight", 1.0)
    autocast: Literal["none", "bfloat16", "float16"] = redefault(TrainOptions, "autocast", "none")

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
        if self.options.steps == 0:
            return ("steps=0 trains nothing: the adapter's B factors stay zero, so the adapted model is the base model "
                    "without the prompt (give steps >= 1)")
        return None

    def student(self, model, prompt, generator, sequences) -> Student:
        spec = lora_spec(model, self.options.rank, self.options.alpha, self.options.target_modules)
        adapted = DistilledLoRA(copy.deepcopy(model), spec, offset=prompt.shape[0], merged=False).eval()
        init_lora_factors(adapted.lora_factors().values(), generator)
        return self.lora_student(adapted)

    @staticmethod
    def lora_student(adapted: "DistilledLoRA") -> Student:
        student = Student([t for pair in adapted.lora_factors().values() for t in pair], adapted)
        student.adapted = adapted
        return student

    def adapted(self, model, student: Student) -> "DistilledLoRA":
        return student.adapted.merged_model() if self.options.merge else student.adapted

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
