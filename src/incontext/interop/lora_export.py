"""LoRA adapters as PEFT adapters on Hugging Face models: the shared pieces (`attach_lora`, `save_adapter`), and the
export of a distilled LoRA (absorb/methods/distill_lora/method.py) onto the Llama or GPT-2 export of its base model.

Our attention uses one fused qkv projection and SwiGLU one fused [gate; up] projection; Llama has separate
q/k/v and gate/up projections. A LoRA on a fused projection, W + s B A with B split by rows, is exactly one
LoRA per part with the same A: q_proj gets (A, B[:q]), k_proj (A, B[q:q+kv]), v_proj (A, B[q+kv:]).
GPT-2 keeps the fusion (c_attn), so its adapter maps one-to-one (fan_in_fan_out: Conv1D stores (in, out)).

    peft_model = peft_adapter_model(adapted, to_hf_llama(model))   # a transformers model with the adapter
    save_peft_adapter(adapted, to_hf_llama(model), folder)         # PeftModel.from_pretrained(base, folder)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch


Factors = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]  # HF module -> (B, A, bias or None)


def attach_lora(hf_model, factors: Factors, rank: int, alpha: float, *, fan_in_fan_out: bool = False):
    """`hf_model` as a peft PeftModel with one LoRA per module in `factors` (module name -> (B (out, r), A (r, in),
    bias shift (out,) or None)); the update is (alpha / rank) B A. peft injects the layers into hf_model in place."""
    from peft import LoraConfig, get_peft_model

    with_bias = {bias is not None for _, _, bias in factors.values()}
    if len(with_bias) != 1:
        raise ValueError("give a bias shift for every module or for none")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(factors), fan_in_fan_out=fan_in_fan_out,
                        lora_bias=with_bias.pop(), lora_dropout=0.0)
    with torch.random.fork_rng(devices=[]):  # peft initialises from the global generator; the values are replaced
        peft_model = get_peft_model(hf_model, config)
    modules = dict(peft_model.base_model.model.named_modules())
    with torch.no_grad():
        for name, (b_factor, a_factor, bias) in factors.items():
            layer = modules[name]
            layer.lora_A["default"].weight.copy_(a_factor)
            layer.lora_B["default"].weight.copy_(b_factor)
            if bias is not None:
                layer.lora_B["default"].bias.copy_(bias)
    return peft_model.eval()


def save_adapter(peft_model, folder: str | Path) -> Path:
    """The adapter alone as a PEFT folder (adapter_config.json + adapter_model.safetensors)."""
    folder = Path(folder)
    with warnings.catch_warnings():  # peft mistakes the 1-D lora_B bias (lora_bias=True) for an unsharded tensor
        warnings.filterwarnings("ignore", message=".*LoRA tensor\\(s\\) have invalid shape.*")
        peft_model.save_pretrained(folder)
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text())
    if isinstance(config.get("target_modules"), list):  # peft writes a set: order it, so equal adapters are equal files
        config["target_modules"] = sorted(config["target_modules"])
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


# ----------------------------------------------------------------------------- distilled LoRA


# ----------------------------------------------------------------------------- and back


