"""The Hugging Face backend: any `AutoModelForCausalLM` behind the causal-LM protocol (models/lm.py).

    lm = HFCausalLM(AutoModelForCausalLM.from_pretrained(folder))  # interop.hf.wrap_hf: with the family's conversion
    cache = lm.prefill(prompt)                  # transformers' own DynamicCache, held per layer in our Cache
    logits = lm(query, cache=copy_cache(cache)) # tokens after the prompt; the prompt's state is not changed
    logits = lm(query, position_offset=M)       # positions M.. without a cache (updated-weights methods)

The wrapped model is `lm.hf`; peft LoRA layers go onto its own modules (`lm.lora_modules(roles)` names them
from the families table), so a distilled adapter saves as a plain PEFT folder for the family's own class.
Methods that need our internals run on `lm.as_transformer()`, an exact conversion where the family allows: the
conversion is given as `to_ours` (interop's, `interop.hf.wrap_hf` passes the family's; this layer knows only
whether a family converts).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..ops.masked_kv import MaskedKV
from . import families
from .families import Family
from .transformer import Cache


@dataclass
class HFConfigView:
    """What the harness and the methods read of a model's config."""

    model_type: str
    n_layer: int
    vocab_size: int
    max_seq_len: int | None
    tokens: bool = True


class HFLayerState:
    """One layer's cached keys and values (B, H_kv, S, D) and how many tokens it has seen (sliding windows keep
    only their last ones). Never written in place: a continuing forward replaces it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, seen: int):
        self.keys, self.values, self.seen = keys, values, seen

    def with_tensors(self, keys: torch.Tensor, values: torch.Tensor) -> "HFLayerState":
        return HFLayerState(keys, values, self.seen)

    def expand_batch(self, batch: int) -> "HFLayerState":
        return HFLayerState(self.keys.expand(batch, *self.keys.shape[1:]),
                            self.values.expand(batch, *self.values.shape[1:]), self.seen)


class HFCausalLM(nn.Module):
    backend = "hf"

    def __init__(self, hf_model: nn.Module, *, to_ours: Callable | None = None):
        """`to_ours`: the family's exact conversion of `hf_model` into our Transformer, for `as_transformer` (the
        loaders pass interop.hf.CONVERSIONS' one: `interop.hf.wrap_hf`); None: none is given."""
        super().__init__()
        self.hf = hf_model
        self.to_ours = to_ours
        c = hf_model.config
        self.family: Family | None = families.family(c.model_type)
        self.config = HFConfigView(model_type=c.model_type, n_layer=c.num_hidden_layers, vocab_size=c.vocab_size,
                                   max_seq_len=getattr(c, "max_position_embeddings", None))
        self._converted: dict[str, nn.Module] = {}
        # a model whose tokenizer starts every text with BOS (Gemma, Llama 3) reads it first, always: at position 0,
        # before the prompt or, without one, before the query (whose positions then go on from the absorbed
        # prompt's); the protocol's positions do not count it (set by the loader: `read_bos_first`)
        self.bos_id: int | None = None
        # transformers >= 5.24 calls the cache argument `cache` (past_key_values before)
        self._cache_arg = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"

    def __deepcopy__(self, memo):
        """A copy of the wrapped model (for weight updates); the cached conversion is not copied."""
        converted, self._converted = self._converted, {}
        try:
            clone = HFCausalLM.__new__(HFCausalLM)
            memo[id(self)] = clone
            for key, value in self.__dict__.items():
                clone.__dict__[key] = {} if key == "_converted" else copy.deepcopy(value, memo)
            return clone
        finally:
            self._converted = converted

    # ------------------------------------------------------------------ running

    def forward(self, inputs: torch.Tensor, *, cache: Cache | None = None, position_offset: int = 0) -> torch.Tensor:
        if inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"token inputs must be integer ids of shape (B, T); got {tuple(inputs.shape)} {inputs.dtype}")
        if cache is not None and len(cache.layers) != self.config.n_layer:
            raise ValueError(f"the cache has {len(cache.layers)} layers but the model has {self.config.n_layer}")
        start = cache.position if cache is not None else position_offset
        batch, length = inputs.shape
        limit = self.config.max_seq_len
        if limit is not None and start + length > limit:
            raise ValueError(f"positions up to {start + length} exceed the model's context ({limit})")
        shift = 0 if self.bos_id is None else 1
        positions = torch.arange(start + shift, start + shift + length, device=inputs.device)[None].expand(batch, -1)
        fresh = cache is None or all(layer is None for layer in cache.layers)
        if shift and fresh:  # the BOS goes first, at position 0; its logits are not the caller's
            bos = torch.full((batch, 1), self.bos_id, dtype=inputs.dtype, device=inputs.device)
            inputs = torch.cat([bos, inputs], 1)
            positions = torch.cat([torch.zeros_like(positions[:, :1]), positions], 1)
        drop = shift if fresh else 0
        if cache is None:  # an explicit mask: transformers would read a jump in position_ids as packed sequences
            mask = torch.ones(inputs.shape, dtype=torch.long, device=inputs.device)
            return self.hf(input_ids=inputs, position_ids=positions, attention_mask=mask, use_cache=False).logits[:, drop:]
        past = self._hf_cache(cache)
        keeps = [getattr(state, "keep", None) for state in cache.layers]
        with self._masked_heads(keeps, length):
            out = self.hf(input_ids=inputs, position_ids=positions, use_cache=True, **{self._cache_arg: past})
        grown = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.layers = [HFLayerState(layer.keys, layer.values, getattr(layer, "cumulative_length", layer.keys.shape[-2]))
                        if keep is None else MaskedKV(layer.keys, layer.values, torch.cat(
                            [keep.expand(layer.keys.shape[0], *keep.shape[1:]),
                             torch.ones(*layer.keys.shape[:2], length, dtype=torch.bool, device=keep.device)], 2))
                        for layer, keep in zip(grown.layers, keeps)]
        cache.position = start + length
        return out.logits[:, drop:]

    @contextlib.contextmanager
    def _masked_heads(self, keeps: list, length: int):
        """While a cache with evicted (head, position) pairs is continued (`keeps`: per layer None or the (B, H_kv, S)
        keep mask of a press that keeps different counts per head, ops.masked_kv.MaskedKV): each attention layer's
        mask is replaced by its own (B, H, T, S + T) one, the kept cached pairs of the query head's K/V head and the
        new tokens causally, exact (-inf where evicted). Nothing is installed when no layer is masked."""
        if all(keep is None for keep in keeps):
            yield
            return
        handles = []
        for block, keep in zip(self.layer_modules(), keeps):
            if keep is not None:
                handles.append(block.self_attn.register_forward_pre_hook(_head_mask_hook(keep, length), with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def read_bos_first(self, bos_id: int | None) -> "HFCausalLM":
        """Every sequence starts with `bos_id` (None: nothing is added); the context loses one position to it."""
        self.bos_id = bos_id
        limit = getattr(self.hf.config, "max_position_embeddings", None)
        self.config.max_seq_len = None if limit is None else limit - (bos_id is not None)
        return self

    def _hf_cache(self, cache: Cache):
        from transformers import DynamicCache

        hf_cache = DynamicCache(config=self.hf.config)
        states = cache.layers
        if all(s is None for s in states):
            return hf_cache
        if len(hf_cache.layers) != len(states):
            raise ValueError(f"the cache has {len(states)} layers; transformers' cache for this model has {len(hf_cache.layers)}")
        for layer, state in zip(hf_cache.layers, states):
            if getattr(state, "keep", None) is not None and getattr(layer, "is_sliding", False):
                raise ValueError("a cache with per-head evicted pairs cannot continue in a sliding-window layer")
            layer.lazy_initialization(state.keys, state.values)
            layer.keys, layer.values = state.keys, state.values
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length = state.seen
        return hf_cache

    def prefill(self, ids: torch.Tensor) -> Cache:
        cache = Cache.empty(self.config.n_layer)
        self(ids, cache=cache)
        return cache

    # ------------------------------------------------------------------ structure (from the families table)

    def _family(self, what: str) -> Family:
        if self.family is None:
            raise ValueError(f"{what}: model_type {self.config.model_type!r} is not in the families table "
                             f"({', '.join(families.FAMILIES)})")
        return self.family

    def lora_modules(self, roles: tuple[str, ...], layers: range | None = None) -> tuple[str, ...]:
        f = self._family("LoRA targets")
        layers = range(self.config.n_layer) if layers is None else layers
        return tuple(f"hf.{f.blocks}.{i}.{name}" for i in layers for role in roles for name in f.lora[role])

    def layer_modules(self) -> list[nn.Module]:
        return list(self.hf.get_submodule(self._family("the model's blocks").blocks))

    def final_norm_module(self) -> nn.Module:
        return self.hf.get_submodule(self._family("the model's final norm").final_norm)

    def as_transformer(self) -> nn.Module:
        """Our Transformer with these weights (converted once, exactly); ValueError naming why not."""
        if "ours" not in self._converted:
            f = self._family("conversion to our Transformer")
            if not f.converts:
                raise ValueError(f"model_type {f.model_type} does not convert to our Transformer: {f.no_conversion}")
            if self.to_ours is None:
                raise ValueError(f"model_type {f.model_type} converts to our Transformer, but this HFCausalLM was given "
                                 f"no conversion (build it with incontext.interop.hf.wrap_hf)")
            self._converted["ours"] = self.to_ours(self.hf).eval()
        return self._converted["ours"]


def _head_mask_hook(keep: torch.Tensor, length: int):
    """A forward pre-hook (with kwargs) for one attention layer: its `attention_mask` becomes the additive (B, H, T,
    S + T) mask of the kept cached pairs (`keep`, (B, H_kv, S)) and the T new tokens causally."""

    def hook(module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        batch, heads = hidden.shape[0], module.config.num_attention_heads
        cached = keep.expand(batch, *keep.shape[1:]).repeat_interleave(heads // keep.shape[1], 1)[:, :, None, :]
        causal = torch.ones(length, length, dtype=torch.bool, device=keep.device).tril()
        allowed = torch.cat([cached.expand(-1, -1, length, -1), causal.expand(batch, heads, -1, -1)], -1)
        mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
        kwargs = {**kwargs, "attention_mask": mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)}
        return args, kwargs

    return hook


def prefix_cache(adapted, hf_config):
    """A trained K/V prefix (absorb/methods/kv_prefix/method.py, of either backend) as transformers' DynamicCache for a model with
    `hf_config`: pass it as `past_key_values` (`cache` from transformers 5.24) with `input_ids` = `adapted.position`
    placeholder ids followed by the query and an all-ones `attention_mask` (generate feeds only the tokens after
    the cache; without the mask it would take placeholders equal to the pad id for padding). Our keys are stored
    after RoPE, as transformers'."""
    from transformers import DynamicCache

    from .lm import cache_kv

    cache = DynamicCache(config=hf_config)
    state = adapted.state()
    for index, (layer, (k, v)) in enumerate(zip(cache.layers, cache_kv(state))):
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k.clone(), v.clone()
        seen = getattr(state.layers[index], "seen", k.shape[-2])
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = seen
    return cache
