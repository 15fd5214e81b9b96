"""Hugging Face interop: GPT-2 and Llama weights both ways, and pretrained models shipped in packages."""

from .hf import config_from_gpt2, config_from_llama, from_hf_gpt2, from_hf_llama, to_hf_gpt2, to_hf_llama
from .pretrained import load_smollm2, smollm2_gguf_path

__all__ = [
    "config_from_gpt2",
    "config_from_llama",
    "from_hf_gpt2",
    "from_hf_llama",
    "to_hf_gpt2",
    "to_hf_llama",
    "load_smollm2",
    "smollm2_gguf_path",
]
