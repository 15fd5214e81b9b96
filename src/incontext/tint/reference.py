"""Plain-PyTorch references for the TinT simulator (autograd on a functional copy of our Transformer).

- `sgd_reference(model, ids, n_train, config, rules="approx")` (R-approx): SGD with TinT's own gradient
  rules: value-only attention backward (scores detached), finite-difference LayerNorm and activation
  backward with the same eps (custom autograd functions), bias-only LayerNorm update (the final norm's
  too, unless `update_final_norm=False`), frozen Q/K/gamma/embeddings, top-n layers, summed cross-entropy
  over the training tokens; `released_mlp_out_bias` scales the MLP output bias step by n_chunks as the
  released code does.
- `sgd_reference(..., rules="exact")` (R-exact): exact autograd gradients of the same loss for the same
  parameter subset.
R-dyn (exact SGD on all parameters: dynamic evaluation, Krause et al., the baseline TinT is compared with
in the paper) is `absorb.methods.dynamic_eval.prompt_sgd`, the project's one implementation.

Each returns the logits of a second forward on all tokens with the updated weights, those weights (our
Transformer's parameter names) and the training loss before each step.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from ..models.transformer import Transformer
from .modules import ACTIVATIONS, TintConfig, group_norm, rms_norm


def _normalize(kind: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return group_norm(x, eps) if kind == "layernorm" else rms_norm(x, eps)


class _FiniteDifferenceNorm(torch.autograd.Function):
    """y = gamma * f(x) + b; backward dx = (f(x + eps gamma*dy) - f(x)) / eps (Def. A.3), db = sum dy."""

    @staticmethod
    def forward(ctx, x, gamma, bias, kind, norm_eps, fd_eps):
        ctx.save_for_backward(x, gamma)
        ctx.settings = (kind, norm_eps, fd_eps)
        return _normalize(kind, x, norm_eps) * gamma + bias

    @staticmethod
    def backward(ctx, dy):
        x, gamma = ctx.saved_tensors
        kind, norm_eps, eps = ctx.settings
        dx = (_normalize(kind, x + eps * gamma * dy, norm_eps) - _normalize(kind, x, norm_eps)) / eps
        return dx, None, dy.reshape(-1, dy.shape[-1]).sum(0), None, None, None


class _FiniteDifferenceActivation(torch.autograd.Function):
    """y = sigma(x); backward dx = (sigma(x + eps dy) - sigma(x)) / eps (Def. G.3)."""

    @staticmethod
    def forward(ctx, x, name, eps):
        ctx.save_for_backward(x)
        ctx.settings = (name, eps)
        return ACTIVATIONS[name](x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        name, eps = ctx.settings
        act = ACTIVATIONS[name]
        return (act(x + eps * dy) - act(x)) / eps, None, None


class _FirstOrderGLU(torch.autograd.Function):
    """y = silu(gate) * up; backward d_up = dy * silu(gate), d_gate = (silu(gate + eps dy) - silu(gate)) * up / eps
    (Def. J.5)."""

    @staticmethod
    def forward(ctx, gate, up, eps):
        ctx.save_for_backward(gate, up)
        ctx.eps = eps
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        eps = ctx.eps
        return (F.silu(gate + eps * dy) - F.silu(gate)) * up / eps, dy * F.silu(gate), None


def split_parameters(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's parameters as detached tensors, the fused qkv split into attn.{q,k,v}."""
    c = model.config
    sizes = [c.n_head * c.dim_head, c.kv_heads * c.dim_head, c.kv_heads * c.dim_head]
    params = {}
    for name, value in model.state_dict().items():
        if ".attn.qkv." in name:
            for part, rows in zip("qkv", value.split(sizes)):
                params[name.replace("qkv", part)] = rows.detach().clone()
        else:
            params[name] = value.detach().clone()
    return params


