"""The linearized SmolLM2 of `incontext run linearize-smollm2`, loaded from its result folder.

The folder holds the learned feature maps (feature_maps/) and the recovery (recovery.safetensors: LoRA factors
of the attention projections and the fine-tuned maps); the base weights come from the shipped SmolLM2. The
LoRA is merged into the weights (W + (alpha / r) B A), so the result is a plain linear-attention Transformer
that exact ICLCA converts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..models import Transformer
from ..train.attention_transfer import linearize, load_feature_maps

RECOVERY_FILE = "recovery.safetensors"
RECOVERY_TARGETS = ("attn.qkv", "attn.out")  # the LoRA's modules in every block


def lora_alpha(rank: int) -> float:
    return 2.0 * rank


def is_linearized_folder(path: Path) -> bool:
    return (path / RECOVERY_FILE).is_file() and (path / "feature_maps" / "feature_maps.json").is_file()


def load_linearized(folder: str | Path, base: Transformer) -> Transformer:
    """`base` (the softmax SmolLM2) linearized with the folder's maps and its recovery LoRA merged."""
    folder = Path(folder)
    results = folder / "results.json"
    if not is_linearized_folder(folder) or not results.is_file():
        raise FileNotFoundError(f"{folder} is not a linearize-smollm2 result folder (needs feature_maps/, "
                                f"{RECOVERY_FILE} and results.json)")
    rank = json.loads(results.read_text())["config"]["lora_rank"]
    linear = linearize(base, load_feature_maps(folder / "feature_maps"))
    recovery = load_file(str(folder / RECOVERY_FILE))
    dtype = next(linear.parameters()).dtype
    with torch.no_grad():
        for name, tensor in recovery.items():
            if ".learned." in name:
                linear.get_parameter(name).copy_(tensor.to(dtype))
        for module in sorted({name.split(".lora_")[0] for name in recovery if ".lora_" in name}):
            a, b = recovery[f"{module}.lora_A.default.weight"], recovery[f"{module}.lora_B.default.weight"]
            linear.get_submodule(module).weight.add_((lora_alpha(rank) / rank) * (b.double() @ a.double()).to(dtype))
    return linear.eval()
