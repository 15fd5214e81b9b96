"""Causal softmax attention: a plain reference and the fast path (torch scaled_dot_product_attention).

Both take q of shape (B, H, T, d) and k, v of shape (B, H, P + T, d): the T queries sit at the last T
key positions (P > 0 when earlier keys come from a cache), and query i sees keys 0 .. P + i.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(n_queries: int, n_keys: int, device) -> torch.Tensor:
    """Boolean (T, P + T) mask, True where attention is allowed."""
    offset = n_keys - n_queries
    rows = torch.arange(n_queries, device=device)[:, None] + offset
    return torch.arange(n_keys, device=device)[None, :] <= rows


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    dropout_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each K/V head serves q.heads / k.heads query heads
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        keep = torch.rand(weights.shape, generator=generator, device=weights.device) >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v


def softmax_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    dropout_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        # under a CPU's autocast, attention stays float32: the bf16 kernels are slower there (a SmolLM2 kv-prefix
        # training step on 2 cores: 0.28-0.31 s against 0.31-0.35 s), and the softmax keeps float32's precision
        q, k, v = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, v))
        with torch.autocast("cpu", enabled=False):
            return softmax_attention_sdpa(q, k, v, scale=scale, dropout_p=dropout_p, generator=generator)
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    # grouped-query attention (fewer K/V heads than query heads): sdpa shares each K/V head with its group itself,
    # no expanded copy of the cache
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if n_queries == n_keys:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p, **gqa)
    if n_queries == 1:  # one new token sees every cached key: no mask needed
        return F.scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p, **gqa)
    # is_causal aligns the mask top-left; with a cache the queries are the last rows, so pass it explicitly
    mask = causal_mask(n_queries, n_keys, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout_p, **gqa)


SOFTMAX_ATTENTION_IMPLS = {"reference": softmax_attention_reference, "sdpa": softmax_attention_sdpa}
