"""Attention kernels, each with a plain reference next to the fast path (tests compare them)."""

from .feature_maps import FEATURE_MAPS, FavorFeatures, apply_feature_map
from .linear_attention import (
    LINEAR_ATTENTION_IMPLS,
    linear_attention_chunked,
    linear_attention_parallel,
    linear_attention_recurrent,
)
from .rope import apply_rope, rope_cos_sin
from .softmax_attention import SOFTMAX_ATTENTION_IMPLS, softmax_attention_reference, softmax_attention_sdpa

__all__ = [
    "FEATURE_MAPS",
    "FavorFeatures",
    "apply_feature_map",
    "LINEAR_ATTENTION_IMPLS",
    "linear_attention_chunked",
    "linear_attention_parallel",
    "linear_attention_recurrent",
    "apply_rope",
    "rope_cos_sin",
    "SOFTMAX_ATTENTION_IMPLS",
    "softmax_attention_reference",
    "softmax_attention_sdpa",
]
