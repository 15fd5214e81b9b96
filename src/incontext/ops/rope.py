"""Rotary position embeddings (RoFormer), in the "rotate half" layout used by Hugging Face Llama.

The rotary matrix R_m pairs dimension i with i + d/2 (not 2i with 2i+1 as printed in RoFormer); the two
layouts differ by a fixed permutation of dimensions, so every identity the papers use (R_a R_b = R_{a+b},
R_m^T = R_{-m}) holds unchanged, and pretrained Llama weights load without permuting Q/K rows.
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (*positions.shape, dim) for integer (possibly negative) positions.

    Angles are computed in float64 for float64 outputs and in float32 otherwise (as transformers does),
    which keeps float32 parity with Hugging Face and float64 exactness tests tight.
    """
    if dim % 2:
        raise ValueError(f"RoPE needs an even dimension, got {dim}")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.int64).to(work) / dim))
    angles = positions.to(work)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_m x for x of shape (B, H, T, d) with cos/sin of shape (T, d) or (B, 1, T, d)."""
    return x * cos + rotate_half(x) * sin
