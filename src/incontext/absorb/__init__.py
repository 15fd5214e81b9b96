"""Methods that absorb a prompt into a model: `method.absorb(model, prompt) -> adapted; adapted(query) -> logits`;
and the absorb folder `incontext absorb` writes: `load_adapted(folder, model, spec)` reads one back."""

from .protocol import AbsorbInput, AbsorbMethod, AdaptedModel, absorb_methods, get_absorb_method
from .methods.reference import DropPrompt, KeepPrompt
from .methods.cgt_fold import CGTFold, FoldedContext, fold, lora_factors, prompt_context
from .methods.distill_lora import DistilledLoRA, DistillLoRA
from .methods.dynamic_eval import DynamicEval
from .methods.tint import TinTStep
from .prompt_update import UpdatedWeights, UpdatedWithPrompt
from .methods.iclca import ICLCA, ConversionError, LinearAttentionBias, algorithm_1, convert
from .methods.iclca_approx import ICLCAApprox, SoftmaxFeaturePrefix, convert_approximately
from .methods.kv_prefix import KVPrefix, TrainedPrefix
from .methods.kv_press import KVPress, PressedCache
from . import methods  # noqa: F401  (every method registered, with the PEFT exports beside them)
from .folder import composed_folders, load_adapted

__all__ = [
    "ICLCA",
    "AbsorbInput",
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
