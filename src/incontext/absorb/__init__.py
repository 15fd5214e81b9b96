"""Methods that absorb a prompt into a model: `method.absorb(model, prompt) -> adapted; adapted(query) -> logits`;
and the absorb folder `incontext absorb` writes: `load_adapted(folder, model, spec)` reads one back."""

from .base import AbsorbMethod, AdaptedModel, absorb_methods, get_absorb_method
from .reference import DropPrompt, KeepPrompt
from .cgt_fold import CGTFold, FoldedContext, fold, lora_factors, prompt_context
from .distill_lora import DistilledLoRA, DistillLoRA
from .dynamic_eval import DynamicEval
from .tint import TinTStep
from .prompt_update import UpdatedWeights, UpdatedWithPrompt
from .iclca import ICLCA, ConversionError, LinearAttentionBias, algorithm_1, convert
from .iclca_approx import ICLCAApprox, SoftmaxFeaturePrefix, convert_approximately
from .kv_prefix import KVPrefix, TrainedPrefix
from .kv_press import KVPress, PressedCache
from . import distill_lora_export, kv_prefix_export  # noqa: F401  (they register the methods' PEFT exports)
from .folder import composed_folders, load_adapted

__all__ = [
    "ICLCA",
    "AbsorbMethod",
    "AdaptedModel",
    "CGTFold",
    "ConversionError",
    "DistillLoRA",
    "DistilledLoRA",
    "DropPrompt",
    "DynamicEval",
    "FoldedContext",
    "ICLCAApprox",
    "KVPrefix",
    "KVPress",
    "KeepPrompt",
    "LinearAttentionBias",
    "PressedCache",
    "SoftmaxFeaturePrefix",
    "TinTStep",
    "TrainedPrefix",
    "UpdatedWeights",
    "UpdatedWithPrompt",
    "absorb_methods",
    "composed_folders",
    "load_adapted",
    "algorithm_1",
    "convert",
    "convert_approximately",
    "fold",
    "get_absorb_method",
    "lora_factors",
    "prompt_context",
]
