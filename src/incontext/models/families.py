"""Architecture knowledge, in one table keyed by a Hugging Face config's `model_type` (as peft's constants are).

For each family: where its blocks and final norm live, which of its modules play each LoRA role (attn.qkv,
attn.out, mlp.fc_in, mlp.fc_out: the roles of our Transformer's fused linears), whether those are Conv1D
(stored (in, out): peft's fan_in_fan_out), and whether it converts into our Transformer (exactly: the tests
check logits to 1e-5 float32, 1e-10 float64) or why not. Every family runs on the Hugging Face backend
(models/hf_backend.py); the ones that convert also run the methods that need our internals (iclca, iclca-approx,
tint, cgt-fold). The conversions themselves are interop's (`CONVERSIONS` in interop/hf.py, keyed the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..registry import Registry

_LLAMA_LORA = {"attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "attn.out": ("self_attn.o_proj",),
               "mlp.fc_in": ("mlp.gate_proj", "mlp.up_proj"), "mlp.fc_out": ("mlp.down_proj",)}


@dataclass(frozen=True)
class Family:
    model_type: str
    blocks: str = "model.layers"  # the ModuleList of blocks, from the CausalLM model's root
    final_norm: str = "model.norm"
    lora: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(_LLAMA_LORA))  # role -> names in a block
    fan_in_fan_out: bool = False  # GPT-2's Conv1D stores weights (in, out)
    no_conversion: str = ""  # why it does not convert into our Transformer ("": it does, by interop.hf.CONVERSIONS)
    note: str = ""

    @property
    def converts(self) -> bool:
        return not self.no_conversion


FAMILIES: Registry[Family] = Registry("model family", known="families table")


def register_family(family: Family) -> Family:
    """Register `family` under its model_type (ValueError where that holds another family)."""
    return FAMILIES.register(family.model_type, family)


for _family in (
    Family("llama"),
    Family("mistral", note="sliding window: our context is capped at the window"),
    Family("qwen2", note="q/k/v biases; o_proj and MLP get zero biases"),
    Family("phi3",
           lora={"attn.qkv": ("self_attn.qkv_proj",), "attn.out": ("self_attn.o_proj",),
                 "mlp.fc_in": ("mlp.gate_up_proj",), "mlp.fc_out": ("mlp.down_proj",)},
           note="fused qkv_proj and gate_up_proj, our row order"),
    Family("qwen3", no_conversion="Qwen3's per-head q/k RMSNorm has no counterpart in our Transformer"),
    Family("gemma2", no_conversion="Gemma 2's sandwich norms, (1 + w) RMSNorm, embedding scale and logit "
                                   "soft-capping have no counterpart in our Transformer"),
    Family("gemma3_text", no_conversion="Gemma 3's sandwich norms, per-head q/k RMSNorm, embedding scale and "
                                        "local/global RoPE have no counterpart in our Transformer"),
    Family("gpt2", blocks="transformer.h", final_norm="transformer.ln_f", fan_in_fan_out=True,
           lora={"attn.qkv": ("attn.c_attn",), "attn.out": ("attn.c_proj",), "mlp.fc_in": ("mlp.c_fc",),
                 "mlp.fc_out": ("mlp.c_proj",)}),
):
    register_family(_family)


def family(model_type: str | None) -> Family | None:
    return FAMILIES.find(model_type)


# ----------------------------------------------------------------------------- LoRA factors between the layouts


def split_rows(role: str, n_parts: int, config) -> list[int] | None:
    """How the rows of our fused `role` linear split into the family's modules: [q, kv, kv] for a fused qkv,
    halves for a fused [gate; up]; None when the family keeps the fusion (one module)."""
    if n_parts == 1:
        return None
    if role == "attn.qkv":
        q_rows, kv_rows = config.n_head * config.dim_head, config.kv_heads * config.dim_head
        return [q_rows, kv_rows, kv_rows]
    if role == "mlp.fc_in":
        return [config.mlp_width, config.mlp_width]
    raise ValueError(f"role {role} has no split into {n_parts} modules")


def to_family_factors(model_type: str, config, factors: dict) -> dict:
    """LoRA factors of our fused linears ("blocks.{i}.{role}" -> (B, A, bias or None)) named as in the family's
    transformers class: a fused projection's update W + s B A is one LoRA per part with the same A and B (and
    bias) split by rows."""
    f = FAMILIES.get(model_type)
    out = {}
    for name, (b, a, bias) in factors.items():
        _, index, role = name.split(".", 2)
        names = f.lora[role]
        rows = split_rows(role, len(names), config)
        b_parts = [b] if rows is None else b.split(rows)
        bias_parts = [bias] * len(names) if bias is None or rows is None else bias.split(rows)
        for module, b_part, bias_part in zip(names, b_parts, bias_parts):
            out[f"{f.blocks}.{index}.{module}"] = (b_part, a, bias_part)
    return out


def from_family_parts(model_type: str) -> tuple[str, dict[str, tuple[str, int]], dict[str, int]]:
    """(the family's block path, its module -> (our role, part index), parts per role): the inverse of
    `to_family_factors`'s naming, for reading an adapter back onto our fused linears."""
    f = FAMILIES.get(model_type)
    parts = {module: (role, i) for role, names in f.lora.items() for i, module in enumerate(names)}
    return f.blocks, parts, {role: len(names) for role, names in f.lora.items()}
