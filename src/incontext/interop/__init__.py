"""Hugging Face interop, conversions only: GPT-2 and Llama weights both ways, the shared pieces of a PEFT LoRA, and the
pretrained models shipped in packages. The methods' exports (distill-lora's LoRA, kv-prefix's CARTRIDGE, cgt-fold's
adapter) live beside the methods in absorb/, above this layer."""

from .hf import config_from_gpt2, config_from_llama, from_hf_gpt2, from_hf_llama, to_hf_gpt2, to_hf_llama
from .lora_export import attach_lora, save_adapter
from .pretrained import load_smollm2, smollm2_gguf_path
from .tint_hf import auxiliary_from_hf, from_hf_opt, tint_from_hf

__all__ = [
    "auxiliary_from_hf",
    "from_hf_opt",
    "tint_from_hf",
    "config_from_gpt2",
    "config_from_llama",
    "from_hf_gpt2",
    "from_hf_llama",
    "to_hf_gpt2",
    "to_hf_llama",
    "attach_lora",
    "save_adapter",
    "load_smollm2",
    "smollm2_gguf_path",
]
