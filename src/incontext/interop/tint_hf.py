"""TinT from Hugging Face models: GPT2LMHeadModel and LlamaForCausalLM (through interop.hf) and
OPTForCausalLM (random or local weights; no hub access here). OPT is pre-LN with ReLU, learned positions
offset by 2, tied embeddings; models with a projection between embedding and hidden size (OPT-350M) or
post-LN are rejected. Llama (RMSNorm, SwiGLU, RoPE, grouped K/V heads) needs tied embeddings (as SmolLM2)
and >= 5 slots per token (e.g. TintConfig(rows_per_prefix=4, shards=4)).

    sim = tint_from_hf(GPT2LMHeadModel(GPT2Config(...)), TintConfig(learning_rate=1e-3))
"""

from __future__ import annotations

import torch

from ..models.transformer import Transformer, TransformerConfig
from ..tint.modules import TintConfig
from ..tint.simulator import TinT
from .hf import from_hf_gpt2, from_hf_llama

_OPT_ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}


def config_from_opt(hf_config) -> TransformerConfig:
    problems = []
    if not hf_config.do_layer_norm_before:
        problems.append("post-LN (do_layer_norm_before=False) is not simulated")
    if hf_config.word_embed_proj_dim != hf_config.hidden_size:
        problems.append(f"word_embed_proj_dim={hf_config.word_embed_proj_dim} != hidden_size={hf_config.hidden_size} "
                        "(project_in/project_out, as in OPT-350M) is not simulated")
    if hf_config.activation_function not in _OPT_ACTIVATIONS:
        problems.append(f"activation {hf_config.activation_function!r} not in {sorted(_OPT_ACTIVATIONS)}")
    if not getattr(hf_config, "layer_norm_elementwise_affine", True) or not getattr(hf_config, "enable_bias", True):
        problems.append("LayerNorm without affine parameters or linears without bias")
    if problems:
        raise ValueError("unsupported OPT model: " + "; ".join(problems))
    return TransformerConfig(
        n_layer=hf_config.num_hidden_layers, n_head=hf_config.num_attention_heads, d_model=hf_config.hidden_size,
        d_mlp=hf_config.ffn_dim, vocab_size=hf_config.vocab_size, max_seq_len=hf_config.max_position_embeddings,
        positions="learned", norm="layernorm", norm_eps=1e-5, mlp=_OPT_ACTIVATIONS[hf_config.activation_function],
        bias=True, scale_attn=True, tie_embeddings=True,
    )


def from_hf_opt(hf_model) -> Transformer:
    """Our Transformer with the weights of a transformers OPTForCausalLM (pre-LN, no embedding projection)."""
    config = config_from_opt(hf_model.config)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    d = "model.decoder."
    ours = {"tok_emb.weight": sd[d + "embed_tokens.weight"],
            "pos_emb.weight": sd[d + "embed_positions.weight"][2 : 2 + config.max_seq_len],  # OPT's offset of 2
            "norm_f.weight": sd[d + "final_layer_norm.weight"], "norm_f.bias": sd[d + "final_layer_norm.bias"]}
    for i in range(config.n_layer):
        h, b = f"{d}layers.{i}.", f"blocks.{i}."
        attn = h + "self_attn."
        for part in ("weight", "bias"):
            ours[b + f"attn.qkv.{part}"] = torch.cat([sd[attn + f"{p}_proj.{part}"] for p in "qkv"])
            ours[b + f"attn.out.{part}"] = sd[attn + f"out_proj.{part}"]
            ours[b + f"norm1.{part}"] = sd[h + f"self_attn_layer_norm.{part}"]
            ours[b + f"norm2.{part}"] = sd[h + f"final_layer_norm.{part}"]
            ours[b + f"mlp.fc_in.{part}"] = sd[h + f"fc1.{part}"]
            ours[b + f"mlp.fc_out.{part}"] = sd[h + f"fc2.{part}"]
    ours["lm_head.weight"] = sd.get("lm_head.weight", ours["tok_emb.weight"])
    model = Transformer(config).to(next(hf_model.parameters()).dtype)  # built in the source dtype: no float32 rounding
    model.load_state_dict({k: v.clone() for k, v in ours.items()})
    return model.eval()


def auxiliary_from_hf(hf_model) -> Transformer:
    kind = type(hf_model).__name__
    converters = {"GPT2LMHeadModel": from_hf_gpt2, "LlamaForCausalLM": from_hf_llama, "OPTForCausalLM": from_hf_opt}
    if kind not in converters:
        raise ValueError(f"TinT builds from {', '.join(converters)}, got {kind}")
    model = converters[kind](hf_model)
    model.config.dropout = model.config.attn_dropout = 0.0  # TinT simulates the model in eval mode
    return model.eval()


def tint_from_hf(hf_model, config: TintConfig | None = None) -> TinT:
    return TinT(auxiliary_from_hf(hf_model), config)
