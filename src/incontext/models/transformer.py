"""One GPT-style causal transformer with every option the four systems need.

Pre-norm blocks: x = x + Attn(Norm(x)); x = x + MLP(Norm(x)). Options (all in `TransformerConfig`):

- inputs: tokens (embedding + LM head) or continuous vectors (read-in / read-out linears);
- positions: learned, RoPE or none; norm: LayerNorm or RMSNorm; MLP: GELU (erf or tanh), ReLU or SwiGLU;
  biases on/off; 1/sqrt(d_head) logit scaling on/off; tied or untied head; dropout; grouped K/V heads;
- attention: softmax (reference or torch SDPA) or linear/kernelized (identity, elu+1, Taylor, FAVOR+ or learned
  Hedgehog-style features, "kernel" or no normalization; parallel, recurrent or chunked form, all equal);
- residual attention streams (Burns et al.): each layer adds the previous layer's raw Q, K or V projection
  of the same head, or the "value residual" variant mixing the first layer's values with learned scalars.

Incremental decoding goes through a `Cache` (keys/values for softmax, the state (S, z) for linear
attention) and gives the same logits as a full forward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import check_choices
from ..ops import FavorFeatures, apply_feature_map, apply_rope, rope_cos_sin
from ..ops.feature_maps import LearnedFeatures
from ..ops.linear_attention import LINEAR_ATTENTION_IMPLS
from ..ops.softmax_attention import SOFTMAX_ATTENTION_IMPLS

# choices shared with configs that pass them on (e.g. experiments/iclca_table2.py)
Positions = Literal["learned", "rope", "none"]
FeatureMap = Literal["identity", "elu", "taylor", "favor", "learned"]
LinearNorm = Literal["kernel", "none"]


@dataclass
class TransformerConfig:
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    n_kv_head: int | None = None  # grouped-query attention; None = n_head
    head_dim: int | None = None  # None = d_model // n_head
    d_mlp: int | None = None  # None = 4 * d_model
    # inputs / outputs: tokens (vocab_size) or vectors (d_input -> d_output)
    vocab_size: int | None = None
    d_input: int | None = None
    d_output: int | None = None
    max_seq_len: int = 1024  # size of the learned position table
    positions: Positions = "learned"
    rope_theta: float = 10000.0
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    mlp: Literal["gelu", "gelu_tanh", "relu", "swiglu"] = "gelu"
    bias: bool = True  # biases of the attention and MLP linears (and of LayerNorm)
    scale_attn: bool = True  # divide attention logits by sqrt(head_dim)
    tie_embeddings: bool = True
    dropout: float = 0.0  # embeddings and residual branches
    attn_dropout: float = 0.0  # attention probabilities (softmax attention)
    attention: Literal["softmax", "linear"] = "softmax"
    softmax_impl: Literal["sdpa", "reference"] = "sdpa"
    # learned: trainable maps applied to queries and keys AFTER RoPE (rotating q, k at their absolute positions,
    # as the softmax model does; the features themselves are not rotated), e.g. a linearized softmax model
    feature_map: FeatureMap = "elu"
    n_features: int | None = None  # FAVOR+ random features per head (None = head_dim); learned: 2m (None = 2 head_dim)
    orthogonal_features: bool = True
    feature_seed: int = 0
    linear_norm: LinearNorm = "kernel"
    linear_impl: Literal["chunked", "parallel", "recurrent"] = "chunked"
    chunk_size: int = 64
    residual_stream: Literal["none", "q", "k", "v", "value_residual"] = "none"
    # ICLCA's biased architecture (Sec. 4.4, trained from scratch in Sec. 6.3): per layer and head a learned b_KV
    # (features x head dim) and b_D (features), the linear attention's starting sums, as if a learned prompt preceded
    # every sequence; zero at the start. A converted prompt adds to them (absorb/methods/iclca.py), exactly.
    linear_bias: bool = False
    init_std: float = 0.02

    def __post_init__(self):
        check_choices(self)
        for key in ("n_layer", "n_head", "d_model", "max_seq_len", "chunk_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"TransformerConfig.{key} must be >= 1, got {getattr(self, key)}")
        if (self.vocab_size is None) == (self.d_input is None):
            raise ValueError("give exactly one of vocab_size (token inputs) or d_input (vector inputs)")
        if self.d_input is not None and self.d_output is None:
            raise ValueError("vector inputs (d_input) need d_output for the read-out")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.kv_heads}")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}; set head_dim")
        if not (0.0 <= self.dropout < 1.0 and 0.0 <= self.attn_dropout < 1.0):
            raise ValueError("dropout and attn_dropout must lie in [0, 1)")
        if self.positions == "rope" and self.attention == "softmax" and self.dim_head % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.dim_head}")
        if self.positions == "rope" and self.attention == "linear" and self.feature_map == "learned" and self.dim_head % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.dim_head}")
        if self.positions == "rope" and self.attention == "linear" and self.feature_map != "learned" and self.feature_dim % 2:
            raise ValueError(f"RoPE on linear attention rotates the features: feature dim {self.feature_dim} is odd")
        if self.linear_bias and self.attention != "linear":
            raise ValueError("linear_bias (ICLCA's learned bias terms) needs attention='linear'")

    # derived sizes
    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_head

    @property
    def mlp_width(self) -> int:
        return self.d_mlp or 4 * self.d_model

    @property
    def feature_dim(self) -> int:
        if self.feature_map == "favor":
            return self.n_features or self.dim_head
        if self.feature_map == "taylor":
            return 2 + self.dim_head + self.dim_head**2
        if self.feature_map == "learned":
            return self.n_features or 2 * self.dim_head
        return self.dim_head

    @property
    def tokens(self) -> bool:
        return self.vocab_size is not None


def pick_next_token(logits: torch.Tensor, greedy: bool = True, temperature: float = 1.0, top_k: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token (B,) from last-position logits (B, V): the argmax, or a sample at `temperature` from the
    `top_k` most likely tokens (all when None)."""
    if greedy:
        return logits.argmax(-1)
    scaled = logits / temperature
    if not bool(torch.isfinite(scaled).all()) and bool(torch.isfinite(logits).all()):
        raise ValueError(f"temperature {temperature:g} is too small for {logits.dtype}: logits / temperature overflow")
    if top_k is not None:
        kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ----------------------------------------------------------------------------- cache


