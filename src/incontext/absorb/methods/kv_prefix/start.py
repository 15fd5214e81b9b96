"""kv-prefix's starts beside the document's first p tokens: p of its K/V pairs spread over the whole document
(init=document-spread) and a press's kept pairs re-rotated to the prefix's positions (init=press-rerotated); both
move RoPE keys (rerotate)."""

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
    keys (kvpress gathers them unchanged). A press that keeps a different number of pairs per head (kvzip) has no
    such layout: a one-line ValueError (use init=press)."""
    from ....ops.masked_kv import MaskedKV

    if any(isinstance(layer, MaskedKV) for layer in pressed.layers):
        raise ValueError(f"kv-prefix: init=press-rerotated needs a press that keeps the same number of pairs in every "
                         f"head; {press} keeps a different number per head (use init=press, or a press such as snapkv)")
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
