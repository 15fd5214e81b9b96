"""Contextually Guided Transformer (CGT): a context vector y generates low-rank weight updates.

Paper: "Contextually guided transformers via low-rank adaptation" (sec. 3, App. B.1); implementation notes
with the settled choices: shared/specs/cgt.md. The model has two stages.

Stage 1, blocks 1..l, two streams (GPT-2 pre-LN blocks split in two):

    x-heads:  q, k, v from x only          -> output added to x        MLP_x(x)      -> x
    y-heads:  q, k, v from [x, y]          -> output added to y        MLP_y([x, y]) -> y

  so x never depends on y, while y reads everything. Each stream has its own LayerNorms (one norm over
  [x, y] would leak y into x). y starts from its own token and position embeddings of width d_y. The
  context y^l is the y stream after block l, LayerNorm'd (our choice: it gives the mixing weights S an
  input of unit scale, like GPT-2's final norm does for the head).

Stage 2, blocks l+1..L, x only. Before every attention and every MLP, the normalised input h is replaced by

    T(h; y) = h + L(y) R(y)^T [h; 1],    L(y) = sum_m sigma_m(y) L^m   (d_x x r)
                                         R(y) = sum_m sigma_m(y) R^m   ((d_x + 1) x r, last row: bias)
    sigma(y) = tanh(S [y; 1]) or softmax(S [y; 1])   (M mixing weights)

  with separate S, L^m, R^m per operator. The residual stream carries the plain x, so with y frozen each
  T is a fixed affine map that folds exactly into the linear layer after it (absorb/methods/cgt_fold/method.py). The
  d_x x d_x matrix of T is never formed: applying T costs two matmuls with the (d_x, M r) template stacks.

y is either computed per position by stage 1 ("dynamic") or given (a frozen context, constant over the
positions, or one vector per position as in the auxiliary loss). With a given y the y stream is skipped.
The VAE variant (App. A.1) reads a mean and a log-variance off y^l and samples y^l in training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..config import check_choices
from .cgt_losses import CGTLossConfig, cgt_loss
from .transformer import Transformer, TransformerConfig


@dataclass
class CGTConfig:
    n_layer: int = 6  # L: all blocks
    split_layer: int = 4  # l: blocks 1..l carry x and y; y^l is read after block l
    d_x: int = 112
    n_head_x: int = 7
    d_y: int = 64
    n_head_y: int = 4
    rank: int = 4  # r: rank of each generated update
    n_templates: int = 16  # M: template pairs (L^m, R^m) per operator
    mixing: Literal["tanh", "softmax"] = "tanh"  # h in sigma = h(S [y; 1])
    vae: bool = False  # y^l ~ N(mu, sigma^2) with mu, log sigma^2 read off the y stream (App. A.1)
    # inputs / outputs: tokens (vocab_size) or vectors (d_input -> d_output), as in TransformerConfig
    vocab_size: int | None = None
    d_input: int | None = None
    d_output: int | None = None
    max_seq_len: int = 1024
    mlp: Literal["gelu", "gelu_tanh"] = "gelu"
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self):
        check_choices(self)
        for key in ("n_layer", "split_layer", "d_x", "n_head_x", "d_y", "n_head_y", "rank", "n_templates", "max_seq_len"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CGTConfig.{key} must be a positive integer, got {value!r}")
        if not self.split_layer < self.n_layer:
            raise ValueError(
                f"CGTConfig.split_layer={self.split_layer} must be < n_layer={self.n_layer}: "
                "at least one block above layer l must be guided by y"
            )
        for width, heads in (("d_x", "n_head_x"), ("d_y", "n_head_y")):
            if getattr(self, width) % getattr(self, heads):
                raise ValueError(f"CGTConfig.{width}={getattr(self, width)} is not divisible by {heads}={getattr(self, heads)}")
        if (self.vocab_size is None) == (self.d_input is None):
            raise ValueError("give exactly one of vocab_size (token inputs) or d_input (vector inputs)")
        if self.d_input is not None and self.d_output is None:
            raise ValueError("vector inputs (d_input) need d_output for the read-out")

    @property
    def tokens(self) -> bool:
        return self.vocab_size is not None

    def transformer_config(self) -> TransformerConfig:
        """The ordinary x-only Transformer a folded CGT becomes (width d_x, GPT-2 options)."""
        return TransformerConfig(
            n_layer=self.n_layer, n_head=self.n_head_x, d_model=self.d_x, vocab_size=self.vocab_size,
            d_input=self.d_input, d_output=self.d_output, max_seq_len=self.max_seq_len, positions="learned",
            norm="layernorm", norm_eps=self.norm_eps, mlp=self.mlp, bias=True, tie_embeddings=self.tie_embeddings,
            init_std=self.init_std,
        )


@dataclass
class CGTOutput:
    logits: torch.Tensor  # (B, T, vocab) or (B, T, d_output)
    y: torch.Tensor  # (B, T, d_y): the context y^l each position used (a sample in VAE training)
    mu: torch.Tensor | None = None  # VAE: mean and log-variance of y^l (B, T, d_y)
    logvar: torch.Tensor | None = None


# ----------------------------------------------------------------------------- building blocks


class SelfAttention(nn.Module):
    """Causal multi-head attention reading d_in features and writing d_out (fused qkv, like Transformer)."""

    def __init__(self, d_in: int, d_out: int, n_head: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, d_out // n_head
        self.qkv = nn.Linear(d_in, 3 * d_out)
        self.out = nn.Linear(d_out, d_out)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """mask: None (plain causal) or a bool (B, 1, T, T) mask of allowed (query, key) pairs."""
        b, t, _ = h.shape
        q, k, v = (z.view(b, t, self.n_head, self.head_dim).transpose(1, 2) for z in self.qkv(h).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.out(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_in: int, width: int, d_out: int, activation: str):
        super().__init__()
        self.fc_in = nn.Linear(d_in, width)
        self.fc_out = nn.Linear(width, d_out)
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(h), approximate=self.approximate))


class LowRankGenerator(nn.Module):
    """The operator T(h; y) = h + L(y) R(y)^T [h; 1] of one stage-2 layer input.

    Templates are stored stacked: left (M, d_x, r), right (M, d_x + 1, r) whose last row is the bias row.
    left starts at zero so that T = I at initialisation.
    """

    def __init__(self, d_x: int, d_y: int, rank: int, n_templates: int, mixing: str):
        super().__init__()
        self.d_x, self.rank, self.n_templates, self.mixing = d_x, rank, n_templates, mixing
        self.mix = nn.Linear(d_y, n_templates)  # S with its bias column: S [y; 1]
        self.left = nn.Parameter(torch.zeros(n_templates, d_x, rank))
        self.right = nn.Parameter(torch.zeros(n_templates, d_x + 1, rank))

    def weights(self, y: torch.Tensor) -> torch.Tensor:
        """sigma(y) = h(S [y; 1]): (..., d_y) -> (..., M)."""
        scores = self.mix(y)
        return torch.tanh(scores) if self.mixing == "tanh" else torch.softmax(scores, dim=-1)

    def forward(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """h (B, T, d_x); y (B, T, d_y) or (B, 1, d_y) (one context for all positions)."""
        sigma = self.weights(y)[..., None]  # (B, T or 1, M, 1)
        m, r = self.n_templates, self.rank
        # u = R(y)^T [h; 1] = sum_m sigma_m (R^m)^T [h; 1]: one matmul against the stacked R^m
        right = self.right.permute(1, 0, 2).reshape(self.d_x + 1, m * r)
        projected = (h @ right[:-1] + right[-1]).view(*h.shape[:-1], m, r)
        u = (sigma * projected).sum(dim=-2)  # (B, T, r)
        # L(y) u = sum_m sigma_m L^m u: one matmul against the stacked L^m
        left = self.left.permute(1, 0, 2).reshape(self.d_x, m * r)
        return h + (sigma * u[..., None, :]).flatten(-2) @ left.T

    def factors(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For one context y (d_y,): L(y) (d_x, r) and R(y) (d_x + 1, r)."""
        sigma = self.weights(y)
        return torch.einsum("m,mdr->dr", sigma, self.left), torch.einsum("m,mdr->dr", sigma, self.right)


