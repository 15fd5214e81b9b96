"""TinT modules (Panigrahi et al., appendices C-H): attention and token-wise layers with FIXED weights that
run the forward, backward and descent operations of an auxiliary model whose weights live in PREFIX
embeddings, i.e. in the activations, where the simulator can both read and write them.

Layout (all configurable in `TintConfig`): a D_aux x D_aux weight W is stored in K = ceil(D_aux / S)
prefix tokens; prefix j holds, in its slot s < S, the row s*K + j of W (rows strided over the prefixes so
that the H_sim-split output maps stay a single split-wise + dimension-wise pair); with a bias slot the
bias b sits in slot S of prefix 0 (the released code's layout: S = 3, D_sim = 4 D_aux, K = D_aux / 3).
A D_sim vector is seen as n_slots slots of D_aux coordinates, or as H_sim = n_slots * S' heads of
d_sim = D_aux / S' coordinates (slot i = heads i*S' .. (i+1)*S'-1): head (s, s') of a linear module holds
shard s' of slot s.

Every module below is ONE attention layer (Definition C.1: projections of the input, plus one-hot
position terms W^p p_t gated per head by lambda, linear or softmax scores, an output projection and a
residual) acting on the sequence [prefix; tokens], or a token-wise layer (group norm, activation MLP,
fixed linear maps between slots). The weights are fixed selections built from the layout; the
H_sim-split projections (Definitions D.4, D.5) are applied as the index maps they are (gathers, sums over
heads) rather than as stored tensors, and their parameters are counted by the paper's formula
(`q_split`). Token-wise layers act on token positions only: prefix positions pass through unchanged.
The Linear Forward / Backward / Descent layers are linear attention with one-hot position values (or queries),
so their output is a matmul with the weight rows stored in the prefixes; `TintConfig.fast` (the default)
evaluates them that way (the rows read from the prefix embeddings, then one matmul), `fast=False` runs the
attention as written, head by head (a simulated step 3.5-4.5x slower in `benchmarks/tint_step.py`; the two are
tested equal in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import limit


@dataclass
class TintConfig:
    rows_per_prefix: int = limit(3, min=1)  # S: weight rows stacked in one prefix embedding
    shards: int = limit(3, min=1)  # S': each row is split into S' shards, one attention head each (H_sim = n_slots * S')
    bias_slot: bool = True  # one more D_aux slot per prefix for the bias (released-code layout)
    learning_rate: float = limit(1e-3, gt=0)  # eta of the simulated SGD step (summed loss)
    n_steps: int = limit(1, min=1)  # simulated SGD steps on the training tokens
    n_simulation_layers: int | None = limit(None, min=1)  # top layers updated; None = all
    # finite-difference steps of the LayerNorm (Def. A.3) and activation (Def. G.3) backward: error O(eps) +
    # rounding / eps; 1e-4 suits float64; in float32 use ~1e-2 (the update is then ~3e-4 off exact SGD's, 3% with 1e-4)
    ln_eps: float = limit(1e-4, gt=0)  # the LayerNorm backward's finite-difference step
    act_eps: float = limit(1e-4, gt=0)  # the activation backward's finite-difference step
    # the paper's construction (and the released code) descends on every LayerNorm bias, the final one included;
    # False freezes the final norm (it is still back-propagated through)
    update_final_norm: bool = True  # descend on the final LayerNorm too (the paper's construction)
    # compatibility with the released code's numbers, an artefact there: its MLP is split into sub-MLPs of
    # width D_aux that each carry b_out / n_chunks and each take the full bias step, so b_out moves n_chunks
    # times (4x for GPT-2); False stores b_out once and steps it once (faithful SGD)
    released_mlp_out_bias: bool = False  # step the MLP output bias n_chunks times, as the released code does
    # how the Linear Forward / Backward / Descent attention layers are evaluated: True contracts their one-hot
    # values (or queries) and the sum over shards into one matmul with the rows read from the prefixes (the
    # same layer output, a fraction of the ops); False runs the attention as written, head by head (the
    # reference path the fast one is tested against)
    fast: bool = True  # the linear layers' one-hot attention contracted into one matmul (the same output)

    def __post_init__(self):
        if self.rows_per_prefix < 1 or self.shards < 1 or self.n_steps < 1:
            raise ValueError("rows_per_prefix, shards and n_steps must be >= 1")
        if self.ln_eps <= 0 or self.act_eps <= 0:
            raise ValueError("ln_eps and act_eps must be > 0")


class Layout:
    """Sizes of the simulator for an auxiliary width D_aux."""

    def __init__(self, d_aux: int, config: TintConfig):
        S, shards = config.rows_per_prefix, config.shards
        if d_aux % shards:
            raise ValueError(f"D_aux={d_aux} is not divisible by shards={shards}")
        self.d_aux, self.S, self.shards, self.bias_slot = d_aux, S, shards, config.bias_slot
        self.fast = config.fast
        self.n_slots = S + int(config.bias_slot)
        if self.n_slots < 4:
            raise ValueError(f"the simulator needs >= 4 slots of D_aux per token (rows_per_prefix + bias_slot), got {self.n_slots}")
        self.K = math.ceil(d_aux / S)
        self.d_head = d_aux // shards
        if self.K > self.d_head:
            raise ValueError(
                f"K = ceil(D_aux / S) = {self.K} prefixes do not fit the head dimension D_aux / S' = {self.d_head}: "
                "use shards <= rows_per_prefix"
            )
        self.d_sim = self.n_slots * d_aux
        self.n_heads = self.n_slots * shards
        self.n_weight_heads = S * shards

    # ------------------------------------------------------------------ prefix packing and reading
    def pack(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Prefix embeddings (K, D_sim) holding a (D_aux, D_aux) weight and optional bias."""
        D, S, K = self.d_aux, self.S, self.K
        if weight.shape != (D, D):
            raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({D}, {D})")
        rows = weight.new_zeros(S * K, D)
        rows[:D] = weight
        prefix = weight.new_zeros(K, self.n_slots, D)
        prefix[:, :S] = rows.view(S, K, D).transpose(0, 1)
        if bias is not None:
            if not self.bias_slot:
                if bool(bias.ne(0).any()):
                    raise ValueError("a nonzero bias needs bias_slot=True (there is no room for it in the prefixes)")
            else:
                prefix[0, S] = bias
        return prefix.reshape(K, self.d_sim)

    def read(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) back from prefix embeddings (the reader of the updated auxiliary weights)."""
        D, S, K = self.d_aux, self.S, self.K
        view = prefix.reshape(K, self.n_slots, D)
        weight = view[:, :S].transpose(0, 1).reshape(S * K, D)[:D]
        bias = view[0, S].clone() if self.bias_slot else None
        return weight.clone(), bias

    def rows(self, prefix: torch.Tensor) -> torch.Tensor:
        """The weight rows stored in the prefixes (D_aux, D_aux), a view-like read (no copy of the bias)."""
        D, S, K = self.d_aux, self.S, self.K
        return prefix.view(K, self.n_slots, D)[:, :S].transpose(0, 1).reshape(S * K, D)[:D]

    def bias(self, prefix: torch.Tensor) -> torch.Tensor:
        return prefix[0, self.S * self.d_aux : (self.S + 1) * self.d_aux]

    # ------------------------------------------------------------------ slot helpers (token-wise)
    def slot(self, tokens: torch.Tensor, index: int) -> torch.Tensor:
        return tokens[:, index * self.d_aux : (index + 1) * self.d_aux]

    def write(self, tokens: torch.Tensor, index: int, value: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
        """Residual with a fixed keep-mask: slot `index` is cleared (unless accumulating) and `value` added."""
        out = tokens.clone()
        part = out[:, index * self.d_aux : (index + 1) * self.d_aux]
        if accumulate:
            part += value
        else:
            part.copy_(value)
        return out

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """(T, D_sim) -> (T, H_sim, d_sim)."""
        return x.view(x.shape[0], self.n_heads, self.d_head)

    # ------------------------------------------------------------------ parameter counts (biases ignored)
    def q_split(self) -> int:
        """One H_sim-split linear map (split-wise + dimension-wise): D_sim^2 / H_sim + H_sim D_sim."""
        return self.d_sim**2 // self.n_heads + self.n_heads * self.d_sim

    def q_attention(self, t_sim: int) -> int:
        """One TinT attention layer: 4 H-split projections (Q, K, V, out) + 3 position maps T_sim x d_sim."""
        return 4 * self.q_split() + 3 * t_sim * self.d_head

    def dim_wise(self) -> int:
        """One dimension-wise H_sim-split map: d_sim H_sim^2 = D_sim H_sim."""
        return self.d_sim * self.n_heads


def one_hot_positions(n_prefix: int, n_tokens: int, width: int, dtype, device) -> torch.Tensor:
    """W^p p_t for every position: the one-hot of prefix j in coordinate j, zero for tokens (T_sim, width)."""
    positions = torch.zeros(n_prefix + n_tokens, width, dtype=dtype, device=device)
    positions[torch.arange(n_prefix), torch.arange(n_prefix)] = 1
    return positions


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, kind: str) -> torch.Tensor:
    """Multi-head attention (H, T, d) with a (T, T) boolean mask; linear scores are masked by zeroing,
    softmax scores by -inf (rows with no allowed key give 0). Only the block of query rows and key columns
    the mask opens is computed (tokens x prefixes in the linear modules): the same result as
    `attend_dense`, a fraction of the work."""
    rows, cols = allowed.any(1), allowed.any(0)
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    out[:, rows] = attend_dense(q[:, rows], k[:, cols], v[:, cols], allowed[rows][:, cols], kind)
    return out


def attend_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, kind: str) -> torch.Tensor:
    """Reference: scores between every query and key, then the mask."""
    scores = q @ k.transpose(-1, -2)
    if kind == "linear":
        probs = scores * allowed
    else:
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs @ v


def linear_attention_via_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """Theorem C.2: an (unmasked) linear attention head sum_j <q_t, k_j> v_j from softmax attention with 2H
    heads and one extra token u. Heads 1..H take logits eps <q_t, k_j> and -2 log eps on u (value 0), with
    values v_j / eps^3, giving sum_j (<q_t, k_j> + 1/eps + O(eps^0.9)) v_j; heads H+1..2H attend uniformly
    (value v_j, 0 on u); the output map subtracts (T+1)/eps times the second group. Error O(sqrt(eps))."""
    H, T, _ = q.shape
    logits = eps * (q @ k.transpose(-1, -2))
    logits = torch.cat([logits, torch.full((H, T, 1), -2 * math.log(eps), dtype=q.dtype, device=q.device)], -1)
    values = torch.cat([v, torch.zeros_like(v[:, :1])], 1)
    first = torch.softmax(logits, -1) @ (values / eps**3)
    second = torch.softmax(torch.zeros_like(logits), -1) @ values
    return first - (T + 1) / eps * second


def _token_to_prefix_mask(n_prefix: int, n_tokens: int, device) -> torch.Tensor:
    allowed = torch.zeros(n_prefix + n_tokens, n_prefix + n_tokens, dtype=torch.bool, device=device)
    allowed[n_prefix:, :n_prefix] = True
    return allowed


def _rows_as_heads(layout: Layout, g: torch.Tensor) -> torch.Tensor:
    """(T, D_aux) -> (T, S*S', d_sim): head (s, s') holds g[s*K + j] in coordinate j (the index map of the
    H-split query/key projection that lines a gradient up with the rows stored in the prefixes)."""
    S, K, D = layout.S, layout.K, layout.d_aux
    padded = F.pad(g, (0, S * K - D)).view(g.shape[0], S, K)
    padded = F.pad(padded, (0, layout.d_head - K))
    return padded.repeat_interleave(layout.shards, dim=1)


# ============================================================================ linear layer (App. D)


class LinearForward:
    """y = W x + b (Def. D.1). Linear attention: tokens query the prefixes; head (s, s') scores shard s' of
    x against shard s' of the row in slot s of prefix j and takes the one-hot of j as value, so coordinate
    j of its output is <w^{s'}_{sK+j}, x^{s'}>; bias heads attend to prefix 0 (position key) and copy the
    bias slot. The output map sums the shards and places W x + b in the destination slot."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __call__(self, prefix, tokens, src: int, dst: int, use_bias: bool = True, accumulate: bool = False):
        L = self.layout
        if L.fast:  # scores x rows, one-hot values and the shard sum contracted: x W^T (+ the bias heads' b)
            y = L.slot(tokens, src) @ L.rows(prefix).T
            if L.bias_slot and use_bias:
                y = y + L.bias(prefix)
            return L.write(tokens, dst, y, accumulate)
        K = prefix.shape[0]
        y = self.output_map(self.attention(prefix, tokens, src, use_bias), K)
        return L.write(tokens, dst, y[K:], accumulate)

    def attention(self, prefix, tokens, src: int, use_bias: bool = True) -> torch.Tensor:
        """The attention output before the output projection: (H_sim, T_sim, d_sim)."""
        L = self.layout
        K, T = prefix.shape[0], tokens.shape[0]
        e = torch.cat([prefix, tokens])
        heads = L.heads(e)
        positions = one_hot_positions(K, T, L.d_head, e.dtype, e.device)
        nw = L.n_weight_heads
        # queries: shard s' of the source slot, repeated for every row slot s (dimension-wise split op)
        q = heads[:, src * L.shards : (src + 1) * L.shards].repeat(1, L.S, 1)
        k = heads[:, :nw]  # keys: the stored rows themselves (identity)
        v = positions.unsqueeze(1).expand(-1, nw, -1)  # values: one-hot of the prefix (W^p_V, lambda^V = 1)
        if L.bias_slot:
            const = torch.zeros_like(heads[:, : L.shards])
            const[..., 0] = 1  # b_Q: a constant query on the bias heads
            pos0 = torch.zeros_like(const)
            pos0[0, :, 0] = 1  # key of prefix 0 only (position term)
            q = torch.cat([q, const], 1)
            k = torch.cat([k, pos0], 1)
            v = torch.cat([v, heads[:, nw:] * float(use_bias)], 1)
        return attend(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), _token_to_prefix_mask(K, T, e.device), "linear")

    def output_map(self, out: torch.Tensor, K: int) -> torch.Tensor:
        """Output projection (split-wise then dimension-wise, `hsplit.output_map_linear_forward` as weights):
        sum the shards, row s*K + j -> coordinate s*K + j, add the bias heads; (T_sim, D_aux)."""
        L = self.layout
        nw, t_sim = L.n_weight_heads, out.shape[1]
        rows = out[:nw].view(L.S, L.shards, t_sim, L.d_head)[..., :K].sum(1)  # (S, T_sim, K)
        y = rows.permute(1, 0, 2).reshape(t_sim, L.S * K)[:, : L.d_aux]
        if L.bias_slot:
            y = y + out[nw:].permute(1, 0, 2).reshape(t_sim, L.d_aux)
        return y

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim)


