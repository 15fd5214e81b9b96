"""Export a folded CGT to Hugging Face: the folded model as a GPT-2 checkpoint, or the context alone as a PEFT
LoRA adapter on the GPT-2 export of the x-only base model (one base, one small adapter per context).

The adapter targets the fused qkv (`attn.c_attn`) and MLP input (`mlp.c_fc`) of every stage-2 layer, with
rank r, scaling 1 (lora_alpha = r), fan_in_fan_out (GPT-2's Conv1D stores (in, out)) and lora_bias (the
bias row of R gives every folded layer a bias shift). Merging it reproduces the folded weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..absorb.cgt_fold import fold, lora_factors
from ..models.cgt import CGT
from .hf import to_hf_gpt2
from .lora_export import attach_lora, save_adapter

_HF_NAMES = {"attn.qkv": "attn.c_attn", "mlp.fc_in": "mlp.c_fc"}


def _hf_module(name: str) -> str:
    """blocks.{i}.attn.qkv -> transformer.h.{i}.attn.c_attn"""
    _, index, rest = name.split(".", 2)
    return f"transformer.h.{index}.{_HF_NAMES[rest]}"


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
    return attach_lora(base, {_hf_module(name): f for name, f in factors.items()}, rank, rank, fan_in_fan_out=True)


def save_lora_adapter(model: CGT, y: torch.Tensor, folder: str | Path) -> Path:
    """Save the context y as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)."""
    return save_adapter(lora_adapter_model(model, y), folder)