def init_cgt_parameters(module: nn.Module, std: float, n_layer: int, generator: torch.Generator | None = None) -> None:
    """GPT-2 initialisation (norm gains one, biases zero, weights N(0, std) with residual output projections scaled
    by 1/sqrt(2 n_layer)); the L templates zero, so that every T = I at the start."""
    for name, p in module.named_parameters():
        if "norm" in name:
            nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
        elif name.endswith(".left") or p.dim() == 1:
            nn.init.zeros_(p)
        else:
            residual = name.endswith(("attn.out.weight", "attn_x.out.weight", "attn_y.out.weight", "fc_out.weight"))
            scale = 1.0 / math.sqrt(2 * n_layer) if residual else 1.0
            nn.init.normal_(p, 0.0, std * scale, generator=generator)


class TwoStreamBlock(nn.Module):
    """Stage-1 block: x-heads and MLP_x see x only; y-heads and MLP_y see [x, y] and write y only."""

    def __init__(self, c: CGTConfig):
        super().__init__()
        self.norm1_x, self.norm2_x = nn.LayerNorm(c.d_x, eps=c.norm_eps), nn.LayerNorm(c.d_x, eps=c.norm_eps)
        self.attn_x = SelfAttention(c.d_x, c.d_x, c.n_head_x)
        self.mlp_x = MLP(c.d_x, 4 * c.d_x, c.d_x, c.mlp)
        self.norm1_y, self.norm2_y = nn.LayerNorm(c.d_y, eps=c.norm_eps), nn.LayerNorm(c.d_y, eps=c.norm_eps)
        self.attn_y = SelfAttention(c.d_x + c.d_y, c.d_y, c.n_head_y)
        self.mlp_y = MLP(c.d_x + c.d_y, 4 * c.d_y, c.d_y, c.mlp)

    def forward(self, x, y, mask):
        """y is None when the y stream is not needed (a given context, or the x-only auxiliary pass)."""
        h = self.norm1_x(x)
        if y is not None:  # both streams read the same layer input x
            y = y + self.attn_y(torch.cat([h, self.norm1_y(y)], dim=-1), mask)
        x = x + self.attn_x(h, mask)
        h = self.norm2_x(x)
        if y is not None:
            y = y + self.mlp_y(torch.cat([h, self.norm2_y(y)], dim=-1))
        return x + self.mlp_x(h), y


