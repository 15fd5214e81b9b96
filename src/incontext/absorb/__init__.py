"""Methods that absorb a prompt into a model: `method.absorb(model, prompt) -> adapted; adapted(query) -> logits`."""

from .base import AbsorbMethod, AdaptedModel, DropPrompt, KeepPrompt, absorb_methods, get_absorb_method
from .iclca import ICLCA, ConversionError, LinearAttentionBias, algorithm_1, convert
from .iclca_approx import ICLCAApprox, SoftmaxFeaturePrefix, convert_approximately

__all__ = [
    "AbsorbMethod",
    "AdaptedModel",
    "ConversionError",
    "DropPrompt",
    "ICLCA",
    "ICLCAApprox",
    "SoftmaxFeaturePrefix",
    "convert_approximately",
    "KeepPrompt",
    "LinearAttentionBias",
    "absorb_methods",
    "algorithm_1",
    "convert",
    "get_absorb_method",
]
