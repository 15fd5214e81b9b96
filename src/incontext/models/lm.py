"""The causal-LM protocol every absorb method and the harness speak. Two backends implement it: our
`Transformer` (models/transformer.py) and the Hugging Face wrapper `HFCausalLM` (models/hf_backend.py).

    logits = lm(ids)                                  # (B, T) ids -> (B, T, V) logits, positions 0..T-1
    cache = lm.prefill(prompt)                        # the prompt's state (K/V per layer)
    logits = lm(query, cache=copy_cache(cache))       # tokens after a state (the copy grows, not the original)
    logits = lm(query, position_offset=M)             # positions start at M without a cache
    lm.config.n_layer, lm.config.max_seq_len, lm.config.tokens, lm.config.vocab_size
    lm.backend                                        # "incontext" or "hf"
    lm.lora_modules(("attn.qkv", "attn.out"))         # full module names a peft LoRA targets, per role
    lm.layer_modules(), lm.final_norm_module()        # the blocks and the last norm (top-n-layer updates)
    lm.as_transformer()                               # our Transformer (itself, or a conversion); ValueError why not

A method that needs our internals (a linear-attention state, feature sums, the simulator, CGT folding) sets
`needs_internals` and runs on `lm.as_transformer()`; every other method uses only the calls above, so it runs
on both backends unchanged. Device and dtype are the model's (`runtime.device_of`, `runtime.dtype_of`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .transformer import Cache

@runtime_checkable
class CausalLM(Protocol):
    backend: str
    config: Any

    def __call__(self, inputs: torch.Tensor, *, cache: Cache | None = None, position_offset: int = 0) -> torch.Tensor: ...

    def prefill(self, ids: torch.Tensor) -> Cache: ...

    def lora_modules(self, roles: tuple[str, ...], layers: range | None = None) -> tuple[str, ...]: ...

    def layer_modules(self) -> list[nn.Module]: ...

    def final_norm_module(self) -> nn.Module: ...

    def as_transformer(self) -> nn.Module: ...


def is_causal_lm(model: Any) -> bool:
    return isinstance(model, nn.Module) and isinstance(model, CausalLM)


def copy_cache(cache: Cache, batch: int | None = None) -> Cache:
    """A cache that continues from `cache` without changing it (layers are replaced, never written in place);
    with `batch`, a one-row cache expanded to that many rows (views, no copies)."""
    if batch is None:
        return Cache(layers=list(cache.layers), position=cache.position)

    def expand(layer):
        if isinstance(layer, tuple):
            return tuple(t.expand(batch, *t.shape[1:]) for t in layer)
        if hasattr(layer, "expand_batch"):
            return layer.expand_batch(batch)
        raise TypeError(f"a cache layer of type {type(layer).__name__} cannot be expanded to a batch")

    return Cache(layers=[expand(layer) for layer in cache.layers], position=cache.position)


def cache_kv(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values (B, H_kv, S, D) of a softmax-attention cache, of either backend (a layer may hold
    fewer positions than the cache's: a sliding window keeps its last ones)."""
    out = []
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, tuple) and len(layer) == 2:
            out.append(layer)
        elif hasattr(layer, "keys") and hasattr(layer, "values") and hasattr(layer, "with_tensors"):
            out.append((layer.keys, layer.values))
        else:
            raise ValueError(f"cache layer {i} holds no keys and values (a linear-attention state or an empty layer)")
    return out


def with_kv(cache: Cache, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> Cache:
    """`cache` with each layer's keys and values replaced (same shapes, positions and bookkeeping): e.g. trained ones."""
    layers = [(k, v) if isinstance(layer, tuple) else layer.with_tensors(k, v) for layer, (k, v) in zip(cache.layers, kv)]
    return Cache(layers=layers, position=cache.position)


def internals_reason(model: Any) -> str | None:
    """None when `model` is or converts to our Transformer, else why not."""
    if not is_causal_lm(model):
        return f"needs a causal LM, got {type(model).__name__}"
    try:
        model.as_transformer()
    except ValueError as error:
        return str(error)
    return None


# ----------------------------------------------------------------------------- the transformers twin of a model