class LinearBackward:
    """dx = W^T dy (Def. D.2). Linear attention: tokens query the prefixes with dy lined up with the stored
    rows (head (s, s'), coordinate j holds dy[sK + j]), keys are the prefixes' one-hot positions, values the
    stored rows: head (s, s') returns sum_j dy[sK+j] w^{s'}_{sK+j}; the output map sums over s."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __call__(self, prefix, tokens, src: int, dst: int, accumulate: bool = False):
        L = self.layout
        if L.fast:  # one-hot keys and the sum over row slots contracted: dy W
            return L.write(tokens, dst, L.slot(tokens, src) @ L.rows(prefix), accumulate)
        K, T = prefix.shape[0], tokens.shape[0]
        e = torch.cat([prefix, tokens])
        heads = L.heads(e)
        nw = L.n_weight_heads
        q = _rows_as_heads(L, L.slot(e, src))
        k = one_hot_positions(K, T, L.d_head, e.dtype, e.device).unsqueeze(1).expand(-1, nw, -1)
        v = heads[:, :nw]
        out = attend(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), _token_to_prefix_mask(K, T, e.device), "linear")
        dx = out.view(L.S, L.shards, K + T, L.d_head).sum(0).permute(1, 0, 2).reshape(K + T, L.d_aux)
        return L.write(tokens, dst, dx[K:], accumulate)

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim)


class LinearDescent:
    """W <- W - eta sum_t dy_t x_t^T, b <- b - eta sum_t dy_t (Def. D.3) on the training tokens. Linear
    attention with the PREFIXES as queries (their one-hot positions), tokens as keys (dy lined up with the
    rows) and values (shards of x; dy on the bias heads, whose key is the constant 1 and query the one-hot
    of prefix 0); the residual adds -eta times the output to the prefixes."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __call__(self, prefix, tokens, x_slot: int, grad_slot: int, train: torch.Tensor, learning_rate: float,
                 update_weight: bool = True, update_bias: bool = True):
        L = self.layout
        if L.fast:  # one-hot queries contracted: sum_t dy_t x_t^T over the training tokens, in the prefix layout
            return prefix - learning_rate * self.update(tokens, x_slot, grad_slot, train, update_weight, update_bias)
        K, T = prefix.shape[0], tokens.shape[0]
        e = torch.cat([prefix, tokens])
        heads = L.heads(e)
        positions = one_hot_positions(K, T, L.d_head, e.dtype, e.device)
        q = positions.unsqueeze(1).expand(-1, L.n_heads, -1)
        k = _rows_as_heads(L, L.slot(e, grad_slot))
        v = heads[:, x_slot * L.shards : (x_slot + 1) * L.shards].repeat(1, L.S, 1) * float(update_weight)
        if L.bias_slot:
            const = torch.zeros_like(heads[:, : L.shards])
            const[K:, :, 0] = 1  # b_K on the token positions
            k = torch.cat([k, const], 1)
            v = torch.cat([v, heads[:, grad_slot * L.shards : (grad_slot + 1) * L.shards] * float(update_bias)], 1)
        allowed = torch.zeros(K + T, K + T, dtype=torch.bool, device=e.device)
        allowed[:K, K:] = train.to(e.device)  # prefixes attend to the training tokens only
        out = attend(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), allowed, "linear")
        update = out.permute(1, 0, 2).reshape(K + T, L.d_sim)[:K]  # identity layout: head (s, s') = slot s shard s'
        return prefix - learning_rate * update

    def update(self, tokens, x_slot: int, grad_slot: int, train: torch.Tensor, update_weight: bool, update_bias: bool):
        """The fast path's attention output on the prefixes (K, D_sim): G = sum_t dy_t x_t^T packed as W is
        (row s*K + j in slot s of prefix j), sum_t dy_t in prefix 0's bias slot."""
        L = self.layout
        dy, x = L.slot(tokens, grad_slot)[train], L.slot(tokens, x_slot)[train]
        grad = dy.T @ x if update_weight else dy.new_zeros(L.d_aux, L.d_aux)
        bias = dy.sum(0) if update_bias and L.bias_slot else None
        return L.pack(grad, bias)

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim)