def merge_parameters(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of split_parameters: a state dict of our Transformer."""
    state = {}
    for name, value in params.items():
        if ".attn.q." in name:
            state[name.replace(".q.", ".qkv.")] = torch.cat([value, params[name.replace(".q.", ".k.")],
                                                            params[name.replace(".q.", ".v.")]])
        elif ".attn.k." not in name and ".attn.v." not in name:
            state[name] = value
    return state


def functional_forward(model: Transformer, params: dict, ids: torch.Tensor, rules: str = "exact",
                       config: TintConfig | None = None, start_layer: int = 0, hidden: torch.Tensor | None = None,
                       return_hidden_at: int | None = None):
    """Our Transformer's forward on one sequence (T,) with parameters from `params`; rules="approx" uses
    TinT's gradient rules in the backward. Starts from `hidden` at block `start_layer` if given."""
    c = model.config
    config = config or TintConfig()
    approx = rules == "approx"
    T = ids.shape[0]

    def norm(prefix, x):
        gamma = params[prefix + ".weight"]
        bias = params.get(prefix + ".bias")
        if bias is None:
            bias = torch.zeros_like(gamma)
        if approx:
            return _FiniteDifferenceNorm.apply(x, gamma, bias, c.norm, c.norm_eps, config.ln_eps)
        return _normalize(c.norm, x, c.norm_eps) * gamma + bias

    def linear(prefix, x):
        out = x @ params[prefix + ".weight"].T
        return out + params[prefix + ".bias"] if prefix + ".bias" in params else out

    def activation(x):
        if c.mlp == "swiglu":
            gate, up = x.chunk(2, dim=-1)
            return _FirstOrderGLU.apply(gate, up, config.act_eps) if approx else F.silu(gate) * up
        return _FiniteDifferenceActivation.apply(x, c.mlp, config.act_eps) if approx else ACTIVATIONS[c.mlp](x)

    if hidden is None:
        x = params["tok_emb.weight"][ids]
        if c.positions == "learned":
            x = x + params["pos_emb.weight"][:T]
    else:
        x = hidden
    rope = None
    if c.positions == "rope":
        from ..ops import apply_rope, rope_cos_sin

        cos, sin = rope_cos_sin(torch.arange(T, device=ids.device), c.dim_head, c.rope_theta, x.dtype)
        rope = lambda t: apply_rope(t, cos, sin)
    H, KV, dh = c.n_head, c.kv_heads, c.dim_head
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    cached = None
    for i in range(start_layer, c.n_layer):
        if i == return_hidden_at:
            cached = x
        b = f"blocks.{i}."
        z = norm(b + "norm1", x)
        q, k, v = (linear(b + "attn." + p, z).view(T, n, dh).transpose(0, 1) for p, n in zip("qkv", (H, KV, KV)))
        if rope is not None:
            q, k = rope(q.unsqueeze(0))[0], rope(k.unsqueeze(0))[0]
        k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)  # grouped K/V heads
        if approx:  # value path only: no gradient through the attention scores
            q, k = q.detach(), k.detach()
        scores = (q @ k.transpose(-1, -2)) * (dh**-0.5 if c.scale_attn else 1.0)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        x = x + linear(b + "attn.out", (probs @ v).transpose(0, 1).reshape(T, H * dh))
        x = x + linear(b + "mlp.fc_out", activation(linear(b + "mlp.fc_in", norm(b + "norm2", x))))
    z = norm("norm_f", x)
    logits = z @ params["lm_head.weight"].T
    return (logits, cached) if return_hidden_at is not None else logits


def trainable_names(model: Transformer, n_top: int, update_final_norm: bool = True) -> list[str]:
    """TinT's parameter subset: top-n blocks' W_V, b_V, attention output, MLP linears, LayerNorm biases, and
    the final LayerNorm's bias (unless `update_final_norm=False`)."""
    c = model.config
    names = ["norm_f.bias"] if update_final_norm and c.bias and c.norm == "layernorm" else []
    for i in range(c.n_layer - n_top, c.n_layer):
        b = f"blocks.{i}."
        names += [b + "attn.v.weight", b + "attn.out.weight", b + "mlp.fc_in.weight", b + "mlp.fc_out.weight"]
        if c.bias:
            names += [b + "attn.v.bias", b + "attn.out.bias", b + "mlp.fc_in.bias", b + "mlp.fc_out.bias"]
            if c.norm == "layernorm":
                names += [b + "norm1.bias", b + "norm2.bias"]
    return names


