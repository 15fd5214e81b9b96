"""Decoding from a cached context with a fixed-size cache, one token per row per step, the step captured once as a
CUDA graph and replayed. A 135M model's decode step launches about 1,070 kernels for 2.9 ms of GPU work; eager, an
H100 spends about 25 ms launching them (benchmarks/results/absorb_profile_cuda_h100.json).

    decoder = StaticDecoder(model, prompt_cache, rows=2, room=32, capture=True)
    logits = decoder.prefill(tokens, lengths)    # optional: right-padded tokens (B, T), eager
    logits = decoder.step(next_tokens)           # (B, V): one token per row, replayed after the first steps

Each layer's keys and values sit in buffers of the cached context's length + `room` positions (ops/static_kv.py);
the rows' positions are a device tensor (Cache.positions) that each step advances inside the graph. Without
`capture` (a CPU, or a check) the same step runs eagerly: the tests compare it with decoding on a plain cache
(float64, 1e-10); the device check compares the replayed steps with the eager ones.

For our Transformer with softmax attention and a cache of (k, v) pairs (is `supported`); transformers' models
decode through their own caches.
"""

from __future__ import annotations

import torch

from ..ops.static_kv import StaticKV
from ..runtime import device_of
from .transformer import Cache, Transformer


def bytes_per_row(cache: Cache, room: int) -> int:
    """The bytes of one row's buffers for a StaticDecoder over `cache` with `room` positions (every row holds a copy of
    the cached context's keys and values)."""
    k = cache.layers[0][0]
    return 2 * len(cache.layers) * k.shape[1] * (cache.position + room) * k.shape[3] * k.element_size()


def supported(model, cache: Cache) -> bool:
    """Whether StaticDecoder can decode from `cache` with `model`."""
    return (isinstance(model, Transformer) and model.config.attention == "softmax" and model.config.tokens
            and all(isinstance(layer, tuple) and len(layer) == 2 for layer in cache.layers))


class StaticDecoder:
    """Decode steps over a fixed-size copy of `cache` (one row, broadcast to `rows`) with `room` positions to fill."""

    warmup = 1  # eager steps (on a side stream) before the capture, as capture requires

    def __init__(self, model: Transformer, cache: Cache, rows: int, room: int, capture: bool):
        if not supported(model, cache):
            raise ValueError("StaticDecoder needs our Transformer with softmax attention and a (k, v) cache")
        device = device_of(model)
        if capture and device.type != "cuda":
            raise ValueError("capture needs a CUDA model")
        self.model, self.rows, self.capture = model, rows, capture
        capacity = cache.position + room
        self.start = cache.position
        self.positions = torch.full((rows,), cache.position, dtype=torch.long, device=device)
        layers = [StaticKV.filled(k, v, capacity, self.positions) for k, v in cache.layers]
        self.cache = Cache(layers=layers, position=cache.position, positions=self.positions)
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.capacity, self.calls, self.graph, self.logits = capacity, 0, None, None
        self.end = cache.position  # on the host: the furthest position any row has reached (the room's guard)
        self.stream = torch.cuda.Stream(device) if capture else None

    def restart(self) -> None:
        """Back to the cached context (the positions after it; what later steps wrote is masked and overwritten)."""
        self.positions.fill_(self.start)
        self.end = self.start

    def _take(self, n: int) -> None:
        if self.end + n > self.capacity:
            raise ValueError(f"the static cache holds {self.capacity} positions; {self.end + n} needed")
        self.end += n

    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) of right-padded tokens (B, T) after the context (eager); each row then continues after
        its own length (default T)."""
        self._take(tokens.shape[1])
        logits = self.model(tokens, cache=self.cache)
        self.positions.add_(tokens.shape[1] if lengths is None else lengths.to(self.positions))
        return logits

    def _step(self) -> torch.Tensor:
        logits = self.model(self.token, cache=self.cache)[:, -1]
        self.positions.add_(1)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) after one more token per row ((B,) or (B, 1)). The returned tensor is the graph's output,
        overwritten by the next step: clone it to keep it."""
        self._take(1)
        self.token.copy_(tokens.reshape(self.rows, 1))
        self.calls += 1
        if not self.capture:
            return self._step()
        if self.calls <= self.warmup:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                logits = self._step()
            torch.cuda.current_stream().wait_stream(self.stream)
            return logits
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._step()
        self.graph.replay()
        return self.logits
