"""kv-prefix's adapted model: the base with a trained K/V prefix (TrainedPrefix), and several documents' prefixes
composed (compose_prefixes)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ....models import Cache
from ....models.lm import cache_kv
from ....ops.masked_kv import MaskedKV
from ...presses import CacheBuffers, empty_cache


class TrainedPrefix(CacheBuffers):
    """The base with a trained K/V prefix: forward(query) attends to it first, the query at `position` on (the
    prefix's length; for a press start at its original positions, the document's length)."""

    method = "kv-prefix"
    prefix = "prefix"

    def __init__(self, base: nn.Module, state: Cache):
        super().__init__(base, state)
        self.history: dict[str, Any] = {}

    @classmethod
    def empty(cls, base, extra):
        """Buffers of the saved layout (presses.cache_layout, recorded by every save)."""
        if "masked" not in extra:
            raise ValueError("the saved prefix records no cache layout (an absorb folder of an older incontext): absorb "
                             "the document again")
        return cls(base, empty_cache(base, extra))


def compose_prefixes(*prefixes: TrainedPrefix) -> TrainedPrefix:
    """Several documents absorbed separately, answered together: their prefixes concatenated (Cartridges composes
    cartridges the same way, without retraining). Each prefix keeps the positions it was trained at; queries start
    after every position the prefixes hold: the sum of their lengths, and on a model that reads its BOS first the
    BOS each prefix holds after the first (as PEFT's compose_cartridge_adapters: absorb/methods/kv_prefix/export.py).
    A prefix started from a per-head press (MaskedKV layers) keeps its mask: its evicted pairs stay unattended."""
    if len(prefixes) < 2:
        raise ValueError("compose at least two prefixes")
    base = prefixes[0].base
    if any(p.base is not base for p in prefixes):
        raise ValueError("the prefixes were absorbed into different base models")
    states = [p.state() for p in prefixes]
    kvs = [cache_kv(state) for state in states]
    layers = []
    for i, layer in enumerate(states[0].layers):
        k, v = (torch.cat([kv[i][j] for kv in kvs], 2) for j in (0, 1))
        parts = [state.layers[i] for state in states]
        if any(isinstance(part, MaskedKV) for part in parts):  # a per-head press start (KVzip): its evicted pairs stay out
            keep = torch.cat([part.keep[:1] if isinstance(part, MaskedKV) else
                              torch.ones(kv[i][0].shape[:3], dtype=torch.bool, device=k.device)[:1]
                              for part, kv in zip(parts, kvs)], 2)
            layers.append(MaskedKV(k, v, keep))
        elif hasattr(layer, "seen"):  # a layer that counts the tokens it has seen (transformers' sliding windows)
            layers.append(type(layer)(k, v, sum(state.layers[i].seen for state in states)))
        else:
            layers.append((k, v))
    bos = int(getattr(base, "bos_id", None) is not None)  # each prefix holds its BOS; `position` leaves out the first
    position = sum(state.position for state in states) + bos * (len(states) - 1)
    return TrainedPrefix(base, Cache(layers=layers, position=position)).eval()
