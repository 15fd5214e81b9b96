"""Import and export of Hugging Face `GPT2LMHeadModel` and `LlamaForCausalLM` weights.

Our layout: fused `qkv` (rows [q; k; v]), `out`, MLP `fc_in` (for SwiGLU rows [gate; up]) and `fc_out`,
stored as nn.Linear (out_features, in_features). GPT-2 stores Conv1D weights transposed (in, out);
Llama keeps separate q/k/v and gate/up projections. RoPE uses the same "rotate half" layout as
transformers' Llama, so no row permutation is needed. Every conversion is a pure copy in the source's
dtype: float32 logits agree to float32 rounding (tests check 1e-5 both ways), float64 ones to ~1e-12, and
export round trips are bit-exact.

`CONVERSIONS` names each converting family's conversions (keyed by `model_type`, as the families table of
models/families.py that holds the architecture); `wrap_hf` puts a transformers model on the Hugging Face backend
with its family's conversion, `export_family` exports our Transformer to the first family that takes it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..models.hf_backend import HFCausalLM
from ..models.transformer import Transformer, TransformerConfig
from ..registry import Registry

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def load_into_new(config: TransformerConfig, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Transformer:
    """A Transformer built in `dtype` (the source's), then loaded: loading into a float32 model first would
    round float64 weights to float32."""
    model = Transformer(config).to(dtype)
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return model


# ----------------------------------------------------------------------------- GPT-2


def _gpt2_names(n_layer: int) -> list[tuple[str, str, bool]]:
    """(our name, GPT-2 name, transposed?) for every tensor but the head; Conv1D weights are (in, out)."""
    names = [("tok_emb.weight", "transformer.wte.weight", False), ("pos_emb.weight", "transformer.wpe.weight", False),
             ("norm_f.weight", "transformer.ln_f.weight", False), ("norm_f.bias", "transformer.ln_f.bias", False)]
    for i in range(n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        for theirs, mine, is_conv in (("ln_1", "norm1", False), ("ln_2", "norm2", False), ("attn.c_attn", "attn.qkv", True),
                                      ("attn.c_proj", "attn.out", True), ("mlp.c_fc", "mlp.fc_in", True),
                                      ("mlp.c_proj", "mlp.fc_out", True)):
            names.append((b + mine + ".weight", h + theirs + ".weight", is_conv))
            names.append((b + mine + ".bias", h + theirs + ".bias", False))
    return names


def config_from_gpt2(hf_config) -> TransformerConfig:
    _require(
        hf_config.activation_function in _GPT2_ACTIVATIONS,
        f"GPT-2 activation {hf_config.activation_function!r} has no counterpart; supported: {sorted(_GPT2_ACTIVATIONS)}",
    )
    _require(
        not getattr(hf_config, "scale_attn_by_inverse_layer_idx", False),
        "scale_attn_by_inverse_layer_idx=True is not supported",
    )
    return TransformerConfig(
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        d_model=hf_config.n_embd,
        d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
        vocab_size=hf_config.vocab_size,
        max_seq_len=hf_config.n_positions,
        positions="learned",
        norm="layernorm",
        norm_eps=hf_config.layer_norm_epsilon,
        mlp=_GPT2_ACTIVATIONS[hf_config.activation_function],
        bias=True,
        scale_attn=hf_config.scale_attn_weights,
        tie_embeddings=getattr(hf_config, "tie_word_embeddings", True),
        dropout=hf_config.resid_pdrop,
        attn_dropout=hf_config.attn_pdrop,
        init_std=hf_config.initializer_range,
    )


def from_hf_gpt2(hf_model) -> Transformer:
    """Our Transformer with the weights of a transformers GPT2LMHeadModel."""
    config = config_from_gpt2(hf_model.config)
    sd = hf_model.state_dict()
    ours = {mine: sd[theirs].T if transposed else sd[theirs] for mine, theirs, transposed in _gpt2_names(config.n_layer)}
    ours["lm_head.weight"] = sd.get("lm_head.weight", sd["transformer.wte.weight"])
    return load_into_new(config, ours, next(hf_model.parameters()).dtype).to(next(hf_model.parameters()).device)


def to_hf_gpt2(model: Transformer):
    """A transformers GPT2LMHeadModel with our weights (the model must use GPT-2's options)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    checks = {
        "vocab_size (token inputs)": c.tokens,
        "positions='learned'": c.positions == "learned",
        "norm='layernorm'": c.norm == "layernorm",
        "bias=True": c.bias,
        "attention='softmax'": c.attention == "softmax",
        "mlp in gelu/gelu_tanh/relu": c.mlp != "swiglu",
        "n_kv_head = n_head": c.kv_heads == c.n_head,
        "head_dim = d_model / n_head": c.dim_head * c.n_head == c.d_model,
        "residual_stream='none'": c.residual_stream == "none",
    }
    missing = [name for name, ok in checks.items() if not ok]
    _require(not missing, f"GPT-2 export needs {', '.join(missing)}")
    activation = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[c.mlp]
    hf_config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_seq_len,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.mlp_width,
        activation_function=activation,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attn_dropout,
        layer_norm_epsilon=c.norm_eps,
        scale_attn_weights=c.scale_attn,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
    )
    sd = model.state_dict()
    theirs = {hf_name: sd[mine].T if transposed else sd[mine] for mine, hf_name, transposed in _gpt2_names(c.n_layer)}
    theirs["lm_head.weight"] = sd["lm_head.weight"]
    hf_model = GPT2LMHeadModel(hf_config).to(next(model.parameters()).dtype).to(next(model.parameters()).device)
    _load_strict(hf_model, theirs)
    return hf_model


