"""H_sim-split linear operations (Definitions D.4, D.5) and the parameter tree of a built TinT.

A D_sim vector is H_sim heads of d_sim = D_sim / H_sim coordinates. The split-wise map applies one
d_sim x d_sim matrix per head (H_sim d_sim^2 = D_sim^2 / H_sim parameters); the dimension-wise map applies
one H_sim x H_sim matrix per coordinate, mixing heads (d_sim H_sim^2 = D_sim H_sim). A pair replaces a
dense D_sim x D_sim matrix at Q_split = D_sim^2 / H_sim + H_sim D_sim parameters. (The paper's worked
example in App. D.1 calls the two maps by each other's names; the definitions are what is used here.)

The simulator in `modules.py` applies its projections as the index maps they are; `output_map_linear_forward`
and `query_map_linear_backward` build the same maps as explicit split/dimension-wise weights, and the tests
check that both agree. `build_parameter_tree` lays out every fixed weight of a layer-unrolled TinT (on the
meta device for counting) so that Table 3 can be counted from real module shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from .modules import Layout


class SplitWise(nn.Module):
    """Def. D.4: head h -> W_h head_h + B_h."""

    def __init__(self, n_heads: int, d_head: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_heads, d_head, d_head, device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n_heads, d_head, device=device, dtype=dtype), requires_grad=False)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        H, d, _ = self.weight.shape
        heads = e.view(*e.shape[:-1], H, d)
        return (torch.einsum("hij,...hj->...hi", self.weight, heads) + self.bias).reshape(e.shape)


class DimensionWise(nn.Module):
    """Def. D.5: coordinate c of every head -> W_c (coordinate c across heads) + B_c."""

    def __init__(self, n_heads: int, d_head: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d_head, n_heads, n_heads, device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(d_head, n_heads, device=device, dtype=dtype), requires_grad=False)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        d, H, _ = self.weight.shape
        columns = e.view(*e.shape[:-1], H, d).transpose(-1, -2)  # (..., d, H)
        out = torch.einsum("cgh,...ch->...cg", self.weight, columns) + self.bias
        return out.transpose(-1, -2).reshape(e.shape)


class HSplitLinear(nn.Module):
    """A split-wise and a dimension-wise map in the given order ("split-dim" or "dim-split")."""

    def __init__(self, n_heads: int, d_head: int, order: str = "split-dim", device=None, dtype=None):
        super().__init__()
        if order not in ("split-dim", "dim-split"):
            raise ValueError(f"order must be 'split-dim' or 'dim-split', got {order!r}")
        self.order = order
        self.split = SplitWise(n_heads, d_head, device, dtype)
        self.dim = DimensionWise(n_heads, d_head, device, dtype)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return self.dim(self.split(e)) if self.order == "split-dim" else self.split(self.dim(e))

    def num_weights(self) -> int:
        """Weights without biases (Table 3 ignores biases)."""
        return self.split.weight.numel() + self.dim.weight.numel()


def output_map_linear_forward(layout: Layout, dst: int, dtype=torch.float64) -> HSplitLinear:
    """The Linear Forward module's output projection as explicit weights: the attention output (head (s, s'),
    coordinate j holds <w^{s'}_{sK+j}, x^{s'}>; bias heads hold the bias shards) -> W x + b in slot dst.
    Split-wise: in head (s, s'), coordinate j -> (sK + j) mod d_sim; dimension-wise: per coordinate, heads
    (s, *) are summed into head dst*S' + (sK + j) // d_sim; bias head (S, s') -> head dst*S' + s'."""
    L = layout
    d, H, K = L.d_head, L.n_heads, L.K
    op = HSplitLinear(H, d, "split-dim", dtype=dtype)
    with torch.no_grad():
        for s in range(L.S):
            for sp in range(L.shards):
                h = s * L.shards + sp
                for j in range(K):
                    f = s * K + j
                    if f >= L.d_aux:
                        continue
                    op.split.weight[h, f % d, j] = 1
                    op.dim.weight[f % d, dst * L.shards + f // d, h] = 1
        if L.bias_slot:
            for sp in range(L.shards):
                h = L.S * L.shards + sp
                op.split.weight[h] += torch.eye(d, dtype=dtype)
                for c in range(d):
                    op.dim.weight[c, dst * L.shards + sp, h] = 1
    return op


def query_map_linear_backward(layout: Layout, src: int, dtype=torch.float64) -> HSplitLinear:
    """The Linear Backward module's query projection as explicit weights: dy in slot src -> head (s, s'),
    coordinate j holds dy[sK + j]. Dimension-wise: coordinate c of head src*S' + f // d_sim -> head (s, s')
    for f = sK + j with f mod d_sim = c; split-wise: in head (s, s'), coordinate f mod d_sim -> j."""
    L = layout
    d, H, K = L.d_head, L.n_heads, L.K
    op = HSplitLinear(H, d, "dim-split", dtype=dtype)
    with torch.no_grad():
        for s in range(L.S):
            for sp in range(L.shards):
                h = s * L.shards + sp
                for j in range(K):
                    f = s * K + j
                    if f >= L.d_aux:
                        continue
                    op.dim.weight[f % d, h, src * L.shards + f // d] = 1
                    op.split.weight[h, j, f % d] = 1
    return op


class AttentionParameters(nn.Module):
    """The fixed weights of one TinT attention layer (Def. C.1): Q, K, V and output H-split projections
    and the three position maps W^p (T_sim x d_sim) with their per-head gates lambda."""

    def __init__(self, layout: Layout, t_sim: int, device=None, dtype=None):
        super().__init__()
        H, d = layout.n_heads, layout.d_head
        self.q, self.k, self.v, self.out = (HSplitLinear(H, d, device=device, dtype=dtype) for _ in range(4))
        self.positions = nn.Parameter(torch.zeros(3, t_sim, d, device=device, dtype=dtype), requires_grad=False)
        self.gates = nn.Parameter(torch.zeros(3, H, device=device, dtype=dtype), requires_grad=False)

    def num_weights(self) -> int:
        return sum(m.num_weights() for m in (self.q, self.k, self.v, self.out)) + self.positions.numel()


class TokenMaps(nn.Module):
    """`n` dimension-wise maps of a token-wise layer (norm / activation backward combinations)."""

    def __init__(self, layout: Layout, n: int, device=None, dtype=None):
        super().__init__()
        self.maps = nn.ModuleList(DimensionWise(layout.n_heads, layout.d_head, device, dtype) for _ in range(n))

    def num_weights(self) -> int:
        return sum(m.weight.numel() for m in self.maps)


# the modules of one auxiliary pre-LN block, in order, and their kind (a row of Table 3)
BLOCK_MODULES = (("norm1", "layernorm"), ("self_attention", "self_attention"), ("attn_out", "linear"),
                 ("norm2", "layernorm"), ("fc_in", "linear"), ("activation", "activation"), ("fc_out", "linear"))


def module_parameters(layout: Layout, kind: str, t_sim: int, device="meta", dtype=torch.float32) -> nn.ModuleDict:
    """The fixed weights of the TinT modules simulating one auxiliary module of a kind, by operation ("fwd",
    "bwd", "descent"). Self-attention: forward = the q/k/v Linear Forward (shared by the three) + the softmax
    layer; backward = score recomputation + transposed-score layer + W_V Linear Backward; descent = W_V."""

    def attention():
        return AttentionParameters(layout, t_sim, device, dtype)

    if kind == "linear":
        return nn.ModuleDict({"fwd": attention(), "bwd": attention(), "descent": attention()})
    if kind == "layernorm":
        return nn.ModuleDict({"fwd": attention(), "bwd": nn.ModuleList([attention(), TokenMaps(layout, 2, device, dtype)]),
                              "descent": attention()})
    if kind == "self_attention":
        return nn.ModuleDict({"fwd": nn.ModuleList([attention(), attention()]),
                              "bwd": nn.ModuleList([attention(), attention(), attention()]), "descent": attention()})
    if kind == "activation":
        return nn.ModuleDict({"fwd": HSplitLinear(layout.n_heads, layout.d_head, device=device, dtype=dtype),
                              "bwd": TokenMaps(layout, 2, device, dtype)})
    raise ValueError(f"unknown module kind {kind!r}")


def build_parameter_tree(layout: Layout, n_layer: int, t_aux: int, device="meta", dtype=torch.float32) -> nn.ModuleDict:
    """Every fixed weight of a layer-unrolled TinT for an n_layer GPT-2/OPT-style auxiliary model, grouped
    as `layer.module.operation` (`BLOCK_MODULES`; operations "fwd", "bwd", "descent"). The four sub-MLPs
    of an MLP share their modules (App. I), as do q/k/v. Embeddings and the LM head are not counted."""
    t_sim = layout.K + t_aux
    return nn.ModuleDict({
        str(i): nn.ModuleDict({name: module_parameters(layout, kind, t_sim, device, dtype) for name, kind in BLOCK_MODULES})
        for i in range(n_layer)
    })


def count_weights(module: nn.Module) -> int:
    """Weights of a (sub)tree without biases and gates (the conventions of Table 3)."""
    total = 0
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("bias", "gates"):
            continue
        total += p.numel()
    return total