# ============================================================================ token-wise layers (App. F, G)


def group_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """f(x) = (x - mean) / sqrt(var + eps) over the last dimension (the D_aux-group normalization, Def. F.3)."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """f(x) = x / sqrt(mean(x^2) + eps) (the group RMSnorm of Def. J.2, with torch's mean convention)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class NormForward:
    """LayerNorm (or RMSnorm) forward: a group-norm layer on the source slot, then a Linear Forward module
    with W = diag(gamma) and the bias in the prefixes."""

    def __init__(self, layout: Layout, kind: str, norm_eps: float):
        self.layout, self.kind, self.norm_eps = layout, kind, norm_eps
        self.linear = LinearForward(layout)

    def normalize(self, x):
        return group_norm(x, self.norm_eps) if self.kind == "layernorm" else rms_norm(x, self.norm_eps)

    def __call__(self, prefix, tokens, src: int, dst: int):
        L = self.layout
        tokens = L.write(tokens, dst, self.normalize(L.slot(tokens, src)))
        return self.linear(prefix, tokens, dst, dst)

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim)


class NormBackward:
    """First-order LayerNorm backward (Def. A.3): dx = (f(x + eps gamma*dy) - f(x)) / eps. A Linear Forward
    module without bias gives gamma*dy (prefix rows diag(gamma)); a dimension-wise map forms x + eps gamma*dy
    next to x (x copied by a residual connection from the forward module); one group-norm layer normalizes
    both slots; a dimension-wise map takes their difference over eps."""

    def __init__(self, layout: Layout, normalize, eps: float):
        self.layout, self.normalize, self.eps = layout, normalize, eps
        self.linear = LinearForward(layout)

    def __call__(self, prefix, tokens, grad: int, x_saved: torch.Tensor, dst: int, scratch: tuple[int, int]):
        L = self.layout
        a, b = scratch
        tokens = self.linear(prefix, tokens, grad, a, use_bias=False)  # gamma * dy in slot a
        tokens = L.write(tokens, a, x_saved + self.eps * L.slot(tokens, a))  # x + eps gamma dy
        tokens = L.write(tokens, b, x_saved)
        tokens = L.write(tokens, a, self.normalize(L.slot(tokens, a)))
        tokens = L.write(tokens, b, self.normalize(L.slot(tokens, b)))
        return L.write(tokens, dst, (L.slot(tokens, a) - L.slot(tokens, b)) / self.eps)

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim) + 2 * self.layout.dim_wise()