# ----------------------------------------------------------------------------- Llama


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", rope_type))
    _require(rope_type == "default", f"RoPE scaling {rope_type!r} is not supported (only the default rotary)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    _require(theta is not None, "the Llama config has no rope_theta")
    return float(theta)


def _sliding_limit(hf_config) -> int | None:
    """The sliding window where some layer of the model attends through one (Mistral, Qwen2 with
    use_sliding_window), else None: up to that many tokens sliding attention equals full attention."""
    window = getattr(hf_config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(window)


def config_from_llama(hf_config, *, bias: bool | None = None) -> TransformerConfig:
    """Our config for a Llama-style model (Llama, Mistral, Qwen2, Phi-3): RoPE, RMSNorm, SwiGLU. `bias`: whether
    any of the block's linears has a bias (the others then get zero biases, which change nothing). A sliding
    window caps the context: within it, sliding attention is full attention."""
    _require(hf_config.hidden_act == "silu", f"hidden_act {hf_config.hidden_act!r}: only silu (SwiGLU) is supported")
    _require(float(getattr(hf_config, "partial_rotary_factor", 1.0) or 1.0) == 1.0,
             "partial_rotary_factor != 1 (RoPE on part of each head) is not supported")
    if bias is None:
        bias = bool(getattr(hf_config, "attention_bias", False)) or bool(getattr(hf_config, "mlp_bias", False))
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    max_len = hf_config.max_position_embeddings
    window = _sliding_limit(hf_config)
    if window is not None:
        max_len = min(max_len, window)
    return TransformerConfig(
        n_layer=hf_config.num_hidden_layers,
        n_head=hf_config.num_attention_heads,
        n_kv_head=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
        d_model=hf_config.hidden_size,
        head_dim=head_dim,
        d_mlp=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        max_seq_len=max_len,
        positions="rope",
        rope_theta=_rope_theta(hf_config),
        norm="rmsnorm",
        norm_eps=hf_config.rms_norm_eps,
        mlp="swiglu",
        bias=bias,
        scale_attn=True,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attn_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_std=hf_config.initializer_range,
    )


def _with_zero_bias(sd: dict[str, torch.Tensor], name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
    return sd[name] if name in sd else like.new_zeros(rows)


def from_hf_llama(hf_model) -> Transformer:
    """Our Transformer with the weights of a Llama-style transformers model: LlamaForCausalLM, MistralForCausalLM,
    Qwen2ForCausalLM (separate q/k/v and gate/up projections) or Phi3ForCausalLM (fused qkv_proj and gate_up_proj,
    the same row order as ours). Missing biases (Qwen2's o_proj and MLP) become zeros."""
    sd = hf_model.state_dict()
    bias = any(k.endswith("_proj.bias") for k in sd)
    config = config_from_llama(hf_model.config, bias=bias)
    ours = llama_state_to_ours(sd, config)
    return load_into_new(config, ours, next(hf_model.parameters()).dtype).to(next(hf_model.parameters()).device)


def llama_state_to_ours(sd: dict[str, torch.Tensor], config: TransformerConfig, rows=torch.cat) -> dict[str, torch.Tensor]:
    """A Llama-style transformers state dict under our names; `rows` joins q/k/v and gate/up along rows (torch.cat,
    or converted.MappedTensors.rows: a view where they lie back to back in a mapped file)."""
    _require(not any(".q_norm." in k or ".k_norm." in k for k in sd), "per-head q/k RMSNorm (Qwen3) has no counterpart")
    bias = config.bias
    ours: dict[str, torch.Tensor] = {
        "tok_emb.weight": sd["model.embed_tokens.weight"],
        "norm_f.weight": sd["model.norm.weight"],
        "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]),
    }
    for i in range(config.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        ours[b + "norm1.weight"] = sd[h + "input_layernorm.weight"]
        ours[b + "norm2.weight"] = sd[h + "post_attention_layernorm.weight"]
        fused = h + "self_attn.qkv_proj.weight" in sd
        parts = {"qkv": ["self_attn.qkv_proj"] if fused else [f"self_attn.{p}_proj" for p in "qkv"],
                 "out": ["self_attn.o_proj"],
                 "fc_in": ["mlp.gate_up_proj"] if fused else ["mlp.gate_proj", "mlp.up_proj"],
                 "fc_out": ["mlp.down_proj"]}
        where = {"qkv": "attn.qkv", "out": "attn.out", "fc_in": "mlp.fc_in", "fc_out": "mlp.fc_out"}
        for key, names in parts.items():
            weights = [sd[h + n + ".weight"] for n in names]
            ours[b + where[key] + ".weight"] = weights[0] if len(weights) == 1 else rows(weights)
            if bias:
                ours[b + where[key] + ".bias"] = torch.cat([_with_zero_bias(sd, h + n + ".bias", w.shape[0], w)
                                                            for n, w in zip(names, weights)])
    return ours


@contextmanager
def _no_init():
    """torch.nn.init's functions do nothing meanwhile: on the meta device their references would import
    torch._dynamo (seconds), and the values are replaced anyway."""
    names = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
             "xavier_normal_", "ones_", "zeros_", "constant_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def assign_into_new(config: TransformerConfig, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Transformer:
    """A Transformer whose parameters are `state`'s tensors themselves (converted to `dtype` where they differ,
    a tensor shared by two names converted once), without a random initialisation first: built on the meta
    device, then assigned. A model with buffers falls back to load_into_new."""
    with torch.device("meta"), _no_init():
        model = Transformer(config)
    if any(True for _ in model.buffers()):
        return load_into_new(config, state, dtype)
    converted: dict[int, torch.Tensor] = {}
    ready = {}
    for name, tensor in state.items():
        if id(tensor) not in converted:
            converted[id(tensor)] = tensor if tensor.dtype == dtype else tensor.to(dtype)
        ready[name] = converted[id(tensor)]
    model.load_state_dict(ready, strict=True, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model


def to_hf_llama(model: Transformer):
    """A transformers LlamaForCausalLM with our weights (the model must use Llama's options)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    checks = {
        "vocab_size (token inputs)": c.tokens,
        "positions='rope'": c.positions == "rope",
        "norm='rmsnorm'": c.norm == "rmsnorm",
        "mlp='swiglu'": c.mlp == "swiglu",
        "attention='softmax'": c.attention == "softmax",
        "scale_attn=True": c.scale_attn,
        "residual_stream='none'": c.residual_stream == "none",
    }
    missing = [name for name, ok in checks.items() if not ok]
    _require(not missing, f"Llama export needs {', '.join(missing)}")
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.mlp_width,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        num_key_value_heads=c.kv_heads,
        head_dim=c.dim_head,
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta,
        attention_bias=c.bias,
        mlp_bias=c.bias,
        tie_word_embeddings=c.tie_embeddings,
        attention_dropout=c.attn_dropout,
        initializer_range=c.init_std,
    )
    sd = model.state_dict()
    q_rows, kv_rows = c.n_head * c.dim_head, c.kv_heads * c.dim_head
    theirs: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": sd["tok_emb.weight"],
        "model.norm.weight": sd["norm_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(c.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        theirs[h + "input_layernorm.weight"] = sd[b + "norm1.weight"]
        theirs[h + "post_attention_layernorm.weight"] = sd[b + "norm2.weight"]
        names = ("weight", "bias") if c.bias else ("weight",)
        for kind in names:
            q, k, v = sd[b + f"attn.qkv.{kind}"].split([q_rows, kv_rows, kv_rows])
            gate, up = sd[b + f"mlp.fc_in.{kind}"].chunk(2)
            theirs.update({
                h + f"self_attn.q_proj.{kind}": q,
                h + f"self_attn.k_proj.{kind}": k,
                h + f"self_attn.v_proj.{kind}": v,
                h + f"self_attn.o_proj.{kind}": sd[b + f"attn.out.{kind}"],
                h + f"mlp.gate_proj.{kind}": gate,
                h + f"mlp.up_proj.{kind}": up,
                h + f"mlp.down_proj.{kind}": sd[b + f"mlp.fc_out.{kind}"],
            })
    hf_model = LlamaForCausalLM(hf_config).to(next(model.parameters()).dtype).to(next(model.parameters()).device)
    _load_strict(hf_model, theirs)
    return hf_model


def _load_strict(hf_model, state: dict[str, torch.Tensor]) -> None:
    """Load every tensor; with tied embeddings transformers may not list lm_head separately."""
    expected = set(hf_model.state_dict())
    state = {k: v.detach().clone().contiguous() for k, v in state.items() if k in expected}
    missing = expected - set(state)
    _require(not missing, f"weights missing for the Hugging Face model: {sorted(missing)[:5]}")
    hf_model.load_state_dict(state, strict=True)
    if getattr(hf_model.config, "tie_word_embeddings", False):
        hf_model.tie_weights()


# ----------------------------------------------------------------------------- the conversions of the families table


@dataclass(frozen=True)
class Conversion:
    to_ours: Callable  # transformers model -> our Transformer (exact)
    to_hf: Callable | None = None  # our Transformer -> this family's transformers class (adapters of our own runs)


# the families of models/families.py that convert (`Family.converts`; a test checks the two tables agree)
CONVERSIONS: Registry[Conversion] = Registry("conversion", known="families that convert")
for _name, _conversion in (("llama", Conversion(from_hf_llama, to_hf_llama)), ("mistral", Conversion(from_hf_llama)),
                           ("qwen2", Conversion(from_hf_llama)), ("phi3", Conversion(from_hf_llama)),
                           ("gpt2", Conversion(from_hf_gpt2, to_hf_gpt2))):
    CONVERSIONS.register(_name, _conversion)


def wrap_hf(hf_model: nn.Module) -> HFCausalLM:
    """`hf_model` on the Hugging Face backend, with its family's conversion to our Transformer where it has one (the
    model's `as_transformer`)."""
    conversion = CONVERSIONS.find(hf_model.config.model_type)
    return HFCausalLM(hf_model, to_ours=None if conversion is None else conversion.to_ours)


def exported_families() -> list[str]:
    """The families our Transformer exports to (those with a `to_hf`), in the table's order."""
    return [name for name, c in CONVERSIONS.items() if c.to_hf is not None]


def export_family(model: Transformer) -> tuple[str, nn.Module]:
    """(model_type, transformers model) for the first family whose class our Transformer `model` exports to (its
    options decide, not a guess); ValueError with every family's reason when none does."""
    reasons = []
    for name in exported_families():
        try:
            return name, CONVERSIONS.get(name).to_hf(model)
        except ValueError as error:
            reasons.append(f"{name}: {error}")
    raise ValueError("no Hugging Face family takes this model (" + "; ".join(reasons) + ")")


def hf_twin(model: nn.Module) -> nn.Module:
    """The transformers model that computes what `model` computes: the Hugging Face backend's own (`model.hf`), or
    for our Transformer its export to the first family that takes it (export_family; made once per state of the
    weights: the export is cached on the model and remade after any in-place change of a parameter). ValueError
    naming why not."""
    if getattr(model, "backend", None) == "hf":
        return model.hf
    key = tuple((p.data_ptr(), p._version) for p in model.parameters())
    cached = getattr(model, "_hf_twin", None)
    if cached is None or cached[0] != key:
        twin = export_family(model)[1].to(next(model.parameters()).device).eval()
        object.__setattr__(model, "_hf_twin", (key, twin))  # not a submodule: not in state_dict, not copied as one
        cached = model._hf_twin
    return cached[1]
