"""A CGT adapter over a frozen pretrained causal LM: a context stream y and low-rank generators T(y) trained on
top of an ordinary `Transformer` (e.g. SmolLM2 converted by interop/hf.py), whose own weights never change.

The frozen model is the x stream. With L blocks and split layer l (0-based blocks 0..L-1):

    blocks 0..l-1     run frozen. The last `n_y_blocks` of them get a trainable y block beside them, as in the
                      paper's two-stream stage: y-heads read [norm(x_i), norm(y)] (x_i: that block's input,
                      normalised by the block's own frozen input norm) and write y only; x never reads y.
                      y starts as a linear read of the first such x; y^l = LayerNorm(y) after the last.
    blocks l..L-1     frozen weights, guided: before each attention and each MLP the normalised input h is
                      replaced by T(h; y^l) = h + L(y) R(y)^T [h; 1] (models/cgt.py's LowRankGenerator: M
                      templates mixed by tanh or softmax of S [y; 1]); the residual carries plain x.

Only the y blocks and the generators (the `guide` submodule) train. The left templates start at zero, so the
untrained adapter is exactly the frozen model. With y frozen, each T is affine and folds into the projections
that read it (absorb/methods/cgt_fold/method.py): a rank-r LoRA on q/k/v and gate/up of every guided block, plus a bias shift.

The adapter speaks the CGT interface (`run`, `forward(inputs, y=, positions=, segments=)`, `context`), so
models/cgt_losses.py's objective (CE + auxiliary truncation loss + R_C/R_D) applies unchanged; the trainer
calls `training_loss(inputs, task_loss, generator)`.

    adapter = CGTAdapter(load_model("smollm2").model, CGTAdapterConfig(split_layer=24))
    y = adapter.context(prompt)[:, -1]          # the context at the end of the prompt
    logits = adapter(query, y=y)                # the specialised model, prompt dropped
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..config import check_choices, from_dict, to_dict
from ..fileio import sha256_file
from ..ops import apply_rope, rope_cos_sin
from .cgt import MLP, CGTOutput, LowRankGenerator, SelfAttention, init_cgt_parameters
from .cgt_losses import CGTLossConfig, cgt_loss
from .transformer import Transformer

GUIDE_WEIGHTS, GUIDE_RECORD = "guide.safetensors", "guide.json"


@dataclass
class CGTAdapterConfig:
    split_layer: int = 24  # l: blocks l.. are guided by y^l; y reads the inputs of the blocks before l
    n_y_blocks: int = 2  # trainable y blocks, beside frozen blocks l - n_y_blocks .. l - 1
    d_y: int = 64
    n_head_y: int = 4
    rank: int = 4  # r: rank of each generated update
    n_templates: int = 8  # M: template pairs per operator
    mixing: Literal["tanh", "softmax"] = "tanh"
    init_std: float = 0.02
    loss: dict = field(default_factory=dict)  # CGTLossConfig fields of the training objective

    def __post_init__(self):
        for key in ("split_layer", "n_y_blocks", "d_y", "n_head_y", "rank", "n_templates"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CGTAdapterConfig.{key} must be a positive integer, got {value!r}")
        check_choices(self)
        if self.d_y % self.n_head_y:
            raise ValueError(f"CGTAdapterConfig.d_y={self.d_y} is not divisible by n_head_y={self.n_head_y}")
        if self.n_y_blocks > self.split_layer:
            raise ValueError(f"CGTAdapterConfig.n_y_blocks={self.n_y_blocks} exceeds split_layer={self.split_layer}: "
                             "y blocks sit beside the frozen blocks below l")
        self.loss_config()  # validates the loss section

    @property
    def vae(self) -> bool:  # cgt_loss asks; the adapter has no VAE variant
        return False

    def loss_config(self) -> CGTLossConfig:
        return from_dict(CGTLossConfig, dict(self.loss), where="CGTAdapterConfig.loss")


class YBlock(nn.Module):
    """A y block beside a frozen block: attention and MLP read [x, y] (x already normalised), write y only."""

    def __init__(self, d_x: int, d_y: int, n_head: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_y), nn.LayerNorm(d_y)
        self.attn = SelfAttention(d_x + d_y, d_y, n_head)
        self.mlp = MLP(d_x + d_y, 4 * d_y, d_y, "gelu")

    def forward(self, h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        y = y + self.attn(torch.cat([h, self.norm1(y)], dim=-1), mask)
        return y + self.mlp(torch.cat([h, self.norm2(y)], dim=-1))


class CGTGuide(nn.Module):
    """Everything an adapter trains: the y stream and one generator per guided attention and MLP input."""

    def __init__(self, d_x: int, n_guided: int, c: CGTAdapterConfig):
        super().__init__()
        self.y_in = nn.Linear(d_x, c.d_y)
        self.y_blocks = nn.ModuleList(YBlock(d_x, c.d_y, c.n_head_y) for _ in range(c.n_y_blocks))
        self.norm_y = nn.LayerNorm(c.d_y)
        self.t_attn = nn.ModuleList(LowRankGenerator(d_x, c.d_y, c.rank, c.n_templates, c.mixing) for _ in range(n_guided))
        self.t_mlp = nn.ModuleList(LowRankGenerator(d_x, c.d_y, c.rank, c.n_templates, c.mixing) for _ in range(n_guided))

def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: query s may attend to key t when t <= s and both lie in the same segment."""
    t = segments.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    return (causal & (segments[:, :, None] == segments[:, None, :]))[:, None]


