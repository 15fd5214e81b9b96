"""The TinT simulator: a stack of the fixed-weight layers of `modules.py` that, in one forward pass over
[prefix embeddings; tokens], runs the auxiliary model forward on the context, back-propagates the summed
LM loss of the training tokens (top n layers), takes `n_steps` SGD steps by writing into the prefix
embeddings, and runs the updated model forward again from the cached hidden state to predict.

    sim = TinT.from_transformer(model, TintConfig(learning_rate=1e-3, n_simulation_layers=2))
    logits = sim(ids, n_train=32)                       # (T, vocab): second forward, updated weights
    logits, prefixes, losses = sim.simulate(ids, 32)    # the same, with the updated prefix embeddings
    updated = sim.updated_model(model, prefixes)        # the auxiliary model read back from them

Token slots during the forward modules: 0 the residual stream x (z after a norm), 1-3 q, k and MLP
scratch; during the backward: 0 the gradient dy, 1-3 scratch (SwiGLU needs a fifth slot). Activations
the backward and descent modules need (x, q, k, attention output, MLP activations) come from the forward modules through residual
(skip) connections, as in the paper; here they are kept in `saved` and written into a slot when used.
Every LayerNorm bias descends, the final norm's included (`update_final_norm=False` freezes that one).
Grouped K/V heads (Llama, GQA) are stored zero-padded to D_aux rows, repeated for their query heads in the
forward and their value gradient summed over the group in the backward (one step of the shared W_V).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..models.transformer import Transformer
from .modules import (
    ActivationBackward,
    ActivationForward,
    AuxAttentionForward,
    AuxAttentionValueBackward,
    GatedBackward,
    GatedForward,
    GroupedHeads,
    Layout,
    LinearBackward,
    LinearDescent,
    LinearForward,
    LMHeadGradient,
    NormBackward,
    NormForward,
    TintConfig,
)


def check_auxiliary(model: Transformer) -> None:
    c = model.config
    problems = []
    if not c.tokens:
        problems.append("token inputs (vocab_size)")
    if not c.tie_embeddings:
        problems.append("tied embeddings (the LM-head gradient uses the frozen input embedding E)")
    if c.attention != "softmax" or c.residual_stream != "none":
        problems.append("plain softmax attention without residual streams")
    if c.dim_head * c.n_head != c.d_model:
        problems.append("head_dim = d_model / n_head")
    if c.dropout or c.attn_dropout:
        problems.append("no dropout")
    if problems:
        raise ValueError("TinT needs an auxiliary model with " + "; ".join(problems))


class TinT(nn.Module):
    def __init__(self, model: Transformer, config: TintConfig | None = None):
        super().__init__()
        check_auxiliary(model)
        config = config or TintConfig()
        c = model.config
        self.config, self.aux_config = config, c
        self.layout = L = Layout(c.d_model, config)
        n_top = c.n_layer if config.n_simulation_layers is None else config.n_simulation_layers
        if not 1 <= n_top <= c.n_layer:
            raise ValueError(f"n_simulation_layers={config.n_simulation_layers} must lie in 1..{c.n_layer}")
        self.first_updated = c.n_layer - n_top
        self.n_chunks = -(-c.mlp_width // c.d_model)  # MLP widths that are not a multiple of D_aux: zero-padded
        self.has_bias = c.bias  # biases of the linears (updated by the descent modules only if present)
        self.norm_has_bias = c.bias and c.norm == "layernorm"  # the only LayerNorm parameter TinT updates
        # fixed weights of the simulator: the frozen embeddings (input layer and LM head) ...
        self.register_buffer("embedding", model.tok_emb.weight.detach().clone())
        self.register_buffer("pos_embedding", model.pos_emb.weight.detach().clone() if c.positions == "learned" else None)
        # ... and the modules (one instance per kind: the same fixed weights serve every layer and sub-layer)
        self.linear_forward, self.linear_backward, self.linear_descent = LinearForward(L), LinearBackward(L), LinearDescent(L)
        self.norm_forward = NormForward(L, c.norm, c.norm_eps)
        self.norm_backward = NormBackward(L, self.norm_forward.normalize, config.ln_eps)
        self.glu = c.mlp == "swiglu"
        if self.glu:
            if L.n_slots < 5:
                raise ValueError(f"a SwiGLU auxiliary model needs >= 5 slots per token (rows_per_prefix + bias_slot), got {L.n_slots}")
            self.gate_forward, self.gate_backward = GatedForward(L), GatedBackward(L, config.act_eps)
        else:
            self.act_forward = ActivationForward(L, c.mlp)
            self.act_backward = ActivationBackward(L, c.mlp, config.act_eps)
        self.attn_forward = AuxAttentionForward(L, c.n_head, c.scale_attn)
        self.attn_backward = AuxAttentionValueBackward(self.attn_forward)
        self.kv = GroupedHeads(L, c.n_head, c.kv_heads)
        self.lm_gradient = LMHeadGradient(L, lambda: self.embedding)  # read at call time (follows .to())
        self.rope = None
        if c.positions == "rope":
            self.rope = (c.rope_theta, c.dim_head)
        # the prefix embeddings: the auxiliary weights, K tokens per D_aux x D_aux block
        self.prefix_names: list[str] = []
        for name, (weight, bias) in self._blocks_of(model).items():
            self.register_buffer("prefix_" + name.replace(".", "_"), L.pack(weight, bias))
            self.prefix_names.append(name)

    @classmethod
    def from_transformer(cls, model: Transformer, config: TintConfig | None = None) -> TinT:
        return cls(model, config)

    # ------------------------------------------------------------------ prefix bookkeeping
    def _blocks_of(self, model: Transformer) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Every auxiliary weight as D_aux x D_aux blocks (norms as diag(gamma)); the MLP output bias is
        stored once, with chunk 0, or as b / n_chunks in every chunk with `released_mlp_out_bias`."""
        c = self.aux_config
        D, width = c.d_model, c.mlp_width
        blocks: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

        def detach(t):
            return None if t is None else t.detach()

        def pad_rows(t, rows):  # zero rows: K/V heads of a group, MLP units beyond the width
            return None if t is None else torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])

        def norm(module):
            return torch.diag(module.weight.detach()), detach(getattr(module, "bias", None))

        for i, block in enumerate(model.blocks):
            sizes = [c.n_head * c.dim_head, c.kv_heads * c.dim_head, c.kv_heads * c.dim_head]
            qkv_w = block.attn.qkv.weight.detach().split(sizes)
            qkv_b = [None] * 3 if block.attn.qkv.bias is None else block.attn.qkv.bias.detach().split(sizes)
            blocks[f"{i}.norm1"] = norm(block.norm1)
            for part, w, b in zip("qkv", qkv_w, qkv_b):
                blocks[f"{i}.{part}"] = (pad_rows(w, D), pad_rows(b, D))
            out = block.attn.out
            blocks[f"{i}.out"] = (out.weight.detach(), detach(out.bias))
            blocks[f"{i}.norm2"] = norm(block.norm2)
            fc_in, fc_out = block.mlp.fc_in, block.mlp.fc_out
            padded = self.n_chunks * D
            in_w, in_b = fc_in.weight.detach(), detach(fc_in.bias)
            if self.glu:  # fc_in = [gate; up]
                parts = {"gate": (pad_rows(in_w[:width], padded), pad_rows(None if in_b is None else in_b[:width], padded)),
                         "up": (pad_rows(in_w[width:], padded), pad_rows(None if in_b is None else in_b[width:], padded))}
            else:
                parts = {"fc_in": (pad_rows(in_w, padded), pad_rows(in_b, padded))}
            out_w = pad_rows(fc_out.weight.detach().T, padded).T
            for ch in range(self.n_chunks):
                rows = slice(ch * D, (ch + 1) * D)
                for name, (w, b) in parts.items():
                    blocks[f"{i}.{name}.{ch}"] = (w[rows], None if b is None else b[rows])
                out_bias = None if fc_out.bias is None else fc_out.bias.detach()
                if out_bias is not None and self.config.released_mlp_out_bias:
                    out_bias = out_bias / self.n_chunks
                elif ch:
                    out_bias = None
                blocks[f"{i}.fc_out.{ch}"] = (out_w[:, rows].contiguous(), out_bias)
        blocks["norm_f"] = norm(model.norm_f)
        return blocks

    def initial_prefixes(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, "prefix_" + name.replace(".", "_")) for name in self.prefix_names}

    # ------------------------------------------------------------------ the auxiliary model, simulated
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        L = self.layout
        x = self.embedding[ids]
        if self.pos_embedding is not None:
            x = x + self.pos_embedding[: ids.shape[0]]
        tokens = x.new_zeros(ids.shape[0], L.d_sim)
        return L.write(tokens, 0, x)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE on q or k (a fixed position-dependent rotation: a token-wise map driven by the positions)."""
        if self.rope is None:
            return x
        from ..ops import apply_rope, rope_cos_sin

        theta, dh = self.rope
        T, H = x.shape[0], self.aux_config.n_head
        cos, sin = rope_cos_sin(torch.arange(T, device=x.device), dh, theta, x.dtype)
        return apply_rope(x.view(1, T, H, dh).transpose(1, 2), cos, sin).transpose(1, 2).reshape(T, -1)

    def _block_forward(self, i: int, banks: dict, tokens: torch.Tensor, saved: dict | None) -> torch.Tensor:
        L = self.layout
        x = L.slot(tokens, 0).clone()
        tokens = self.norm_forward(banks[f"{i}.norm1"], tokens, 0, 0)
        z1 = L.slot(tokens, 0).clone()
        tokens = self.linear_forward(banks[f"{i}.q"], tokens, 0, 1)
        tokens = self.linear_forward(banks[f"{i}.k"], tokens, 0, 2)
        tokens = self.linear_forward(banks[f"{i}.v"], tokens, 0, 0)
        tokens = L.write(tokens, 0, self.kv.expand(L.slot(tokens, 0)))  # grouped K/V heads: one copy per query head
        tokens = L.write(tokens, 2, self.kv.expand(L.slot(tokens, 2)))
        tokens = L.write(tokens, 1, self._rope(L.slot(tokens, 1)))
        tokens = L.write(tokens, 2, self._rope(L.slot(tokens, 2)))
        q, k = L.slot(tokens, 1).clone(), L.slot(tokens, 2).clone()
        tokens = self.attn_forward(tokens, 1, 2, 0, dst=0)
        o = L.slot(tokens, 0).clone()
        tokens = self.linear_forward(banks[f"{i}.out"], tokens, 0, 0)
        tokens = L.write(tokens, 0, x, accumulate=True)  # the auxiliary residual (skip from the block input)
        h = L.slot(tokens, 0).clone()
        tokens = self.norm_forward(banks[f"{i}.norm2"], tokens, 0, 0)
        z2 = L.slot(tokens, 0).clone()
        tokens = L.write(tokens, 1, torch.zeros_like(z2))
        pre, act, up = [], [], []
        for ch in range(self.n_chunks):
            if self.glu:
                tokens = self.linear_forward(banks[f"{i}.gate.{ch}"], tokens, 0, 2)
                tokens = self.linear_forward(banks[f"{i}.up.{ch}"], tokens, 0, 3)
                pre.append(L.slot(tokens, 2).clone())
                up.append(L.slot(tokens, 3).clone())
                tokens = self.gate_forward(tokens, 2, 3, 2)
            else:
                tokens = self.linear_forward(banks[f"{i}.fc_in.{ch}"], tokens, 0, 2)
                pre.append(L.slot(tokens, 2).clone())
                tokens = self.act_forward(tokens, 2, 2)
            act.append(L.slot(tokens, 2).clone())
            tokens = self.linear_forward(banks[f"{i}.fc_out.{ch}"], tokens, 2, 1, accumulate=True)
        tokens = L.write(tokens, 0, h + L.slot(tokens, 1))
        if saved is not None:
            saved[i] = {"x": x, "z1": z1, "q": q, "k": k, "o": o, "h": h, "z2": z2, "pre": pre, "act": act, "up": up}
        return tokens

    def _block_backward(self, i, banks, new_banks, tokens, s, train) -> torch.Tensor:
        L, eta = self.layout, self.config.learning_rate
        descend = self.linear_descent
        # MLP, chunk by chunk: slot 0 = dy (block output), slot 1 accumulates dz2
        tokens = L.write(tokens, 1, torch.zeros_like(s["z2"]))
        for ch in range(self.n_chunks):
            fc_in, fc_out = f"{i}.fc_in.{ch}", f"{i}.fc_out.{ch}"
            tokens = self.linear_backward(banks[fc_out], tokens, 0, 2)  # d act
            tokens = L.write(tokens, 3, s["act"][ch])
            steps_out_bias = self.has_bias and (ch == 0 or self.config.released_mlp_out_bias)
            new_banks[fc_out] = descend(banks[fc_out], tokens, 3, 0, train, eta, update_bias=steps_out_bias)
            if self.glu:  # slot 2: d up, slot 3: d gate (first order), slot 4: the MLP input
                gate, up = f"{i}.gate.{ch}", f"{i}.up.{ch}"
                tokens = self.gate_backward(tokens, 2, s["pre"][ch], s["up"][ch], up_dst=2, gate_dst=3)
                tokens = L.write(tokens, 4, s["z2"])
                new_banks[up] = descend(banks[up], tokens, 4, 2, train, eta, update_bias=self.has_bias)
                new_banks[gate] = descend(banks[gate], tokens, 4, 3, train, eta, update_bias=self.has_bias)
                tokens = self.linear_backward(banks[up], tokens, 2, 1, accumulate=True)
                tokens = self.linear_backward(banks[gate], tokens, 3, 1, accumulate=True)
                continue
            tokens = self.act_backward(tokens, 2, s["pre"][ch], 2)  # d pre-activation
            tokens = L.write(tokens, 3, s["z2"])
            new_banks[fc_in] = descend(banks[fc_in], tokens, 3, 2, train, eta, update_bias=self.has_bias)
            tokens = self.linear_backward(banks[fc_in], tokens, 2, 1, accumulate=True)
        if self.norm_has_bias:  # bias-only LayerNorm descent (gamma frozen)
            new_banks[f"{i}.norm2"] = descend(banks[f"{i}.norm2"], tokens, 3, 1, train, eta, update_weight=False)
        tokens = self.norm_backward(banks[f"{i}.norm2"], tokens, 1, s["h"], 2, scratch=(2, 3))
        tokens = L.write(tokens, 0, L.slot(tokens, 2), accumulate=True)  # dh = dy + d(MLP branch)
        # attention: output projection, value path, W_V
        tokens = self.linear_backward(banks[f"{i}.out"], tokens, 0, 1)
        tokens = L.write(tokens, 3, s["o"])
        new_banks[f"{i}.out"] = descend(banks[f"{i}.out"], tokens, 3, 0, train, eta, update_bias=self.has_bias)
        tokens = self.attn_backward(tokens, 1, s["q"], s["k"], 1)  # dv per query head
        tokens = L.write(tokens, 1, self.kv.reduce(L.slot(tokens, 1)))  # summed over each K/V group
        tokens = L.write(tokens, 3, s["z1"])
        new_banks[f"{i}.v"] = descend(banks[f"{i}.v"], tokens, 3, 1, train, eta, update_bias=self.has_bias)
        tokens = self.linear_backward(banks[f"{i}.v"], tokens, 1, 2)  # dz1
        if self.norm_has_bias:
            new_banks[f"{i}.norm1"] = descend(banks[f"{i}.norm1"], tokens, 3, 2, train, eta, update_weight=False)
        tokens = self.norm_backward(banks[f"{i}.norm1"], tokens, 2, s["x"], 2, scratch=(1, 3))
        return L.write(tokens, 0, L.slot(tokens, 2), accumulate=True)  # dx = dh + d(attention branch)

    def _top(self, banks, tokens, start_layer, saved=None):
        for i in range(start_layer, self.aux_config.n_layer):
            tokens = self._block_forward(i, banks, tokens, saved)
        return tokens

    def simulate(self, ids: torch.Tensor, n_train: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[torch.Tensor]]:
        """Run the whole simulator; returns (logits (T, vocab), updated prefixes, training loss per step)."""
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError("TinT simulates one sequence at a time; got a batch of shape " + str(tuple(ids.shape)))
            ids = ids[0]
        T = ids.shape[0]
        if not 2 <= n_train <= T:
            raise ValueError(f"n_train={n_train} must lie in 2..{T} (the number of tokens)")
        L = self.layout
        banks = self.initial_prefixes()
        train = torch.zeros(T, dtype=torch.bool, device=ids.device)
        train[:n_train] = True
        tokens = self._embed(ids)
        for i in range(self.first_updated):  # layers below the updated ones: forward once
            tokens = self._block_forward(i, banks, tokens, None)
        cached = tokens  # hidden state at the input of the first updated layer
        losses = []
        for _ in range(self.config.n_steps):
            saved: dict = {}
            tokens = self._top(banks, cached, self.first_updated, saved)
            x_final = L.slot(tokens, 0).clone()
            tokens = self.norm_forward(banks["norm_f"], tokens, 0, 0)
            losses.append(self._loss(L.slot(tokens, 0), ids, n_train))
            tokens = L.write(tokens, 3, self.embedding[ids])  # x^un from the input layer
            tokens = self.lm_gradient(tokens, 0, 3, 0, n_train)
            new_banks = dict(banks)
            if self.norm_has_bias and self.config.update_final_norm:  # bias-only descent, as every LayerNorm
                new_banks["norm_f"] = self.linear_descent(banks["norm_f"], tokens, 3, 0, train, self.config.learning_rate,
                                                          update_weight=False)
            tokens = self.norm_backward(banks["norm_f"], tokens, 0, x_final, 0, scratch=(1, 2))
            for i in reversed(range(self.first_updated, self.aux_config.n_layer)):
                tokens = self._block_backward(i, banks, new_banks, tokens, saved[i], train)
            banks = new_banks
        tokens = self._top(banks, cached, self.first_updated)
        tokens = self.norm_forward(banks["norm_f"], tokens, 0, 0)
        logits = L.slot(tokens, 0) @ self.embedding.T
        return logits, banks, losses

    def _loss(self, z: torch.Tensor, ids: torch.Tensor, n_train: int) -> torch.Tensor:
        logits = z[: n_train - 1] @ self.embedding.T
        return torch.nn.functional.cross_entropy(logits, ids[1:n_train], reduction="sum").detach()

    def forward(self, ids: torch.Tensor, n_train: int) -> torch.Tensor:
        return self.simulate(ids, n_train)[0]

    # ------------------------------------------------------------------ reading the auxiliary model back
    def read_weights(self, banks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """State-dict entries of the auxiliary model read back from (updated) prefix embeddings."""
        L, c = self.layout, self.aux_config
        read = {name: L.read(prefix) for name, prefix in banks.items()}
        kv_rows = c.kv_heads * c.dim_head
        state: dict[str, torch.Tensor] = {}

        def norm(prefix_name, ours):
            weight, bias = read[prefix_name]
            state[ours + ".weight"] = torch.diagonal(weight).clone()
            if bias is not None and c.bias and c.norm == "layernorm":
                state[ours + ".bias"] = bias

        for i in range(c.n_layer):
            b = f"blocks.{i}."
            norm(f"{i}.norm1", b + "norm1")
            norm(f"{i}.norm2", b + "norm2")
            for j, part in enumerate(("weight", "bias") if c.bias else ("weight",)):
                q, k, v = (read[f"{i}.{p}"][j] for p in "qkv")
                state[b + f"attn.qkv.{part}"] = torch.cat([q, k[:kv_rows], v[:kv_rows]])
                fc_in = [torch.cat([read[f"{i}.{name}.{ch}"][j] for ch in range(self.n_chunks)])[: c.mlp_width]
                         for name in (("gate", "up") if self.glu else ("fc_in",))]
                state[b + f"mlp.fc_in.{part}"] = torch.cat(fc_in)
            state[b + "attn.out.weight"] = read[f"{i}.out"][0]
            fc_out = torch.cat([read[f"{i}.fc_out.{ch}"][0] for ch in range(self.n_chunks)], 1)
            state[b + "mlp.fc_out.weight"] = fc_out[:, : c.mlp_width]
            if c.bias:
                state[b + "attn.out.bias"] = read[f"{i}.out"][1]
                state[b + "mlp.fc_out.bias"] = sum(read[f"{i}.fc_out.{ch}"][1] for ch in range(self.n_chunks))
        norm("norm_f", "norm_f")
        return state

    def updated_model(self, model: Transformer, banks: dict[str, torch.Tensor]) -> Transformer:
        """A copy of the auxiliary model with the weights read back from the prefixes."""
        updated = copy.deepcopy(model)
        _missing, unexpected = updated.load_state_dict(self.read_weights(banks), strict=False)
        if unexpected:
            raise RuntimeError(f"reader produced unknown keys {unexpected}")
        return updated

    # ------------------------------------------------------------------ parameter counts (Table 3 rows)
    def parameter_counts(self, t_aux: int | None = None) -> dict[str, dict[str, int]]:
        """Parameters of the simulator's layers per auxiliary module kind and operation (biases ignored;
        the fixed layers are shared by every layer, so a layer-unrolled TinT multiplies by n_layer)."""
        t_sim = self.layout.K + (t_aux or self.aux_config.max_seq_len)
        lin = self.linear_forward.num_parameters(t_sim)
        counts = {
            "linear": {"forward": lin, "backward": self.linear_backward.num_parameters(t_sim),
                       "descent": self.linear_descent.num_parameters(t_sim)},
            "layernorm": {"forward": self.norm_forward.num_parameters(t_sim),
                          "backward": self.norm_backward.num_parameters(t_sim), "descent": lin},
            "self_attention": {"forward": lin + self.attn_forward.num_parameters(t_sim),
                               "backward": self.attn_backward.num_parameters(t_sim) + lin, "descent": lin},
            "activation": {"forward": self.act_forward.num_parameters(), "backward": self.act_backward.num_parameters(),
                           "descent": 0},
        }
        for row in counts.values():
            row["total"] = row["forward"] + row["backward"] + row["descent"]
        return counts
