"""kv-prefix's starts beside the document's first p tokens: p of its K/V pairs spread over the whole document
(init=document-spread) and a press's kept pairs re-rotated to the prefix's positions (init=press-rerotated; a
per-head press such as KVzip keeps each head's own budget: per_head_prefix); both move RoPE keys (rerotate)."""

from __future__ import annotations

import torch

from ....models import Cache
from ....models.lm import cache_kv
from ....ops import apply_rope, rope_cos_sin


@torch.no_grad()
def rerotated_press(model, prompt: torch.Tensor, pressed: Cache, press: str) -> Cache:
    """init=press-rerotated: the press's kept pairs, each key re-rotated from its document position to its rank among
    its head's kept positions (0 .. n-1, in document order), the values in the same order: a prefix at positions
    0..n-1, the PEFT CARTRIDGE layout. The positions are found by matching each kept key with the document's own
    keys (kvpress gathers them unchanged). A press that keeps a different number of pairs per head (kvzip) keeps its
    per-head budgets: each head's kept pairs re-rotated to 0 .. n_h - 1, the prefix as long as the largest n_h, each
    head's unused tail masked (per_head_prefix)."""
    from ....ops.masked_kv import MaskedKV

    if any(isinstance(layer, MaskedKV) for layer in pressed.layers):
        return per_head_prefix(model, pressed)
    full = cache_kv(model.prefill(prompt[None]))
    kept = cache_kv(pressed)
    n = kept[0][0].shape[2]
    if any(k.shape[2] != n for k, _ in kept):
        raise ValueError(f"kv-prefix: init=press-rerotated needs the same number of kept pairs in every layer; {press} "
                         f"keeps {[k.shape[2] for k, _ in kept]} (use init=press)")
    layers = []
    for (fk, _), (k, v) in zip(full, kept):
        distance = torch.cdist(k[0].double(), fk[0].double())  # (H, n, M)
        found = distance.argmin(-1)  # (H, n): each kept key's document position
        if float(distance.gather(-1, found[..., None]).max()) > 1e-4 * float(fk.abs().max()):
            raise ValueError(f"kv-prefix: {press}'s kept keys are not the document's own (a press that merges or "
                             "changes them has no original positions): use init=press")
        order = found.argsort(-1)  # document order within each head
        positions = found.gather(-1, order)
        k = k.gather(2, order[None, :, :, None].expand_as(k))
        v = v.gather(2, order[None, :, :, None].expand_as(v))
        ranks = torch.arange(n, device=k.device).expand_as(positions)
        layers.append((rerotate(model, k, ranks - positions), v))
    return Cache(layers=layers, position=n)


@torch.no_grad()
def per_head_prefix(model, pressed: Cache) -> Cache:
    """A per-head press's masked cache (MaskedKV layers: the document's K/V, a keep mask per head) as a prefix that
    keeps each head's budget: in every layer and K/V head the n_h kept pairs, in document order, keys re-rotated from
    their document positions to 0 .. n_h - 1; the prefix is P = the largest n_h long (over layers and heads), each
    head's positions n_h .. P - 1 masked (MaskedKV), so the kept pairs are exactly the press's and the queries come
    at P, not after the whole document."""
    from ....ops.masked_kv import MaskedKV

    masks = [layer.keep[:1] for layer in pressed.layers]
    if any(m.shape[0] != 1 for m in masks):
        raise ValueError("kv-prefix: a per-head press start is made from one document")
    p = max(int(m.sum(-1).max()) for m in masks)
    layers = []
    for layer, keep in zip(pressed.layers, masks):
        k, v = layer.keys[:1], layer.values[:1]
        heads = k.shape[1]
        out_k = k.new_zeros(1, heads, p, k.shape[-1])
        out_v = v.new_zeros(1, heads, p, v.shape[-1])
        out_keep = torch.zeros(1, heads, p, dtype=torch.bool, device=k.device)
        for h in range(heads):
            positions = keep[0, h].nonzero().flatten()  # document order
            n = positions.shape[0]
            ranks = torch.arange(n, device=k.device)
            out_k[0, h, :n] = rerotate(model, k[:, h:h + 1, positions], ranks - positions)[0, 0]
            out_v[0, h, :n] = v[0, h, positions]
            out_keep[0, h, :n] = True
        layers.append(MaskedKV(out_k, out_v, out_keep))
    return Cache(layers=layers, position=p)


def rerotate(model, k: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """RoPE keys (B, H, S, D) moved by `shift` ((S,) or per head (H, S)) positions each: a key at position a becomes the key at
    a + shift (rotations compose, R(shift) R(a) = R(a + shift); our Transformer's RoPE)."""
    cos, sin = rope_cos_sin(shift, model.rope_dim, model.config.rope_theta, k.dtype)
    return apply_rope(k, cos, sin)


@torch.no_grad()
def spread_prefix(model, prompt: torch.Tensor, p: int, spans: list[tuple[int, int]] | None = None) -> Cache:
    """init=document-spread: p of the document's own K/V pairs, from positions spread evenly over the whole document
    (the first one always, the attention sink), computed with the whole document in context, each key re-rotated
    from its document position to its place in the prefix (0 .. p-1): a quarter of the document's cache that covers
    all of it, where `document` keeps its first quarter. At p = M it is the document's own cache (keep-prompt).
    With `spans` (the data stage's chunks, study.stage.chunk_spans), each pair is computed with the chunk that holds
    its position most centrally in context, and re-rotated from its place in that chunk."""
    m = prompt.shape[0]
    spans = spans or [(0, m)]
    index = torch.linspace(0, m - 1, p, dtype=torch.float64).round().long().tolist()
    home = [max(range(len(spans)), key=lambda j: min(i - spans[j][0], spans[j][1] - 1 - i)
                if spans[j][0] <= i < spans[j][1] else -1) for i in index]
    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    order: list[int] = []
    for j, (a, b) in enumerate(spans):
        mine = [t for t, h in enumerate(home) if h == j]
        if not mine:
            continue
        order += mine
        local = torch.tensor([index[t] - a for t in mine], device=prompt.device)
        shift = torch.tensor(mine, device=prompt.device) - local
        parts.append([(rerotate(model, k[:, :, local], shift), v[:, :, local])
                      for k, v in cache_kv(model.prefill(prompt[None, a:b]))])
    back = torch.argsort(torch.tensor(order, device=prompt.device))  # into prefix order
    kv = [(torch.cat([part[layer][0] for part in parts], 2)[:, :, back], torch.cat([part[layer][1] for part in parts], 2)[:, :, back])
          for layer in range(len(parts[0]))]
    return Cache(layers=kv, position=p)  # our Transformer's layers are (k, v) pairs, nothing else to keep