class ActivationForward:
    """sigma(x) on a slot: an MLP layer with an H-split linear in front (Q_split parameters)."""

    def __init__(self, layout: Layout, activation: str):
        self.layout, self.act = layout, ACTIVATIONS[activation]

    def __call__(self, tokens, src: int, dst: int):
        return self.layout.write(tokens, dst, self.act(self.layout.slot(tokens, src)))

    def num_parameters(self) -> int:
        return self.layout.q_split()


class ActivationBackward:
    """First-order activation backward (Def. G.3): dx = (sigma(x + eps dy) - sigma(x)) / eps, one MLP layer:
    a dimension-wise map stacks [x + eps dy, x], the activation, a dimension-wise map takes the difference
    over eps."""

    def __init__(self, layout: Layout, activation: str, eps: float):
        self.layout, self.act, self.eps = layout, ACTIVATIONS[activation], eps

    def __call__(self, tokens, grad: int, x_saved: torch.Tensor, dst: int):
        dy = self.layout.slot(tokens, grad)
        hidden = torch.stack([x_saved + self.eps * dy, x_saved])
        act = self.act(hidden)
        return self.layout.write(tokens, dst, (act[0] - act[1]) / self.eps)

    def num_parameters(self) -> int:
        return 2 * self.layout.dim_wise()