class GuidedBlock(nn.Module):
    """Stage-2 block: a GPT-2 block on x whose attention and MLP inputs pass through T(.; y^l)."""

    def __init__(self, c: CGTConfig):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.d_x, eps=c.norm_eps), nn.LayerNorm(c.d_x, eps=c.norm_eps)
        self.attn = SelfAttention(c.d_x, c.d_x, c.n_head_x)
        self.mlp = MLP(c.d_x, 4 * c.d_x, c.d_x, c.mlp)
        self.t_attn = LowRankGenerator(c.d_x, c.d_y, c.rank, c.n_templates, c.mixing)
        self.t_mlp = LowRankGenerator(c.d_x, c.d_y, c.rank, c.n_templates, c.mixing)

    def forward(self, x, y, mask):
        x = x + self.attn(self.t_attn(self.norm1(x), y), mask)
        return x + self.mlp(self.t_mlp(self.norm2(x), y))


# ----------------------------------------------------------------------------- model


class CGT(nn.Module):
    def __init__(self, config: CGTConfig, objective: CGTLossConfig | None = None):
        super().__init__()
        self.config = c = config
        self.objective = objective or CGTLossConfig()  # what training_loss optimises (eq. 3)
        if c.tokens:
            self.tok_emb = nn.Embedding(c.vocab_size, c.d_x)
            self.tok_emb_y = nn.Embedding(c.vocab_size, c.d_y)
        else:
            self.read_in = nn.Linear(c.d_input, c.d_x)
            self.read_in_y = nn.Linear(c.d_input, c.d_y)
        self.pos_emb = nn.Embedding(c.max_seq_len, c.d_x)
        self.pos_emb_y = nn.Embedding(c.max_seq_len, c.d_y)
        blocks = [TwoStreamBlock(c) for _ in range(c.split_layer)] + [GuidedBlock(c) for _ in range(c.n_layer - c.split_layer)]
        self.blocks = nn.ModuleList(blocks)
        self.norm_y = nn.LayerNorm(c.d_y, eps=c.norm_eps)
        if c.vae:
            self.y_mu, self.y_logvar = nn.Linear(c.d_y, c.d_y), nn.Linear(c.d_y, c.d_y)
        self.norm_f = nn.LayerNorm(c.d_x, eps=c.norm_eps)
        if c.tokens:
            self.lm_head = nn.Linear(c.d_x, c.vocab_size, bias=False)
            if c.tie_embeddings:
                self.lm_head.weight = self.tok_emb.weight
        else:
            self.read_out = nn.Linear(c.d_x, c.d_output)
        self.reset_parameters()

    @property
    def stage1(self) -> list[TwoStreamBlock]:
        return list(self.blocks[: self.config.split_layer])

    @property
    def stage2(self) -> list[GuidedBlock]:
        return list(self.blocks[self.config.split_layer :])

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation (residual output projections scaled by 1/sqrt(2 L)); L templates zero (T = I)."""
        init_cgt_parameters(self, self.config.init_std, self.config.n_layer, generator)
        if self.config.vae:  # start with a small posterior variance
            nn.init.constant_(self.y_logvar.bias, -4.0)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ forward

    def forward(self, inputs: torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits (or predictions) only; see `run` for the options and the context it used."""
        return self.run(inputs, **kwargs).logits

    def training_loss(self, inputs: torch.Tensor, task_loss, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The trainer's protocol for a model with its own objective: eq. 3 (self.objective) and its parts.
        `task_loss(outputs, scored)` is the task's loss, over the positions `scored` (B, T) when given."""
        return cgt_loss(self, inputs, task_loss, self.objective, generator)

    def run(
        self,
        inputs: torch.Tensor,
        *,
        y: torch.Tensor | None = None,
        position_offset: int = 0,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> CGTOutput:
        """One pass over token ids (B, T) or vectors (B, T, d_input).

        y: None computes the context per position (dynamic); a given context (B, d_y) is frozen for every
          position; (B, T, d_y) gives one per position. A given y skips the y stream.
        positions: (T,) or (B, T) position ids; default position_offset + 0..T-1.
        segments: (B, T) integer ids; attention is then causal within each segment only (block-diagonal),
          as in the auxiliary loss's many truncated passes in one.
        generator: VAE noise in training.
        """
        self._check_inputs(inputs)
        c, t = self.config, inputs.shape[1]
        if positions is None:
            positions = torch.arange(position_offset, position_offset + t, device=inputs.device)
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= c.max_seq_len):
            raise ValueError(f"positions {int(positions.min())}..{int(positions.max())} exceed max_seq_len={c.max_seq_len}")
        mask = None
        if segments is not None:
            causal = torch.ones(t, t, dtype=torch.bool, device=inputs.device).tril()
            mask = (causal & (segments[:, :, None] == segments[:, None, :]))[:, None]

        x = (self.tok_emb(inputs) if c.tokens else self.read_in(inputs)) + self.pos_emb(positions)
        y_stream = None
        if y is None:
            y_stream = (self.tok_emb_y(inputs) if c.tokens else self.read_in_y(inputs)) + self.pos_emb_y(positions)
        for block in self.stage1:
            x, y_stream = block(x, y_stream, mask)

        mu = logvar = None
        if y is None:
            y = self.norm_y(y_stream)
            if c.vae:
                mu, logvar = self.y_mu(y), self.y_logvar(y)
                y = mu
                if self.training:
                    device = generator.device if generator is not None else mu.device
                    noise = torch.randn(mu.shape, generator=generator, device=device, dtype=mu.dtype).to(mu.device)
                    y = mu + torch.exp(0.5 * logvar) * noise
        else:
            y = self._check_context(y, inputs.shape[0], t)

        for block in self.stage2:
            x = block(x, y, mask)
        hidden = self.norm_f(x)
        logits = self.lm_head(hidden) if c.tokens else self.read_out(hidden)
        return CGTOutput(logits=logits, y=y.expand(-1, t, -1), mu=mu, logvar=logvar)

    @torch.no_grad()
    def context(self, inputs: torch.Tensor, position_offset: int = 0) -> torch.Tensor:
        """The context y^l (B, T, d_y) at every position (the mean for the VAE), from stage 1 alone."""
        was_training = self.training
        self.eval()
        try:
            c, t = self.config, inputs.shape[1]
            self._check_inputs(inputs)
            positions = torch.arange(position_offset, position_offset + t, device=inputs.device)
            x = (self.tok_emb(inputs) if c.tokens else self.read_in(inputs)) + self.pos_emb(positions)
            y = (self.tok_emb_y(inputs) if c.tokens else self.read_in_y(inputs)) + self.pos_emb_y(positions)
            for block in self.stage1:
                x, y = block(x, y, None)
            y = self.norm_y(y)
            return self.y_mu(y) if c.vae else y
        finally:
            self.train(was_training)

    def _check_inputs(self, inputs: torch.Tensor) -> None:
        c = self.config
        if c.tokens:
            if inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"token inputs must be integer ids of shape (B, T); got {tuple(inputs.shape)} {inputs.dtype}")
        elif inputs.dim() != 3 or inputs.shape[-1] != c.d_input or not inputs.is_floating_point():
            raise ValueError(f"vector inputs must be float (B, T, {c.d_input}); got {tuple(inputs.shape)} {inputs.dtype}")

    def _check_context(self, y: torch.Tensor, batch: int, t: int) -> torch.Tensor:
        d_y = self.config.d_y
        if y.dim() == 2:
            y = y[:, None]  # one frozen context for every position
        if y.dim() != 3 or y.shape[-1] != d_y or y.shape[0] not in (1, batch) or y.shape[1] not in (1, t):
            raise ValueError(f"a given context y must be (B, {d_y}), (B, 1, {d_y}) or (B, T={t}, {d_y}); got {tuple(y.shape)}")
        return y.expand(batch, -1, -1)

    # ------------------------------------------------------------------ the x-only model

    def x_only_transformer(self) -> Transformer:
        """The ordinary Transformer of width d_x with this model's x weights and every T = I (no context):
        the base model that a folded context (absorb/methods/cgt_fold/method.py) or a LoRA adapter modifies."""
        model = Transformer(self.config.transformer_config()).to(device=self.pos_emb.weight.device,
                                                                   dtype=self.pos_emb.weight.dtype)
        model.load_state_dict(x_only_state_dict(self), strict=True)
        return model.eval()