def summed_loss(logits: torch.Tensor, ids: torch.Tensor, n_train: int) -> torch.Tensor:
    """Cross-entropy summed over the positions whose next token is a training token."""
    return F.cross_entropy(logits[: n_train - 1], ids[1:n_train], reduction="sum")


def sgd_reference(model: Transformer, ids: torch.Tensor, n_train: int, config: TintConfig, rules: str = "approx"):
    """R-approx (rules="approx") or R-exact (rules="exact"); returns (logits, updated state dict, losses)."""
    if rules not in ("approx", "exact"):
        raise ValueError(f"rules must be 'approx' or 'exact', got {rules!r}")
    c = model.config
    n_top = c.n_layer if config.n_simulation_layers is None else config.n_simulation_layers
    first = c.n_layer - n_top
    params = split_parameters(model)
    params["lm_head.weight"] = params.get("lm_head.weight", params["tok_emb.weight"])
    names = trainable_names(model, n_top, config.update_final_norm)
    n_chunks = -(-c.mlp_width // c.d_model)
    with torch.no_grad():  # the hidden state at the first updated layer does not change
        _, cached = functional_forward(model, params, ids, "exact", config, return_hidden_at=first)
    losses = []
    for _ in range(config.n_steps):
        leaves = {n: params[n].clone().requires_grad_(True) for n in names}
        current = {**params, **leaves}
        logits = functional_forward(model, current, ids, rules, config, start_layer=first, hidden=cached)
        loss = summed_loss(logits, ids, n_train)
        grads = torch.autograd.grad(loss, list(leaves.values()))
        losses.append(loss.detach())
        with torch.no_grad():
            for n, g in zip(names, grads):
                if config.released_mlp_out_bias and n.endswith("mlp.fc_out.bias"):
                    g = n_chunks * g  # one full step per sub-MLP (the released code's artefact)
                params[n] = params[n] - config.learning_rate * g
    with torch.no_grad():
        logits = functional_forward(model, params, ids, "exact", config, start_layer=first, hidden=cached)
    return logits, merge_parameters(params), losses


def compare_with_exact(model: Transformer, ids: torch.Tensor, n_train: int, config: TintConfig,
                       tint_logits: torch.Tensor, tint_state: dict[str, torch.Tensor]) -> dict[str, float]:
    """TinT (or R-approx) against R-exact: relative logits gap, cosine between the two parameter updates
    (over TinT's parameter subset), and the loss on the held-out tokens (after n_train) before and after."""
    exact_logits, exact_state, _ = sgd_reference(model, ids, n_train, config, rules="exact")
    c = model.config
    n_top = c.n_layer if config.n_simulation_layers is None else config.n_simulation_layers
    base = model.state_dict()
    names = sorted({n.replace(".attn.v.", ".attn.qkv.") for n in trainable_names(model, n_top, config.update_final_norm)})
    delta_tint = torch.cat([(tint_state[n] - base[n]).flatten() for n in names])
    delta_exact = torch.cat([(exact_state[n] - base[n]).flatten() for n in names])
    with torch.no_grad():
        before = model(ids[None])[0]

    def heldout(logits):
        if n_train >= ids.shape[0]:
            return float("nan")
        return float(F.cross_entropy(logits[n_train - 1 : -1], ids[n_train:]))

    return {
        "logits_rel_gap": float((tint_logits - exact_logits).norm() / exact_logits.norm()),
        "update_cosine": float(F.cosine_similarity(delta_tint, delta_exact, dim=0)),
        "update_norm_ratio": float(delta_tint.norm() / delta_exact.norm()),
        "heldout_loss_before": heldout(before),
        "heldout_loss_tint": heldout(tint_logits),
        "heldout_loss_exact": heldout(exact_logits),
    }