class CGTAdapter(nn.Module):
    """A frozen `Transformer` (softmax attention, no residual streams) guided by a trainable context stream.
    The base's dropout never applies: the adapter runs the base's pieces itself, without dropout."""

    def __init__(self, base: Transformer, config: CGTAdapterConfig, generator: torch.Generator | None = None,
                 freeze_base: bool = True):
        """freeze_base: turn off the base's gradients (for training); False leaves `base` as it is (an adapter
        over a model that other code also uses, run without gradients)."""
        super().__init__()
        bc = base.config
        problems = [text for bad, text in ((not bc.tokens, "token inputs"), (bc.attention != "softmax", "softmax attention"),
                                           (bc.residual_stream != "none", "no residual attention streams"))
                    if bad]
        if problems:
            raise ValueError(f"a CGT adapter needs a base Transformer with {', '.join(problems)}")
        if not config.split_layer < bc.n_layer:
            raise ValueError(f"CGTAdapterConfig.split_layer={config.split_layer} must be < the base's n_layer={bc.n_layer}: "
                             "at least one block must be guided by y")
        self.config, self.base = config, base
        self.loss_config = config.loss_config()
        if freeze_base:
            for p in base.parameters():
                p.requires_grad_(False)
        self.guide = CGTGuide(bc.d_model, bc.n_layer - config.split_layer, config).to(next(base.parameters()).dtype)
        init_cgt_parameters(self.guide, config.init_std, config.n_y_blocks, generator)  # T = I: the frozen model

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.guide.parameters())

    def guided_layers(self) -> list[tuple[int, LowRankGenerator, LowRankGenerator]]:
        """(block index, generator of the attention input, generator of the MLP input) per guided block."""
        l = self.config.split_layer
        return [(l + j, self.guide.t_attn[j], self.guide.t_mlp[j]) for j in range(len(self.guide.t_attn))]

    # ------------------------------------------------------------------ forward

    def forward(self, inputs: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.run(inputs, **kwargs).logits

    def run(self, inputs: torch.Tensor, *, y: torch.Tensor | None = None, positions: torch.Tensor | None = None,
            segments: torch.Tensor | None = None, generator: torch.Generator | None = None) -> CGTOutput:
        """Token ids (B, T). y: None computes y^l per position (dynamic); (B, d_y) freezes one context for every
        position; (B, T, d_y) gives one per position (the y stream is then skipped). positions: (T,) or (B, T)
        ids (default 0..T-1); segments: (B, T) ids making attention causal within each segment only (the
        auxiliary loss's truncated passes). `generator` is unused (no VAE noise); cgt_loss passes it."""
        self.base._check_inputs(inputs)
        b, t = inputs.shape
        if positions is None:
            positions = torch.arange(t, device=inputs.device)
        mask = None if segments is None else block_causal_mask(segments)
        x, rope = self._embed(inputs, positions)
        l, first_y = self.config.split_layer, self.config.split_layer - self.config.n_y_blocks
        dynamic = y is None
        if not dynamic:
            y = self._check_context(y, b, t)
        for i, block in enumerate(self.base.blocks[:l]):
            h = block.norm1(x)
            if dynamic and i >= first_y:
                stream = self.guide.y_blocks[i - first_y]
                y = stream(h, self.guide.y_in(h) if i == first_y else y, mask)
            x = x + self._attention(block.attn, h, rope, mask)
            x = x + block.mlp(block.norm2(x))
        if dynamic:
            y = self.guide.norm_y(y)
        for i, t_attn, t_mlp in self.guided_layers():
            block = self.base.blocks[i]
            x = x + self._attention(block.attn, t_attn(block.norm1(x), y), rope, mask)
            x = x + block.mlp(t_mlp(block.norm2(x), y))
        logits = self.base.lm_head(self.base.norm_f(x))
        return CGTOutput(logits=logits, y=y.expand(-1, t, -1))

    def _embed(self, inputs: torch.Tensor, positions: torch.Tensor):
        base, c = self.base, self.base.config
        x = base.tok_emb(inputs)
        if c.positions == "learned":
            if int(positions.min()) < 0 or int(positions.max()) >= c.max_seq_len:
                raise ValueError(f"positions exceed the learned position table (max_seq_len={c.max_seq_len})")
            x = x + base.pos_emb(positions)
        rope = None
        if c.positions == "rope":
            cos, sin = rope_cos_sin(positions, base.rope_dim, c.rope_theta, x.dtype)
            rope = (cos, sin) if positions.dim() == 1 else (cos[:, None], sin[:, None])  # (B, 1, T, d) per row
        return x, rope

    def _attention(self, attn, h: torch.Tensor, rope, mask: torch.Tensor | None) -> torch.Tensor:
        """The frozen attention on h, with an optional block-diagonal mask (Attention.forward takes none)."""
        c = self.base.config
        b, t, _ = h.shape
        q, k, v = attn.qkv(h).split([c.n_head * c.dim_head, c.kv_heads * c.dim_head, c.kv_heads * c.dim_head], -1)
        q = q.view(b, t, c.n_head, c.dim_head).transpose(1, 2)
        k = k.view(b, t, c.kv_heads, c.dim_head).transpose(1, 2)
        v = v.view(b, t, c.kv_heads, c.dim_head).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        scale = 1.0 / math.sqrt(c.dim_head) if c.scale_attn else 1.0
        out = F.scaled_dot_product_attention(q, attn._expand_kv(k), attn._expand_kv(v), attn_mask=mask,
                                             is_causal=mask is None, scale=scale)
        return attn.out(out.transpose(1, 2).reshape(b, t, c.n_head * c.dim_head))

    def _check_context(self, y: torch.Tensor, batch: int, t: int) -> torch.Tensor:
        d_y = self.config.d_y
        if y.dim() == 2:
            y = y[:, None]
        if y.dim() != 3 or y.shape[-1] != d_y or y.shape[0] not in (1, batch) or y.shape[1] not in (1, t):
            raise ValueError(f"a given context y must be (B, {d_y}), (B, 1, {d_y}) or (B, T={t}, {d_y}); got {tuple(y.shape)}")
        return y.expand(batch, -1, -1)

    @torch.no_grad()
    def context(self, inputs: torch.Tensor) -> torch.Tensor:
        """y^l (B, T, d_y) at every position: the frozen blocks below l and the y stream only."""
        self.base._check_inputs(inputs)
        l, first_y = self.config.split_layer, self.config.split_layer - self.config.n_y_blocks
        x, rope = self._embed(inputs, torch.arange(inputs.shape[1], device=inputs.device))
        y = None
        for i, block in enumerate(self.base.blocks[:l]):
            h = block.norm1(x)
            if i >= first_y:
                y = self.guide.y_blocks[i - first_y](h, self.guide.y_in(h) if i == first_y else y, None)
            if i < l - 1:  # the last frozen block's output is not needed
                x = x + self._attention(block.attn, h, rope, None)
                x = x + block.mlp(block.norm2(x))
        return self.guide.norm_y(y)

    # ------------------------------------------------------------------ training

    def training_loss(self, inputs: torch.Tensor, task_loss: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
                      generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The paper's objective (eq. 3) with this adapter's loss config: see models/cgt_losses.py."""
        return cgt_loss(self, inputs, task_loss, self.loss_config, generator)

    # ------------------------------------------------------------------ saving the trained part

    def save_guide(self, folder: str | Path) -> Path:
        """The trained part alone (guide.safetensors + guide.json with the config and the base's config)."""
        from safetensors.torch import save_model

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_model(self.guide, str(folder / GUIDE_WEIGHTS))
        record = {"config": to_dict(self.config), "base_config": to_dict(self.base.config),
                  "dtype": str(next(self.guide.parameters()).dtype).removeprefix("torch."),
                  "sha256": sha256_file(folder / GUIDE_WEIGHTS)}
        (folder / GUIDE_RECORD).write_text(json.dumps(record, indent=2))
        return folder

    @classmethod
    def load_guide(cls, base: Transformer, folder: str | Path, freeze_base: bool = False) -> CGTAdapter:
        """An adapter over `base` with the guide saved in `folder`; refuses a base of another shape."""
        from safetensors.torch import load_model

        folder = Path(folder)
        if not (folder / GUIDE_RECORD).is_file():
            raise FileNotFoundError(f"{folder} holds no CGT adapter ({GUIDE_RECORD} is missing)")
        record = json.loads((folder / GUIDE_RECORD).read_text())
        shape = ("n_layer", "d_model", "n_head", "vocab_size", "d_mlp", "n_kv_head")
        differs = [k for k in shape if record["base_config"].get(k) != to_dict(base.config).get(k)]
        if differs:
            raise ValueError(f"the CGT adapter in {folder} was trained on another base model ({', '.join(differs)} differ)")
        if sha256_file(folder / GUIDE_WEIGHTS) != record["sha256"]:
            raise ValueError(f"{folder / GUIDE_WEIGHTS} is corrupt: its sha256 differs from the one in {GUIDE_RECORD}")
        adapter = cls(base, from_dict(CGTAdapterConfig, record["config"]), freeze_base=freeze_base)
        load_model(adapter.guide, str(folder / GUIDE_WEIGHTS))
        return adapter