def x_only_state_dict(model: CGT) -> dict[str, torch.Tensor]:
    """This CGT's x-stream weights under the Transformer's parameter names (stage-1 x-heads, norms and MLPs
    become ordinary blocks; stage-2 blocks keep their weights, without T)."""
    c, sd = model.config, model.state_dict()
    ours = {"pos_emb.weight": sd["pos_emb.weight"], "norm_f.weight": sd["norm_f.weight"], "norm_f.bias": sd["norm_f.bias"]}
    if c.tokens:
        ours["tok_emb.weight"] = sd["tok_emb.weight"]
        ours["lm_head.weight"] = sd["lm_head.weight"]
    else:
        for name in ("read_in.weight", "read_in.bias", "read_out.weight", "read_out.bias"):
            ours[name] = sd[name]
    rename = {"norm1_x": "norm1", "norm2_x": "norm2", "attn_x": "attn", "mlp_x": "mlp"}
    for i in range(c.n_layer):
        prefix = f"blocks.{i}."
        for name, value in sd.items():
            if not name.startswith(prefix):
                continue
            module, rest = name[len(prefix):].split(".", 1)
            if i < c.split_layer and module in rename:
                ours[prefix + rename[module] + "." + rest] = value
            elif i >= c.split_layer and module in ("norm1", "norm2", "attn", "mlp"):
                ours[name] = value
    return {k: v.detach().clone() for k, v in ours.items()}
