"""LoRA adapters as PEFT adapters on Hugging Face models: the shared pieces (`attach_lora`, `save_adapter`), and the
export of a distilled LoRA (absorb/distill_lora.py) onto the Llama or GPT-2 export of its base model.

Our attention uses one fused qkv projection and SwiGLU one fused [gate; up] projection; Llama has separate
q/k/v and gate/up projections. A LoRA on a fused projection, W + s B A with B split by rows, is exactly one
LoRA per part with the same A: q_proj gets (A, B[:q]), k_proj (A, B[q:q+kv]), v_proj (A, B[q+kv:]).
GPT-2 keeps the fusion (c_attn), so its adapter maps one-to-one (fan_in_fan_out: Conv1D stores (in, out)).

    peft_model = peft_adapter_model(adapted, to_hf_llama(model))   # a transformers model with the adapter
    save_peft_adapter(adapted, to_hf_llama(model), folder)         # PeftModel.from_pretrained(base, folder)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..absorb.distill_lora import DistilledLoRA

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
    return folder


# ----------------------------------------------------------------------------- distilled LoRA


def hf_lora_factors(adapted: DistilledLoRA, family: str | None = None) -> tuple[Factors, bool]:
    """The adapter's factors named as in transformers' LlamaForCausalLM ("llama") or GPT2LMHeadModel ("gpt2";
    default: llama for SwiGLU models), and whether they need fan_in_fan_out."""
    c = adapted.base.config
    family = family or ("llama" if c.mlp == "swiglu" else "gpt2")
    if family not in ("llama", "gpt2"):
        raise ValueError(f"family must be 'llama' or 'gpt2', got {family!r}")
    q_rows, kv_rows = c.n_head * c.dim_head, c.kv_heads * c.dim_head
    factors: Factors = {}
    for name, (a, b) in adapted.lora_factors().items():
        _, index, module = name.split(".", 2)
        a, b = a.detach(), b.detach()
        if family == "gpt2":
            gpt2 = {"attn.qkv": "attn.c_attn", "attn.out": "attn.c_proj", "mlp.fc_in": "mlp.c_fc", "mlp.fc_out": "mlp.c_proj"}
            factors[f"transformer.h.{index}.{gpt2[module]}"] = (b, a, None)
            continue
        layer = f"model.layers.{index}."
        if module == "attn.qkv":
            for part, rows in zip("qkv", b.split([q_rows, kv_rows, kv_rows])):
                factors[f"{layer}self_attn.{part}_proj"] = (rows, a, None)
        elif module == "mlp.fc_in":
            for part, rows in zip(("gate", "up"), b.chunk(2)):
                factors[f"{layer}mlp.{part}_proj"] = (rows, a, None)
        else:
            factors[layer + {"attn.out": "self_attn.o_proj", "mlp.fc_out": "mlp.down_proj"}[module]] = (b, a, None)
    return factors, family == "gpt2"


def peft_adapter_model(adapted: DistilledLoRA, hf_base, family: str | None = None):
    """`hf_base` (the Hugging Face export of the model the adapter was distilled on, e.g. `to_hf_llama(model)`)
    with the distilled adapter, as a PeftModel; hf_base gets the LoRA layers in place."""
    factors, fan_in_fan_out = hf_lora_factors(adapted, family)
    return attach_lora(hf_base, factors, adapted.spec.rank, adapted.spec.alpha, fan_in_fan_out=fan_in_fan_out)


def save_peft_adapter(adapted: DistilledLoRA, hf_base, folder: str | Path, family: str | None = None) -> Path:
    """Save the distilled adapter as a PEFT folder for `PeftModel.from_pretrained(hf_base, folder)`; hf_base
    gives the module layout and is handed back without the LoRA layers."""
    peft_model = peft_adapter_model(adapted, hf_base, family)
    folder = save_adapter(peft_model, folder)
    peft_model.unload()  # take the LoRA layers out of hf_base again
    return folder