class GatedForward:
    """GLU gate (Def. J.3, SwiGLU in our models): y = sigma(gate) * up, one gated (GLU-type) MLP layer on two
    slots written by Linear Forward modules."""

    def __init__(self, layout: Layout, activation: str = "silu"):
        self.layout, self.act = layout, ACTIVATIONS[activation]

    def __call__(self, tokens, gate: int, up: int, dst: int):
        L = self.layout
        return L.write(tokens, dst, self.act(L.slot(tokens, gate)) * L.slot(tokens, up))


class GatedBackward:
    """First-order GLU backward (Def. J.5): for y = sigma(v) * u and dy,
    d_up = dy * sigma(v) (exact) and d_gate = (sigma(v + eps dy) - sigma(v)) * u / eps, from three gated
    layers (products of two slots) and a dimension-wise map; v and u come from the forward module."""

    def __init__(self, layout: Layout, eps: float, activation: str = "silu"):
        self.layout, self.eps, self.act = layout, eps, ACTIVATIONS[activation]

    def __call__(self, tokens, grad: int, gate_saved: torch.Tensor, up_saved: torch.Tensor, up_dst: int, gate_dst: int):
        L = self.layout
        dy = L.slot(tokens, grad)
        d_gate = (self.act(gate_saved + self.eps * dy) * up_saved - self.act(gate_saved) * up_saved) / self.eps
        d_up = dy * self.act(gate_saved)
        tokens = L.write(tokens, gate_dst, d_gate)
        return L.write(tokens, up_dst, d_up)


