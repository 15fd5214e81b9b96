"""Export a folded CGT to Hugging Face: the folded model as a GPT-2 checkpoint, or the context alone as a PEFT
LoRA adapter on the GPT-2 export of the x-only base model (one base, one small adapter per context).

The adapter targets the fused qkv (`attn.c_attn`) and MLP input (`mlp.c_fc`) of every stage-2 layer, with
rank r, scaling 1 (lora_alpha = r), fan_in_fan_out (GPT-2's Conv1D stores (in, out)) and lora_bias (the
bias row of R gives every folded layer a bias shift). Merging it reproduces the folded weights.

A CGT adapter over a frozen Llama-architecture model (models/cgt_adapter.py, e.g. on SmolLM2) exports the same way
onto transformers' own LlamaForCausalLM (`to_hf_llama(adapter.base)`): the fused qkv update becomes one LoRA per
q/k/v projection with the same A and B split by rows, the gate/up update one per gate_proj/up_proj. Llama has no
biases, so the shift W L r_b lives in the LoRA's own bias (PEFT lora_bias=True: lora_B is a Linear with bias,
scaling 1); the base stays bias-free and `PeftModel.from_pretrained(base, folder)` reproduces the frozen-y
adapter. The folded model alone is a LlamaForCausalLM with attention_bias = mlp_bias = True (zero biases on
o_proj and down_proj).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ....interop.hf import to_hf_gpt2, to_hf_llama
from ....interop.lora_export import Factors, attach_lora, save_adapter
from ....models.cgt import CGT
from ....models.cgt_adapter import CGTAdapter
from ....models.families import FAMILIES, to_family_factors
from .method import fold, lora_factors


def save_folded_gpt2(model: CGT, y: torch.Tensor, folder: str | Path) -> Path:
    """The model with context y folded in, saved as a transformers GPT2LMHeadModel checkpoint."""
    folder = Path(folder)
    to_hf_gpt2(fold(model, y)).save_pretrained(folder)
    return folder


def save_base_gpt2(model: CGT, folder: str | Path) -> Path:
    """The x-only base model (every T = I) as a GPT2LMHeadModel checkpoint: what the adapters apply to."""
    folder = Path(folder)
    to_hf_gpt2(model.x_only_transformer()).save_pretrained(folder)
    return folder


def lora_adapter_model(model: CGT, y: torch.Tensor, base_hf_model=None):
    """A peft PeftModel: the GPT-2 base (built from `model` unless given) with the context y as a LoRA adapter."""
    factors = lora_factors(model, y.to(model.pos_emb.weight.dtype))
    base = base_hf_model if base_hf_model is not None else to_hf_gpt2(model.x_only_transformer())
    rank = model.config.rank
    hf_factors = to_family_factors("gpt2", model.config.transformer_config(), factors)
    return attach_lora(base, hf_factors, rank, rank, fan_in_fan_out=FAMILIES.get("gpt2").fan_in_fan_out)


def save_lora_adapter(model: CGT, y: torch.Tensor, folder: str | Path) -> Path:
    """Save the context y as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)."""
    return save_adapter(lora_adapter_model(model, y), folder)


# ----------------------------------------------------------------------------- a CGT adapter on a Llama base


def llama_adapter_factors(adapter: CGTAdapter, y: torch.Tensor) -> Factors:
    """The folded context's LoRA factors (B, A, bias) named as in LlamaForCausalLM, fused projections split."""
    factors = lora_factors(adapter, y.to(next(adapter.parameters()).dtype))
    return to_family_factors("llama", adapter.base.config, factors)


def llama_adapter_model(adapter: CGTAdapter, y: torch.Tensor, base_hf_model=None):
    """A peft PeftModel: the LlamaForCausalLM export of the frozen base (unless given) with the context y as a LoRA
    adapter (rank r, scaling 1, lora_bias)."""
    base = base_hf_model if base_hf_model is not None else to_hf_llama(adapter.base)
    rank = adapter.config.rank
    return attach_lora(base, llama_adapter_factors(adapter, y), rank, rank)


def save_llama_adapter(adapter: CGTAdapter, y: torch.Tensor, folder: str | Path, base_hf_model=None) -> Path:
    """Save the context y as a PEFT adapter folder for `PeftModel.from_pretrained(to_hf_llama(base), folder)`."""
    peft_model = llama_adapter_model(adapter, y, base_hf_model)
    folder = save_adapter(peft_model, folder)
    if base_hf_model is not None:
        peft_model.unload()  # hand the caller's model back without the LoRA layers
    return folder


def save_folded_llama(adapter: CGTAdapter, y: torch.Tensor, folder: str | Path) -> Path:
    """The adapter with context y folded in, saved as a LlamaForCausalLM checkpoint (with q/k/v, gate/up biases)."""
    folder = Path(folder)
    to_hf_llama(fold(adapter, y)).save_pretrained(folder)
    return folder
