"""A softmax layer's cached keys and values with some (head, position) pairs evicted: a per-head keep mask.

KV-cache presses that keep a different number of pairs in each head (kvpress's KVzip, AdaKV) leave a full-length
cache in which the evicted pairs must never be attended to. `MaskedKV` is that cache for our Transformer (the
models.transformer LayerState protocol): the new queries attend to the kept cached pairs and causally to each other.

    layer = MaskedKV(keys, values, keep)     # (B, H_kv, S, D), (B, H_kv, S, D), (B, H_kv, S) bool
    out, layer = layer.attend(q, k, v, scale=..., expand_kv=...)

`masked_attention_reference` is the plain reference beside it: every query head attends to the kept pairs of its
K/V head alone (gathered, no mask), then to the new keys causally; tests compare the two in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .softmax_attention import causal_mask


class MaskedKV:
    """Cached keys and values (B, H_kv, S, D) and which of them are kept (B, H_kv, S, bool); never written in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor):
        if keep.shape != keys.shape[:3] or keep.dtype != torch.bool:
            raise ValueError(f"keep must be a bool mask of shape {tuple(keys.shape[:3])}, got {tuple(keep.shape)} {keep.dtype}")
        self.keys, self.values, self.keep = keys, values, keep

    @property
    def seen(self) -> int:
        return self.keys.shape[-2]

    def kept_pairs(self) -> int:
        """The (row, head, position) pairs kept: what a compacted cache would hold."""
        return int(self.keep.sum())

    def with_tensors(self, keys: torch.Tensor, values: torch.Tensor) -> "MaskedKV":
        return MaskedKV(keys, values, self.keep.expand(keys.shape[0], *self.keep.shape[1:]))

    def expand_batch(self, batch: int) -> "MaskedKV":
        return MaskedKV(self.keys.expand(batch, *self.keys.shape[1:]), self.values.expand(batch, *self.values.shape[1:]),
                        self.keep.expand(batch, *self.keep.shape[1:]))

    def compacted(self, always: tuple[int, ...] = ()) -> "MaskedKV":
        """The same attention in fewer slots: in each row and K/V head, the kept pairs (and the positions `always`,
        kept or not: a frozen attention sink keeps its index) moved to the front in document order, the cache as long
        as the largest such count, the slots past a head's own count masked. Keys keep their rotation and the cache's
        position is the caller's, so new queries attend to exactly the same pairs; a trained prefix then holds (and a
        training step computes) its kept pairs only, not the whole document's (KVzip at a tenth of 1,851 tokens:
        the evicted nine tenths were attended as masked slots in every step)."""
        chosen = self.keep.clone()
        chosen[..., list(always)] = True
        count = int(chosen.sum(-1).max())
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)[..., :count]  # chosen first, in order

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.gather(2, order[..., None].expand(*order.shape, t.shape[-1]))

        return MaskedKV(pick(self.keys), pick(self.values), self.keep.gather(2, order))

    def attend(self, q, k, v, *, scale, expand_kv):
        """q (B, H, T, D) after RoPE, k and v (B, H_kv, T, D) of the new tokens: attention over the kept cached pairs
        and the new keys (causally), and this layer's state with the new keys appended (kept)."""
        batch = max(self.keys.shape[0], k.shape[0])
        keys = torch.cat([self.keys.expand(batch, *self.keys.shape[1:]), k.expand(batch, *k.shape[1:])], 2)
        values = torch.cat([self.values.expand(batch, *self.values.shape[1:]), v.expand(batch, *v.shape[1:])], 2)
        cached = self.keep.expand(keys.shape[0], *self.keep.shape[1:])  # a one-row mask serves a batch of queries
        keep = torch.cat([cached, torch.ones(k.shape[:3], dtype=torch.bool, device=k.device)], 2)
        groups = q.shape[1] // keys.shape[1]
        allowed = causal_mask(q.shape[-2], keys.shape[-2], q.device)[None, None] & \
            keep.repeat_interleave(groups, 1)[:, :, None, :]
        work = torch.promote_types(torch.promote_types(q.dtype, keys.dtype), torch.float32) \
            if q.device.type == "cpu" else torch.promote_types(q.dtype, keys.dtype)
        with torch.autocast(q.device.type, enabled=False):
            out = F.scaled_dot_product_attention(q.to(work), expand_kv(keys).to(work), expand_kv(values).to(work),
                                                 attn_mask=allowed, scale=scale)
        return out.to(q.dtype), MaskedKV(keys, values, keep)


def masked_attention_reference(q: torch.Tensor, cached_k: torch.Tensor, cached_v: torch.Tensor, keep: torch.Tensor,
                               k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The plain reference: per row and query head, softmax over the kept cached pairs of its K/V head (gathered)
    and the new keys up to the query's own position."""
    batch, heads, t, _ = q.shape
    groups = heads // cached_k.shape[1]
    out = torch.empty_like(q)
    for b in range(batch):
        for h in range(heads):
            g = h // groups
            kept = keep[b, g].nonzero().flatten()
            for i in range(t):
                keys = torch.cat([cached_k[b, g, kept], k[b, g, : i + 1]])
                values = torch.cat([cached_v[b, g, kept], v[b, g, : i + 1]])
                weights = torch.softmax(keys @ q[b, h, i] * scale, 0)
                out[b, h, i] = weights @ values
    return out