# ============================================================================ self-attention (App. E)


class AuxAttentionForward:
    """The auxiliary model's softmax attention on the q, k, v slots (written by Linear Forward modules):
    one TinT softmax attention layer with H_aux heads, causal among the tokens, prefix keys masked."""

    def __init__(self, layout: Layout, n_head: int, scale: bool):
        if layout.d_aux % n_head:
            raise ValueError(f"D_aux={layout.d_aux} is not divisible by n_head={n_head}")
        self.layout, self.n_head, self.scale = layout, n_head, scale

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        T, dh = q.shape[0], self.layout.d_aux // self.n_head
        q = q.view(T, self.n_head, dh).transpose(0, 1) * (dh**-0.5 if self.scale else 1.0)
        k = k.view(T, self.n_head, dh).transpose(0, 1)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")), dim=-1)

    def __call__(self, tokens, q_slot: int, k_slot: int, v_slot: int, dst: int):
        L = self.layout
        T, dh = tokens.shape[0], L.d_aux // self.n_head
        probs = self.scores(L.slot(tokens, q_slot), L.slot(tokens, k_slot))
        v = L.slot(tokens, v_slot).view(T, self.n_head, dh).transpose(0, 1)
        y = (probs @ v).transpose(0, 1).reshape(T, L.d_aux)
        return L.write(tokens, dst, y)

    def num_parameters(self, t_sim: int) -> int:
        return self.layout.q_attention(t_sim)


