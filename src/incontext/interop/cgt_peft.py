"""Export a folded CGT to Hugging Face: the folded model as a GPT-2 checkpoint, or the context alone as a PEFT
LoRA adapter on the GPT-2 export of the x-only base model (one base, one small adapter per context).

The adapter targets the fused qkv (`attn.c_attn`) and MLP input (`mlp.c_fc`) of every stage-2 layer, with
rank r, scaling 1 (lora_alpha = r), fan_in_fan_out (GPT-2's Conv1D stores (in, out)) and lora_bias (the
bias row of R gives every folded layer a bias shift). Merging it reproduces the folded weights.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..absorb.cgt_fold import fold, lora_factors
from ..models.cgt import CGT
from .hf import to_hf_gpt2

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
    from peft import LoraConfig, get_peft_model

    factors = lora_factors(model, y.to(model.pos_emb.weight.dtype))
    base = base_hf_model if base_hf_model is not None else to_hf_gpt2(model.x_only_transformer())
    rank = model.config.rank
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(_hf_module(n) for n in factors),
                        fan_in_fan_out=True, lora_bias=True, lora_dropout=0.0)
    peft_model = get_peft_model(base, config)
    modules = dict(peft_model.base_model.model.named_modules())
    with torch.no_grad():
        for name, (b_factor, a_factor, bias) in factors.items():
            layer = modules[_hf_module(name)]
            layer.lora_A["default"].weight.copy_(a_factor)
            layer.lora_B["default"].weight.copy_(b_factor)
            layer.lora_B["default"].bias.copy_(bias)
    return peft_model.eval()


def save_lora_adapter(model: CGT, y: torch.Tensor, folder: str | Path) -> Path:
    """Save the context y as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)."""
    folder = Path(folder)
    with warnings.catch_warnings():  # peft mistakes the 1-D lora_B bias (lora_bias=True) for an unsharded tensor
        warnings.filterwarnings("ignore", message=".*LoRA tensor\\(s\\) have invalid shape.*")
        lora_adapter_model(model, y).save_pretrained(folder)
    return folder
