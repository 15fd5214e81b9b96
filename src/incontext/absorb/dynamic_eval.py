"""Dynamic evaluation (Krause et al.; the baseline of TinT's Table 2) and TinT's simulated step as absorb
methods: the prompt is absorbed by SGD steps on its LM loss, and queries run on the updated weights with
the prompt out of the context (query positions continue after the prompt, as in dynamic evaluation).

    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3).absorb(model, prompt)
    adapted = get_absorb_method("tint", learning_rate=1e-3, n_simulation_layers=2).absorb(model, prompt)
"""

from __future__ import annotations

from typing import Any

import torch

from ..models import Transformer
from .base import AbsorbMethod, AdaptedModel


class UpdatedWeights(AdaptedModel):
    """The base model with weights updated on the prompt; queries start at position `offset`."""

    method = "updated-weights"

    def __init__(self, base: Transformer, offset: int = 0):
        super().__init__(base)
        self.offset = offset

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, position_offset=self.offset)

    def extra_state(self) -> dict[str, Any]:
        return {"offset": self.offset}

    @classmethod
    def empty(cls, base, extra):
        return cls(base, extra.get("offset", 0))


def _prompt_ids(prompt: torch.Tensor) -> torch.Tensor:
    if prompt.dim() == 2:
        if prompt.shape[0] != 1:
            raise ValueError(f"absorb one prompt at a time; got a batch of shape {tuple(prompt.shape)}")
        prompt = prompt[0]
    if prompt.dim() != 1 or prompt.shape[0] < 2:
        raise ValueError("the prompt must be a 1-D sequence of at least 2 token ids")
    return prompt


class DynamicEval(AbsorbMethod):
    """`n_steps` SGD steps on all parameters, exact gradient of the summed (or mean) LM loss of the prompt."""

    name = "dynamic-eval"

    def __init__(self, learning_rate: float = 1e-3, n_steps: int = 1, reduction: str = "sum"):
        self.learning_rate, self.n_steps, self.reduction = learning_rate, n_steps, reduction

    def absorb(self, model: Transformer, prompt: torch.Tensor) -> AdaptedModel:
        from ..tint.reference import dynamic_eval

        prompt = _prompt_ids(prompt)
        updated, _ = dynamic_eval(model, prompt, prompt.shape[0], self.learning_rate, self.n_steps, self.reduction)
        return UpdatedWeights(updated, offset=prompt.shape[0])


class TinTStep(AbsorbMethod):
    """TinT's simulated SGD step(s) on the prompt; the auxiliary weights are read back from the prefixes."""

    name = "tint"

    def __init__(self, **tint_options):
        from ..tint import TintConfig

        self.config = TintConfig(**tint_options)

    def absorb(self, model: Transformer, prompt: torch.Tensor) -> AdaptedModel:
        from ..tint import TinT

        prompt = _prompt_ids(prompt)
        sim = TinT(model, self.config)
        with torch.no_grad():
            _, banks, _ = sim.simulate(prompt, prompt.shape[0])
        return UpdatedWeights(sim.updated_model(model, banks), offset=prompt.shape[0])
