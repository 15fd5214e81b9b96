"""Hugging Face interop: GPT-2 and Llama weights both ways, LoRA and CARTRIDGE adapters for peft, and pretrained models
shipped in packages."""

from .cartridge import load_cartridge, save_cartridge
from .hf import config_from_gpt2, config_from_llama, from_hf_gpt2, from_hf_llama, to_hf_gpt2, to_hf_llama
from .lora_export import attach_lora, load_peft_adapter, peft_adapter_model, save_adapter, save_peft_adapter
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
    "load_cartridge",
    "load_peft_adapter",
    "peft_adapter_model",
    "save_adapter",
    "save_cartridge",
    "save_peft_adapter",
    "load_smollm2",
    "smollm2_gguf_path",
]