class AuxAttentionValueBackward:
    """Value-path backward (Def. E.6): dv_t = sum_j a_{j,t} dy_j per head, stop-gradient through the scores.
    Two layers as in Fig. 7: a softmax attention layer recomputes a_{t,j} from the saved q, k, and a linear
    attention layer whose scores are the transposed a_{j,t} (anti-causal: token t attends to j >= t) takes
    the head shards of dy as values."""

    def __init__(self, forward: AuxAttentionForward):
        self.forward, self.layout = forward, forward.layout

    def __call__(self, tokens, grad: int, q_saved: torch.Tensor, k_saved: torch.Tensor, dst: int):
        L, H = self.layout, self.forward.n_head
        T, dh = tokens.shape[0], L.d_aux // H
        probs = self.forward.scores(q_saved, k_saved)  # layer 1: a_{t,j}
        dy = L.slot(tokens, grad).view(T, H, dh).transpose(0, 1)
        anticausal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).triu()
        dv = attend_transposed(probs, dy, anticausal)  # layer 2
        return L.write(tokens, dst, dv.transpose(0, 1).reshape(T, L.d_aux))

    def num_parameters(self, t_sim: int) -> int:
        return 2 * self.layout.q_attention(t_sim)


class GroupedHeads:
    """Grouped K/V heads (GQA): W_K and W_V have kv_heads * d_head rows, stored zero-padded to D_aux rows so
    that the Linear modules apply unchanged. Two fixed token-wise maps (dimension-wise, slot to slot):
    `expand` repeats each K/V head for the n_head / kv_heads query heads of its group (forward), `reduce`
    sums the value-path gradient over the heads of a group (backward), so the shared W_V gets one step of
    the summed gradient, as SGD on the grouped model does."""

    def __init__(self, layout: Layout, n_head: int, kv_heads: int):
        if n_head % kv_heads:
            raise ValueError(f"n_head={n_head} must be a multiple of n_kv_head={kv_heads}")
        self.layout, self.n_head, self.kv_heads = layout, n_head, kv_heads
        self.group, self.d_head = n_head // kv_heads, layout.d_aux // n_head

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        if self.group == 1:
            return x
        kv = x[:, : self.kv_heads * self.d_head].view(x.shape[0], self.kv_heads, self.d_head)
        return kv.repeat_interleave(self.group, dim=1).reshape(x.shape[0], -1)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.group == 1:
            return x
        summed = x.view(x.shape[0], self.kv_heads, self.group, self.d_head).sum(2).reshape(x.shape[0], -1)
        return torch.cat([summed, x.new_zeros(x.shape[0], x.shape[1] - summed.shape[1])], 1)


def attend_transposed(probs: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Linear attention with scores a_{j,t} (read from the embeddings where layer 1 stored them)."""
    return (probs.transpose(-1, -2) * allowed) @ values


# ============================================================================ LM head gradient (App. H)


class LMHeadGradient:
    """dx_t = E^T softmax(E x_t) - E[s_{t+1}] for positions whose next token is a training token (summed
    cross-entropy, tied frozen embedding E). An MLP with softmax activation (weights E, E^T) gives
    E^T softmax(E x_t); a linear attention layer with scores 1 on (t, t+1) subtracts the next token's
    uncontextualized embedding E[s_{t+1}] (kept in a slot by a residual connection from the input layer)."""

    def __init__(self, layout: Layout, embedding):
        """`embedding`: the (vocab, D_aux) matrix E, or a function returning it."""
        self.layout, self._embedding = layout, embedding

    @property
    def embedding(self) -> torch.Tensor:
        return self._embedding() if callable(self._embedding) else self._embedding

    def __call__(self, tokens, x_slot: int, emb_slot: int, dst: int, n_train: int):
        L = self.layout
        T, E = tokens.shape[0], self.embedding
        x = L.slot(tokens, x_slot)
        expected = torch.softmax(x @ E.T, -1) @ E  # MLP, softmax activation
        shift = torch.zeros(T, T, dtype=tokens.dtype, device=tokens.device)
        rows = torch.arange(min(n_train, T) - 1, device=tokens.device)
        shift[rows, rows + 1] = 1  # head 1: t -> t+1 on the training segment, value -E[s]
        keep = torch.zeros(T, 1, dtype=tokens.dtype, device=tokens.device)
        keep[rows] = 1  # head 2: t -> t, value E^T softmax(E x_t)
        grad = keep * expected - shift @ L.slot(tokens, emb_slot)
        return L.write(tokens, dst, grad)

    def num_parameters(self) -> int:
        vocab, D = self.embedding.shape
        return 2 * vocab * D