@runtime_checkable
class LayerState(Protocol):
    """A softmax layer's cached context in another form than (k, v), e.g. a prompt absorbed by an absorb
    method: it attends the new (RoPE-rotated) queries itself and returns its state extended by the new keys."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               expand_kv: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, "LayerState"]: ...


@dataclass
class Cache:
    """Decoding state of every layer: (k, v) for softmax attention, (S, z) for linear attention, or a
    `LayerState` (softmax attention over a context held in another form).

    `position` is the absolute position id the next token gets. Tensors are (B, H_kv, P, d) for keys and
    values, (B, H, F, d) and (B, H, F) for S and z. `positions`, when set, is each row's next position as a device
    tensor (B,) that the positions of a forward come from instead of `position` (a decode step replayed as a CUDA
    graph, models/static_decode.py: the rows' positions change between replays, a Python int could not).
    """

    layers: list[tuple[torch.Tensor, torch.Tensor] | LayerState | None]
    position: int = 0
    positions: torch.Tensor | None = None

    @classmethod
    def empty(cls, n_layer: int, position: int = 0) -> "Cache":
        if not isinstance(n_layer, int) or n_layer < 1 or not isinstance(position, int) or position < 0:
            raise ValueError(f"Cache.empty needs n_layer >= 1 and position >= 0, got {n_layer!r}, {position!r}")
        return cls(layers=[None] * n_layer, position=position)


# ----------------------------------------------------------------------------- modules


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()  # skips a call per use on the hot path


def make_norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig, layer_index: int):
        super().__init__()
        self.config, self.layer_index = config, layer_index
        c = config
        self.qkv = nn.Linear(c.d_model, (c.n_head + 2 * c.kv_heads) * c.dim_head, bias=c.bias)
        self.out = nn.Linear(c.n_head * c.dim_head, c.d_model, bias=c.bias)
        self.favor = None
        if c.attention == "linear" and c.feature_map == "favor":
            self.favor = FavorFeatures(
                c.dim_head, c.feature_dim, orthogonal=c.orthogonal_features, seed=c.feature_seed + layer_index
            )
        self.learned = None
        if c.attention == "linear" and c.feature_map == "learned":
            scale = 1.0 / math.sqrt(c.dim_head) if c.scale_attn else 1.0
            self.learned = LearnedFeatures(c.n_head, c.dim_head, c.feature_dim, scale=scale, seed=c.feature_seed + layer_index)
        self.bias_kv = self.bias_d = None
        if c.linear_bias:  # ICLCA's biased architecture: the starting sums b_KV, b_D of every sequence, learned
            self.bias_kv = nn.Parameter(torch.zeros(c.n_head, c.feature_dim, c.dim_head))
            self.bias_d = nn.Parameter(torch.zeros(c.n_head, c.feature_dim))
        if c.residual_stream == "value_residual" and layer_index > 0:
            # Zhou et al. 2024: v_n <- lambda_self * v_n + lambda_first * v_1, both learned, start at 1/2
            self.value_mix = nn.Parameter(torch.full((2,), 0.5))
        # a callable given (queries, keys) of softmax attention after RoPE, keys with the cached ones before them, on
        # the plain cache path (kv_prefix.attention_mass reads where the queries look); None: nothing is called
        self.observe = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        previous: dict[str, torch.Tensor] | None,
        layer_cache: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Returns the output, this layer's raw projections (for the next layer's stream), new cache entry."""
        c = self.config
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([c.n_head * c.dim_head, c.kv_heads * c.dim_head, c.kv_heads * c.dim_head], -1)
        q = q.view(b, t, c.n_head, c.dim_head).transpose(1, 2)
        k = k.view(b, t, c.kv_heads, c.dim_head).transpose(1, 2)
        v = v.view(b, t, c.kv_heads, c.dim_head).transpose(1, 2)
        # residual streams pass this layer's raw projections to the next layer; nothing to keep otherwise
        raw = {"q": q, "k": k, "v": v} if c.residual_stream != "none" else None
        if previous is not None and raw is not None:
            # residual attention streams add the previous layer's RAW projection, so streams never accumulate
            if c.residual_stream == "q":
                q = q + previous["q"]
            elif c.residual_stream == "k":
                k = k + previous["k"]
            elif c.residual_stream == "v":
                v = v + previous["v"]
            elif c.residual_stream == "value_residual":
                v = self.value_mix[0] * v + self.value_mix[1] * previous["first_v"]
                raw["first_v"] = previous["first_v"]
        elif raw is not None and c.residual_stream == "value_residual":
            raw["first_v"] = v

        if c.attention == "softmax":
            out, new_cache = self._softmax(q, k, v, rope, layer_cache)
        else:
            out, new_cache = self._linear(q, k, v, rope, layer_cache)
        out = out.transpose(1, 2).reshape(b, t, c.n_head * c.dim_head)
        return self.out(out), raw, new_cache

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        groups = self.config.n_head // self.config.kv_heads
        return x if groups == 1 else x.repeat_interleave(groups, dim=1)

    def _softmax(self, q, k, v, rope, layer_cache):
        c = self.config
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        scale = 1.0 / math.sqrt(c.dim_head) if c.scale_attn else 1.0
        if isinstance(layer_cache, LayerState):
            return layer_cache.attend(q, k, v, scale=scale, expand_kv=self._expand_kv)
        if layer_cache is not None:
            k = torch.cat([layer_cache[0], k], dim=2)
            v = torch.cat([layer_cache[1], v], dim=2)
        if self.observe is not None:
            self.observe(q, k)
        attend = SOFTMAX_ATTENTION_IMPLS[c.softmax_impl]
        dropout = c.attn_dropout if self.training else 0.0
        out = attend(q, k, v, scale=scale, dropout_p=dropout)  # grouped K/V heads: the op shares them
        return out, (k, v)

    def _linear(self, q, k, v, rope, layer_cache):
        c = self.config
        if layer_cache is None and self.bias_kv is not None:  # a fresh sequence starts from the learned sums
            b = q.shape[0]
            layer_cache = (self.bias_kv.expand(b, *self.bias_kv.shape), self.bias_d.expand(b, *self.bias_d.shape))
        kwargs = {"chunk_size": c.chunk_size} if c.linear_impl == "chunked" else {}
        attend = LINEAR_ATTENTION_IMPLS[c.linear_impl]
        normalize = c.linear_norm == "kernel"
        if self.learned is not None:  # RoPE on q, k at absolute positions, then the maps (their scale built in)
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            phi_q, phi_k = self.learned.phi_q(q), self.learned.phi_k(self._expand_kv(k))
            return attend(phi_q, phi_k, self._expand_kv(v), rope=None, normalize=normalize, state=layer_cache, **kwargs)
        if c.scale_attn:
            # FAVOR+ and Taylor features approximate exp(q.k / sqrt(d)): scale both sides by d^(-1/4). For
            # identity and elu features the scale goes on the queries (the kernel normalization cancels it).
            if c.feature_map in ("favor", "taylor"):
                q, k = q * c.dim_head**-0.25, k * c.dim_head**-0.25
            else:
                q = q / math.sqrt(c.dim_head)
        phi_q = apply_feature_map(q, c.feature_map, self.favor)
        phi_k = apply_feature_map(self._expand_kv(k), c.feature_map, self.favor)
        out, state = attend(phi_q, phi_k, self._expand_kv(v), rope=rope, normalize=normalize, state=layer_cache, **kwargs)
        return out, state


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.kind = config.mlp
        width = config.mlp_width
        # SwiGLU's gate and up projections are fused into one matmul: fc_in = [W_gate; W_up]
        self.fc_in = nn.Linear(config.d_model, 2 * width if self.kind == "swiglu" else width, bias=config.bias)
        self.fc_out = nn.Linear(width, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "gelu":
            h = F.gelu(h)
        elif self.kind == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        return self.fc_out(h)


class Block(nn.Module):
    def __init__(self, config: TransformerConfig, layer_index: int):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = Attention(config, layer_index)
        self.norm2 = make_norm(config)
        self.mlp = MLP(config)
        self.dropout = _dropout(config.dropout)

    def forward(self, x, rope, previous, layer_cache):
        attended, raw, new_cache = self.attn(self.norm1(x), rope, previous, layer_cache)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.mlp(self.norm2(x)))
        return x, raw, new_cache


# ----------------------------------------------------------------------------- model


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        if c.tokens:
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        else:
            self.read_in = nn.Linear(c.d_input, c.d_model)
        if c.positions == "learned":
            self.pos_emb = nn.Embedding(c.max_seq_len, c.d_model)
        self.dropout = _dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c, i) for i in range(c.n_layer))
        self.norm_f = make_norm(c)
        if c.tokens:
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
            if c.tie_embeddings:
                self.lm_head.weight = self.tok_emb.weight
        else:
            self.read_out = nn.Linear(c.d_model, c.d_output)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation: N(0, init_std), residual output projections scaled by 1/sqrt(2 n_layer)."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if name.endswith("value_mix"):
                nn.init.constant_(p, 0.5)
            elif name.endswith(("attn.bias_kv", "attn.bias_d")):
                nn.init.zeros_(p)  # the biased architecture starts as the plain one
            elif ".learned." in name:
                continue  # learned feature maps keep their own start (the FAVOR+ estimator)
            elif "norm" in name:  # gains one, biases zero
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.zeros_(p)
            else:
                scale = 1.0 / math.sqrt(2 * self.config.n_layer) if name.endswith(("attn.out.weight", "fc_out.weight")) else 1.0
                nn.init.normal_(p, 0.0, std * scale, generator=generator)

    # ------------------------------------------------------------------ the causal-LM protocol (models/lm.py)
    backend = "incontext"

    def prefill(self, ids: torch.Tensor) -> "Cache":
        """The state after `ids` ((B, M) ids or (B, M, d) vectors): K/V (or linear state) per layer."""
        cache = Cache.empty(self.config.n_layer)
        self(ids, cache=cache)
        return cache

    def lora_modules(self, roles: tuple[str, ...], layers: range | None = None) -> tuple[str, ...]:
        """Module names of the LoRA roles (attn.qkv, attn.out, mlp.fc_in, mlp.fc_out) in the given blocks."""
        layers = range(self.config.n_layer) if layers is None else layers
        return tuple(f"blocks.{i}.{role}" for i in layers for role in roles)

    def layer_modules(self) -> list[nn.Module]:
        return list(self.blocks)

    def final_norm_module(self) -> nn.Module:
        return self.norm_f

    def as_transformer(self) -> "Transformer":
        return self

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and self.config.positions == "learned":
            n -= self.pos_emb.weight.numel()
        return n

    def forward(
        self,
        inputs: torch.Tensor,
        *,
        cache: Cache | None = None,
        position_offset: int = 0,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab) for token ids (B, T), or predictions (B, T, d_output) for vectors (B, T, d_input).

        With a cache, the tokens continue the cached sequence (positions start at cache.position) and the
        cache is updated in place. Without one, positions start at `position_offset`.
        """
        c = self.config
        if cache is not None and len(cache.layers) != c.n_layer:
            raise ValueError(f"the cache has {len(cache.layers)} layers but the model has {c.n_layer} "
                             f"(make it with Cache.empty(model.config.n_layer))")
        start = cache.position if cache is not None else position_offset
        x, rope = self.embed(inputs, start, cache.positions if cache is not None else None)
        t = inputs.shape[1]
        previous = None
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x, previous, new_cache = block(x, rope, previous, layer_cache)
            if cache is not None:
                cache.layers[i] = new_cache
        if cache is not None:
            cache.position += t
        hidden = self.norm_f(x)
        out = self.lm_head(hidden) if c.tokens else self.read_out(hidden)
        return (out, hidden) if return_hidden else out

    def embed(self, inputs: torch.Tensor, start: int = 0, rows_start: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Input embeddings (with learned positions) of tokens at positions start.., and the RoPE tables; with
        `rows_start` (B,) (a device tensor, Cache.positions), row b's tokens sit at rows_start[b].. instead."""
        c = self.config
        self._check_inputs(inputs)
        t = inputs.shape[1]
        x = self.tok_emb(inputs) if c.tokens else self.read_in(inputs)
        if rows_start is None:
            positions = torch.arange(start, start + t, device=x.device)
        else:  # (B, T): not checked against the learned table here (a check would sync a replayed graph)
            positions = rows_start[:, None] + torch.arange(t, device=x.device)
        if c.positions == "learned":
            if rows_start is None and (start < 0 or start + t > c.max_seq_len):
                raise ValueError(
                    f"positions {start}..{start + t - 1} exceed the learned position table (max_seq_len={c.max_seq_len})"
                )
            x = x + self.pos_emb(positions)
        rope = None
        if c.positions == "rope":
            rope = rope_cos_sin(positions, self.rope_dim, c.rope_theta, x.dtype)
            if rows_start is not None:  # (B, T, d) -> (B, 1, T, d): one table per row, shared by the heads
                rope = tuple(r[:, None] for r in rope)
        return self.dropout(x), rope

    @property
    def rope_dim(self) -> int:
        """Dimension RoPE rotates: the head dimension, or the feature dimension for linear attention (except
        learned features, which read rotated queries and keys)."""
        c = self.config
        return c.feature_dim if c.attention == "linear" and c.feature_map != "learned" else c.dim_head

    def _check_inputs(self, inputs: torch.Tensor) -> None:
        c = self.config
        if c.tokens:
            if inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"token inputs must be integer ids of shape (B, T); got {tuple(inputs.shape)} {inputs.dtype}")
            # the range check reads values (a device sync, and a graph break under torch.compile): eager only, and
            # not while a CUDA graph is captured (kv-prefix's training step), where a sync is an error
            capturing = inputs.is_cuda and torch.cuda.is_current_stream_capturing()
            if inputs.numel() and not torch.compiler.is_compiling() and not capturing:
                low, high = (int(v) for v in torch.aminmax(inputs))
                if low < 0 or high >= c.vocab_size:
                    raise ValueError(f"token ids must lie in [0, {c.vocab_size}); got [{low}, {high}]")
        elif inputs.dim() != 3 or inputs.shape[-1] != c.d_input or not inputs.is_floating_point():
            raise ValueError(f"vector inputs must be float (B, T, {c.d_input}); got {tuple(inputs.shape)} {inputs.dtype}")
        elif inputs.dtype != self.read_in.weight.dtype and not torch.is_autocast_enabled(inputs.device.type):
            raise ValueError(f"inputs are {inputs.dtype} but the model is {self.read_in.weight.dtype}: convert one "
                             f"of them (inputs.to({self.read_in.weight.dtype}) or model.to({inputs.dtype}))")

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """Continue token ids (B, T) by max_new_tokens, greedily or by sampling, through the cache.

        `cache` may hold a context the prompt continues (e.g. a prompt absorbed by an absorb method)."""
        if not self.config.tokens:
            raise ValueError("generate() needs a token model (vocab_size)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        if not greedy and temperature <= 0:
            raise ValueError(f"sampling needs temperature > 0, got {temperature}")
        cache = cache if cache is not None else Cache.empty(self.config.n_layer)
        logits = self(prompt, cache=cache)[:, -1]
        tokens = [prompt]
        finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
        for step in range(max_new_tokens):
            next_token = pick_next_token(logits, greedy, temperature, top_k, generator)
            if eos_token_id is not None:
                next_token = next_token.masked_fill(finished, eos_token_id)
                finished |= next_token == eos_token_id
            tokens.append(next_token[:, None])
            if step + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
                break
            logits = self(next_token[:, None], cache=cache)[:, -1]
        return torch.cat(tokens, dim=1)
