"""Softmax attention over a fixed-size key/value buffer, for decode steps captured as a CUDA graph.

A decode step that appends to its cache (torch.cat) changes shapes every token, so it cannot be replayed; here
each layer's keys and values live in preallocated buffers (B, H_kv, capacity, d), the new tokens are written at
each row's own positions (a device tensor, so a replayed step writes where the rows now are), and each query
attends the whole buffer under a mask that allows keys up to its own position. Masked keys get weight exactly 0,
so the result equals causal attention over the filled part (`causal_reference`, the plain form beside it) up to
the rounding of a longer reduction.

Rows may sit at different positions (right-padded queries of different lengths): padding written past a row's
end is masked for that row and overwritten by its next tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StaticKV:
    """One layer's buffers and the rows' positions (shared by every layer of a model: the position of each row's
    next token, (B,) int64). The cache protocol of models.transformer (LayerState): `attend` writes the new keys
    and values at positions .. positions + T - 1 and returns itself; the caller advances `positions`."""

    k: torch.Tensor  # (B, H_kv, capacity, d)
    v: torch.Tensor
    positions: torch.Tensor  # (B,)

    @classmethod
    def filled(cls, k: torch.Tensor, v: torch.Tensor, capacity: int, positions: torch.Tensor) -> "StaticKV":
        """Buffers of `capacity` positions holding k, v (B, H_kv, P, d) at positions 0 .. P - 1 (rows broadcast)."""
        b = positions.shape[0]
        if capacity < k.shape[2]:
            raise ValueError(f"a static cache of {capacity} positions cannot hold {k.shape[2]} cached ones")
        kb = k.new_zeros(b, k.shape[1], capacity, k.shape[3])
        vb = v.new_zeros(b, v.shape[1], capacity, v.shape[3])
        kb[:, :, : k.shape[2]] = k
        vb[:, :, : v.shape[2]] = v
        return cls(kb, vb, positions)

    def attend(self, q, k, v, *, scale, expand_kv=None):
        t = q.shape[2]
        index = self.positions[:, None] + torch.arange(t, device=q.device)  # (B, T): each new token's slot
        slots = index[:, None, :, None].expand(k.shape)  # (B, H_kv, T, d): scatter along the positions
        self.k.scatter_(2, slots, k)
        self.v.scatter_(2, slots, v)
        allowed = torch.arange(self.k.shape[2], device=q.device) <= index[:, :, None]  # (B, T, capacity)
        gqa = {"enable_gqa": True} if self.k.shape[1] != q.shape[1] else {}
        out = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=allowed[:, None], scale=scale, **gqa)
        return out, self


def causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The plain form: queries (B, H, T, d) at the last T of the keys (B, H_kv, P + T, d), each seeing keys up to
    its own position."""
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    t, n = q.shape[2], k.shape[2]
    scores = (q @ k.transpose(-2, -1)) * scale
    allowed = torch.arange(n, device=q.device)[None, :] <= torch.arange(n - t, n, device=q.device)[:, None]
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v
