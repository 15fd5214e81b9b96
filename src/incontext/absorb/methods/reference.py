"""The two reference points every comparison holds: keep-prompt (the prompt stays in the context, a K/V cache or, for a
model without a cache, prepended to each query) and drop-prompt (the prompt removed)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..protocol import (
    AbsorbMethod,
    AdaptedModel,
    BaseAlone,
    PromptInContext,
    tensor_bytes,
)


def reads_whole_sequences(model: nn.Module) -> bool:
    """A model of ours without the causal-LM protocol's cache (CGT, a CGT adapter): its forward over prompt and query
    together is the prompted model."""
    from ...models import CGT, CGTAdapter

    return isinstance(model, (CGT, CGTAdapter))


class PromptPrepended(AdaptedModel):
    """The prompt stays in the context of a model that has no cache (CGT): each query runs after the whole prompt,
    and the outputs of the query's positions are returned."""

    method = "keep-prompt-sequence"

    def __init__(self, base: nn.Module, prompt: torch.Tensor):
        super().__init__(base)
        self.register_buffer("prompt", prompt)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        prompt = self.prompt.expand(query.shape[0], *self.prompt.shape[1:])
        return self.base(torch.cat([prompt, query.to(prompt.dtype)], 1))[:, prompt.shape[1]:]

    def extra_state(self) -> dict[str, Any]:
        return {"prompt_shape": list(self.prompt.shape), "vectors": self.prompt.is_floating_point()}

    def kept_bytes(self, base: nn.Module) -> int:
        return tensor_bytes([self.prompt])

    @classmethod
    def empty(cls, base, extra):
        parameter = next(base.parameters())
        dtype = parameter.dtype if extra.get("vectors") else torch.long
        return cls(base, torch.zeros(extra["prompt_shape"], dtype=dtype, device=parameter.device))


class WithoutPrompt(BaseAlone):
    method = "drop-prompt"


class KeepPrompt(AbsorbMethod):
    name = "keep-prompt"
    summary = "the reference: the prompt stays in the context as a K/V cache"
    batched = True

    def check_model(self, model: nn.Module) -> str | None:
        return None if reads_whole_sequences(model) else AbsorbMethod.check_model(self, model)

    def _absorb(self, model, given) -> AdaptedModel:
        prompt = given.prompt
        if reads_whole_sequences(model):
            return PromptPrepended(model, prompt)
        adapted = PromptInContext(model, prompt)
        adapted.prompt_cache()  # the prompt's pass belongs to absorbing, not to the first query
        return adapted


class DropPrompt(AbsorbMethod):
    name = "drop-prompt"
    summary = "the floor: the prompt is removed"
    batched = True
    check_model = KeepPrompt.check_model

    def _absorb(self, model, given) -> AdaptedModel:
        return WithoutPrompt(model)
