"""What the methods that update weights on the prompt share (dynamic-eval, tint): the prompt cut into training
sequences with their target masks, and the adapted models an update gives (the updated weights, with or without the
prompt kept in the context)."""

from __future__ import annotations

from typing import Any

import torch

from ..models import Cache
from ..models.lm import CausalLM
from .protocol import AdaptedModel, PromptInContext


class UpdatedWeights(AdaptedModel):
    """The base model with weights updated on the prompt; queries start at position `offset`."""

    method = "updated-weights"

    def __init__(self, base: CausalLM, offset: int = 0):
        super().__init__(base)
        self.offset = offset

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, position_offset=self.offset)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer, position=self.offset)

    def extra_state(self) -> dict[str, Any]:
        return {"offset": self.offset}

    @classmethod
    def empty(cls, base, extra):
        return cls(base, extra.get("offset", 0))


class UpdatedWithPrompt(PromptInContext):
    """The base model with weights updated on the prompt, which stays in the context (its K/V cache is
    computed with the updated weights)."""

    method = "updated-weights-with-prompt"

    def kept_bytes(self, base) -> int:
        return super().kept_bytes(base) + AdaptedModel.kept_bytes(self, base)  # the cache and the weight copy


def split_documents(ids: torch.Tensor, mask: torch.Tensor | None, separator: list[int] | None
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The prompt as training sequences: whole, or cut at every occurrence of `separator` (dropped); pieces
    shorter than 2 tokens (nothing to predict) are left out."""
    if not separator:
        return [ids], [mask]
    sep = torch.tensor(separator, device=ids.device)
    n, k = ids.shape[0], len(separator)
    pieces, start, t = [], 0, 0
    while t <= n - k:
        if torch.equal(ids[t:t + k], sep):
            pieces.append((start, t))
            start = t = t + k
        else:
            t += 1
    pieces.append((start, n))
    pieces = [(a, b) for a, b in pieces if b - a >= 2]
    if not pieces:
        raise ValueError("the prompt holds no document of at least 2 tokens between separators")
    return [ids[a:b] for a, b in pieces], [None if mask is None else mask[a:b] for a, b in pieces]


def check_separator(separator) -> None:
    if separator is not None and (not isinstance(separator, (list, tuple)) or not separator
                                  or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in separator)):
        raise ValueError(f"separator must be a non-empty list of token ids, got {separator!r}")


def _with_targets(sequences, masks):
    """Drops sequences whose mask selects no target (a document without a label, say)."""
    kept = [(ids, m) for ids, m in zip(sequences, masks) if m is None or bool(m[1:].any())]
    if not kept:
        raise ValueError("no target token to learn from: the loss mask selects nothing after the first token")
    return [ids for ids, _ in kept], [m for _, m in kept]


def training_sequences(prompt: torch.Tensor, loss_mask: torch.Tensor | None, separator: list[int] | None, who: str):
    """The (sequences, masks) one prompt row gives a gradient step: split at the separator, documents without a
    target dropped. `who` names the method in the error for a prompt too short to learn from."""
    ids = prompt[0]
    if ids.shape[0] < 2:
        raise ValueError(f"{who} needs a prompt of at least 2 tokens (one prediction to learn)")
    return _with_targets(*split_documents(ids, None if loss_mask is None else loss_mask[0], separator))


def updated_adapted(updated: CausalLM, prompt: torch.Tensor, keep_prompt: bool, separator: list[int] | None) -> AdaptedModel:
    if keep_prompt:
        adapted = UpdatedWithPrompt(updated, prompt)
        adapted.prompt_cache()  # the prompt's pass belongs to absorbing, not to the first query
        return adapted
    return UpdatedWeights(updated, offset=0 if separator else prompt.shape[1])


def full_mask(ids: torch.Tensor) -> torch.Tensor:
    """Every token after the first is a target (the plain LM loss of a sequence)."""
    keep = torch.ones(ids.shape[-1], dtype=torch.bool, device=ids.device)
    keep[0] = False
    return keep
