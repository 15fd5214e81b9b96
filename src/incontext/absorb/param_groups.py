"""Parameter groups of our Transformer, for gradient steps that update only some of them (dynamic evaluation's
`params=` option): which weights descend and which stay frozen.

    select_groups("tint")                  # the subset TinT's simulated step updates
    select_groups("tint,input_embedding")  # ... plus the input token embedding (untied from the head)
    select_groups(["attention", "mlp"])

Groups (block groups cover every block, or the top n with `n_top_layers`):
- q, k, v: the rows of the fused attn.qkv weight (and bias) that make queries, keys, values;
- attn_out: the attention output projection; attn_extra: the rest of an attention layer (the value-residual
  mix, learned feature maps of linear attention);
- mlp: both MLP linears; ln_gain, ln_bias: gains and biases of every norm, the final norm's included;
- input_embedding: the token embedding as the input layer reads it (read_in for vector inputs);
  head: the LM head (read_out); positions: the learned position table.
Aliases: attention = q, k, v, attn_out, attn_extra; embeddings = input_embedding, head; qk = q, k.
Presets: all = every group; tint = v, attn_out, mlp, ln_bias (TinT's subset: W_V, b_V, the output
projection, the MLP, LayerNorm biases; W_Q, W_K, the gains and the embeddings frozen).

A tied embedding is one matrix with two uses. With both input_embedding and head selected it stays tied and
descends along the gradient of both uses; with one of them, the caller unties it (`untie`) and only the
selected use's copy descends, the other keeping its values.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import Transformer

GROUPS = ("q", "k", "v", "attn_out", "attn_extra", "mlp", "ln_gain", "ln_bias", "input_embedding", "head", "positions")
ALIASES = {
    "all": GROUPS,
    "tint": ("v", "attn_out", "mlp", "ln_bias"),
    "attention": ("q", "k", "v", "attn_out", "attn_extra"),
    "embeddings": ("input_embedding", "head"),
    "qk": ("q", "k"),
}


def select_groups(params: str | list[str] | tuple[str, ...]) -> frozenset[str]:
    """The groups a `params=` value names: a preset, group or alias, or several (a list, or joined by commas)."""
    names = params.split(",") if isinstance(params, str) else params
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"params must be a group name or a list of them, got {params!r}")
    groups: set[str] = set()
    for name in (n.strip() for n in names):
        if name not in GROUPS and name not in ALIASES:
            raise ValueError(f"unknown parameter group {name!r}; known: {', '.join(list(ALIASES) + list(GROUPS))}")
        groups.update(ALIASES.get(name, (name,)))
    return frozenset(groups)


def is_tied(model: Transformer) -> bool:
    return model.config.tokens and model.lm_head.weight is model.tok_emb.weight


def untie(model: Transformer) -> None:
    """Gives the head its own copy of a tied embedding matrix (in place; same values)."""
    if is_tied(model):
        model.lm_head.weight = nn.Parameter(model.tok_emb.weight.detach().clone(), requires_grad=model.tok_emb.weight.requires_grad)
        model.config.tie_embeddings = False


def _qkv_rows(model: Transformer, groups: frozenset[str]) -> torch.Tensor | None:
    """Bool over attn.qkv's output rows: those of the selected projections (None: all of them)."""
    c = model.config
    sizes = {"q": c.n_head * c.dim_head, "k": c.kv_heads * c.dim_head, "v": c.kv_heads * c.dim_head}
    if all(g in groups for g in sizes):
        return None
    device = next(model.parameters()).device
    return torch.cat([torch.full((n,), g in groups, dtype=torch.bool, device=device) for g, n in sizes.items()])


def named_groups(model: Transformer, n_top_layers: int | None = None) -> list[tuple[str, str, nn.Parameter]]:
    """(group, name, parameter) for every parameter (blocks: the top `n_top_layers` only); a tied matrix is
    listed once per use (input_embedding and head); the fused attn.qkv appears as group "qkv"."""
    c = model.config
    rows = []
    if c.tokens:
        rows.append(("input_embedding", "tok_emb.weight", model.tok_emb.weight))
    else:
        rows += [("input_embedding", f"read_in.{n}", p) for n, p in model.read_in.named_parameters()]
    if c.positions == "learned":
        rows.append(("positions", "pos_emb.weight", model.pos_emb.weight))
    first = 0 if n_top_layers is None else c.n_layer - n_top_layers
    for i in range(first, c.n_layer):
        rows += [(group, f"blocks.{i}.{name}", p) for group, name, p in _block_rows(model.blocks[i])]
    rows += _norm_rows("norm_f", model.norm_f)
    if c.tokens:
        rows.append(("head", "lm_head.weight", model.lm_head.weight))
    else:
        rows += [("head", f"read_out.{n}", p) for n, p in model.read_out.named_parameters()]
    return rows


def _norm_rows(prefix: str, norm: nn.Module) -> list[tuple[str, str, nn.Parameter]]:
    return [("ln_gain" if name == "weight" else "ln_bias", f"{prefix}.{name}", p) for name, p in norm.named_parameters()]


def _block_rows(block: nn.Module) -> list[tuple[str, str, nn.Parameter]]:
    rows = []
    for name, p in block.named_parameters():
        if name.startswith("attn.qkv."):
            rows.append(("qkv", name, p))
        elif name.startswith("attn.out."):
            rows.append(("attn_out", name, p))
        elif name.startswith("attn."):
            rows.append(("attn_extra", name, p))
        elif name.startswith("mlp."):
            rows.append(("mlp", name, p))
    return rows + _norm_rows("norm1", block.norm1) + _norm_rows("norm2", block.norm2)


def selected_parameters(model: Transformer, groups: frozenset[str], n_top_layers: int | None = None
                        ) -> list[tuple[str, nn.Parameter, torch.Tensor | None]]:
    """(name, parameter, rows) of the parameters in `groups`: rows is None (the whole parameter descends) or a
    bool mask over its first dimension (attn.qkv: the rows of the selected q, k, v). A tied embedding with only
    one of its uses selected must be untied first (see `untie`)."""
    if is_tied(model) and len(groups & {"input_embedding", "head"}) == 1:
        raise ValueError("a tied embedding with only one of its uses selected: untie the model first")
    chosen, seen = [], set()
    for group, name, p in named_groups(model, n_top_layers):
        if group == "qkv":
            if groups & {"q", "k", "v"}:
                chosen.append((name, p, _qkv_rows(model, groups)))
        elif group in groups and id(p) not in seen:  # a tied matrix descends once
            chosen.append((name, p, None))
        seen.add(id(p))
    if not chosen:
        raise ValueError(f"the parameter groups {sorted(groups)} select no parameter of this model")
    return chosen
