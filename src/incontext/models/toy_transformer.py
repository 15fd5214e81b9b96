"""The two-layer toy transformer of Burns et al.'s bursty-classification study (sec. 3), many runs at once.

Per run (specs/residual-streams.md, from the authors' released code):
    layer 1:  Q1, K1, V1 = X Wq1, X Wk1, X Wv1            single head, causal incl. self, no 1/sqrt(d), no
              X2 = X + softmax(Q1 K1^T) V1                  output projection, no LayerNorm
    layer 2:  Q2, K2, V2 = X2 Wq2 (+ Q1), X2 Wk2 (+ K1), X2 Wv2 (+ V1)   the residual stream of the variant
              x3 = X2[-1] + softmax(q2 K2^T) V2             only the last position is read out
    MLP:      h = relu(W h + b) three times (d x d, scalar bias each, no residual), logits = Wr h (L x d)
Variants: classic (no stream), "q", "k" or "v" stream: layer 2 adds layer 1's RAW projection, unit weight, zero
extra parameters. At d = 150 (85 content + 65 positions) and L = 32 labels: 207,303 parameters in every variant.

Every parameter has a leading run axis R, so R independent runs (seeds x variants) train in one process with
batched matmuls: one run at a time leaves two CPU cores idle on 150 x 150 matrices. Runs never mix: run r's
outputs and gradients depend on run r's parameters and inputs only (tested against a loop over runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

STREAMS = ("none", "q", "k", "v")


@dataclass
class ToyTransformerConfig:
    d_model: int = 150  # token width: one-hot positions + content
    n_labels: int = 32
    init_dim: int = 85  # attention weights ~ N(0, 1 / init_dim): the content dimension D in the paper's code

    def __post_init__(self):
        for name in ("d_model", "n_labels", "init_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ToyTransformerConfig.{name} must be a positive integer, got {value!r}")


def parameter_count(config: ToyTransformerConfig) -> int:
    """Parameters of one run: 2 x (Wq, Wk, Wv) + 3 x (W, scalar b) + readout."""
    d = config.d_model
    return 6 * d * d + 3 * (d * d + 1) + config.n_labels * d


class ToyTransformer(nn.Module):
    """R runs of the toy transformer: inputs (R, B, T, d) -> logits (R, B, L) for the last position."""

    def __init__(self, config: ToyTransformerConfig, streams: list[str], generators: list[torch.Generator] | None = None):
        super().__init__()
        unknown = [s for s in streams if s not in STREAMS]
        if unknown or not streams:
            raise ValueError(f"streams must be a non-empty list of {STREAMS}, got {streams!r}")
        self.config, self.streams = config, list(streams)
        runs, d, n_labels = len(streams), config.d_model, config.n_labels
        self.attn1 = nn.Parameter(torch.empty(runs, d, 3 * d))  # [Wq1 | Wk1 | Wv1]
        self.attn2 = nn.Parameter(torch.empty(runs, d, 3 * d))
        self.mlp_weight = nn.Parameter(torch.empty(runs, 3, d, d))
        self.mlp_bias = nn.Parameter(torch.empty(runs, 3))
        self.readout = nn.Parameter(torch.empty(runs, d, n_labels))
        # which of q, k, v of layer 1 each run adds to layer 2 (0/1 per run)
        self.register_buffer("stream_mask", torch.tensor([[float(s == c) for c in "qkv"] for s in streams]))
        self.reset_parameters(generators)

    def reset_parameters(self, generators: list[torch.Generator] | None = None) -> None:
        """Each run draws from its own generator (so a seed means the same init in every variant)."""
        d = self.config.d_model
        generators = generators or [None] * len(self.streams)
        if len(generators) != len(self.streams):
            raise ValueError(f"{len(generators)} generators for {len(self.streams)} runs")
        with torch.no_grad():
            for r, g in enumerate(generators):
                for layer in (self.attn1, self.attn2):
                    layer[r].copy_(torch.randn(d, 3 * d, generator=g) / math.sqrt(self.config.init_dim))
                self.mlp_weight[r].copy_(torch.randn(3, d, d, generator=g) * math.sqrt(2.0 / d))
                self.mlp_bias[r].copy_(torch.randn(3, generator=g) / math.sqrt(d))
                self.readout[r].copy_(torch.randn(d, self.config.n_labels, generator=g) / math.sqrt(d))

    @property
    def runs(self) -> int:
        return len(self.streams)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.dim() != 4 or inputs.shape[0] != self.runs or inputs.shape[-1] != self.config.d_model:
            raise ValueError(f"inputs must be (runs={self.runs}, B, T, d={self.config.d_model}), got {tuple(inputs.shape)}")
        d, length = self.config.d_model, inputs.shape[2]
        q1, k1, v1 = _per_run_matmul(inputs, self.attn1).split(d, dim=-1)  # (R, B, T, d) each
        causal = torch.ones(length, length, dtype=torch.bool, device=inputs.device).tril()
        scores = (q1 @ k1.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
        x2 = inputs + scores.softmax(-1) @ v1

        w_q2, w_kv2 = self.attn2.split([d, 2 * d], dim=-1)
        stream = self.stream_mask[:, None, None, :]  # (R, 1, 1, 3)
        last = x2[:, :, -1:]
        q2 = _per_run_matmul(last, w_q2) + stream[..., 0:1] * q1[:, :, -1:]  # only the last query is read out
        k2, v2 = _per_run_matmul(x2, w_kv2).split(d, dim=-1)
        k2 = k2 + stream[..., 1:2] * k1
        v2 = v2 + stream[..., 2:3] * v1
        x3 = last + (q2 @ k2.transpose(-1, -2)).softmax(-1) @ v2  # (R, B, 1, d)

        h = x3[:, :, 0]  # (R, B, d)
        for i in range(3):
            h = F.relu(h @ self.mlp_weight[:, i] + self.mlp_bias[:, i, None, None])
        return h @ self.readout

    def run_state(self, r: int) -> dict[str, torch.Tensor]:
        """Run r's parameters (for saving one run, or comparing runs)."""
        return {name: p[r].detach().clone() for name, p in self.named_parameters()}


def _per_run_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(R, ..., d_in) @ (R, d_in, d_out) as one bmm over the flattened middle axes (a broadcast matmul would
    materialise the weight once per batch element)."""
    runs, d_in = x.shape[0], x.shape[-1]
    return torch.bmm(x.reshape(runs, -1, d_in), weight).reshape(*x.shape[:-1], weight.shape[-1])
