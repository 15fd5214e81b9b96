"""Dynamic evaluation (Krause et al.; the baseline of TinT's Table 2) and TinT's simulated step as absorb
methods: the prompt is absorbed by gradient steps on its LM loss (or on the tokens a loss mask selects, e.g.
the labels of few-shot demonstrations), and queries run on the updated weights with the prompt out of the
context (query positions continue after the prompt, as in dynamic evaluation).

    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3).absorb(model, prompt)
    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3).absorb(model, prompt, loss_mask=labels)
    adapted = get_absorb_method("tint", learning_rate=1e-3, n_simulation_layers=2).absorb(model, prompt)
    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3, params="tint").absorb(model, prompt)  # R-exact

Two options of both methods change what the update trains on and what the query sees:
- `keep_prompt=True`: the prompt stays in the context after the update (Krause et al.'s dynamic evaluation and
  TinT's Table 2: the model keeps reading the document it has just trained on);
- `separator=[ids]`: the prompt is several documents joined by this token sequence (e.g. few-shot
  demonstrations); each is trained on as its own sequence from position 0 (losses summed: one step of the
  summed loss, TinT's "single" mode), and the query, a document of its own, starts at position 0 too.

`prompt_sgd` is the project's one implementation of dynamic evaluation; the TinT experiments and the harness
both use it through `DynamicEval`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ...config import limit, option
from ...models.lm import CausalLM, is_causal_lm
from ..lora import LORA_TARGETS, inject_lora, lora_spec, merge_lora
from ..param_groups import select_groups, selected_parameters, untie
from ..prompt_update import (
    check_separator,
    full_mask,
    training_sequences,
    updated_adapted,
)
from ..protocol import AbsorbMethod, AdaptedModel


def masked_lm_loss(model: CausalLM, ids: torch.Tensor, targets: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Cross-entropy of the tokens `targets` marks ((T,) bool; position 0 cannot be one), predicted from
    their prefix; summed or averaged over those tokens."""
    logits = model(ids[None])[0]
    keep = targets[1:]
    return F.cross_entropy(logits[:-1][keep], ids[1:][keep], reduction=reduction)


def trainable_parameters(model: CausalLM, n_top_layers: int | None) -> list[torch.nn.Parameter]:
    """All parameters, or those of the top n blocks plus the final norm (the head stays: it is tied to the
    embeddings in most models here)."""
    if n_top_layers is None:
        return list(model.parameters())
    check_top_layers(model, n_top_layers)
    blocks = model.layer_modules()[model.config.n_layer - n_top_layers:]
    return [p for block in blocks for p in block.parameters()] + list(model.final_norm_module().parameters())


def check_top_layers(model: CausalLM, n_top_layers: int | None) -> None:
    if n_top_layers is not None and not (isinstance(n_top_layers, int) and 1 <= n_top_layers <= model.config.n_layer):
        raise ValueError(f"n_top_layers must lie in [1, {model.config.n_layer}], got {n_top_layers!r}")


def check_sgd_options(learning_rate, n_steps, reduction, optimizer) -> None:
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if optimizer not in ("sgd", "adamw"):
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be an integer >= 1, got {n_steps!r}")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")


@torch.enable_grad()  # descends even when the caller runs under torch.no_grad()
def prompt_sgd(model: CausalLM, sequences: list[torch.Tensor], targets: list[torch.Tensor] | None = None, *,
               learning_rate: float, n_steps: int = 1, reduction: str = "sum", optimizer: str = "sgd",
               n_top_layers: int | None = None, lora_rank: int | None = None, lora_alpha: float | None = None,
               lora_targets: tuple[str, ...] = ("attn.qkv", "attn.out"), seed: int = 0,
               params: str | list[str] | None = None) -> tuple[CausalLM, list[float]]:
    """Dynamic evaluation: `n_steps` optimizer steps on a copy of `model`, each on the loss of all `sequences`
    (summed over sequences; within one, summed or averaged over its target tokens), exact gradients.
    Plain SGD reproduces Krause et al. / TinT's R-dyn; AdamW is offered for pretrained LMs. With `lora_rank`,
    the steps train a LoRA (W + (alpha / r) B A on `lora_targets` of the trained blocks; A drawn from `seed`,
    B = 0, as peft does) instead of the weights, merged into the copy at the end. With `params` (a preset such as
    "tint", groups such as "attention,mlp": see `param_groups`) only those parameters descend (of the top
    n_top_layers blocks for the block groups), the rest keep their values bit for bit; a tied embedding with
    one of its uses selected is untied in the copy. Returns the updated copy (eval mode, no gradients) and the
    loss before each step."""
    check_sgd_options(learning_rate, n_steps, reduction, optimizer)
    groups = None if params is None else select_groups(params)
    if groups is not None and lora_rank is not None:
        raise ValueError("params= and lora_rank cannot be combined (the LoRA chooses its own targets)")
    targets = [full_mask(ids) for ids in sequences] if targets is None else targets
    if not any(bool(t[1:].any()) for t in targets):
        raise ValueError("no target token to learn from: the loss mask selects nothing after the first token")
    updated = copy.deepcopy(model)
    updated.train(False)
    updated.requires_grad_(False)
    check_top_layers(model, n_top_layers)
    masked = []  # (parameter, rows that descend)
    if groups is None:
        trainable = trainable_parameters(updated, n_top_layers)
    else:
        if len(groups & {"input_embedding", "head"}) == 1:
            untie(updated)
        chosen = selected_parameters(updated, groups, n_top_layers)
        trainable = [p for _, p, _ in chosen]
        masked = [(p, rows) for _, p, rows in chosen if rows is not None]
    spec = None
    if lora_rank is not None:
        check_lora_options(lora_rank, lora_alpha, lora_targets)
        first = 0 if n_top_layers is None else model.config.n_layer - n_top_layers
        spec = lora_spec(updated, lora_rank, 2.0 * lora_rank if lora_alpha is None else lora_alpha, tuple(lora_targets),
                         range(first, model.config.n_layer))
        trainable = inject_lora(updated, spec, torch.Generator().manual_seed(seed))
    for p in trainable:
        p.requires_grad_(True)
    opt = torch.optim.SGD(trainable, lr=learning_rate) if optimizer == "sgd" else torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=0.0)
    losses = []
    for _ in range(n_steps):
        opt.zero_grad(set_to_none=True)
        loss = sum(masked_lm_loss(updated, ids, keep, reduction) for ids, keep in zip(sequences, targets) if keep[1:].any())
        loss.backward()
        for p, rows in masked:
            p.grad[~rows] = 0.0  # rows outside the selection (e.g. W_Q, W_K of attn.qkv) do not move
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError("dynamic evaluation diverged (non-finite loss); lower the learning rate")
        opt.step()
    opt.zero_grad(set_to_none=True)
    updated.requires_grad_(False)
    if not all(bool(torch.isfinite(p).all()) for p in trainable):
        raise FloatingPointError("dynamic evaluation produced non-finite weights; lower the learning rate")
    if spec is not None:
        merge_lora(updated, spec)
    return updated, losses


def check_lora_options(rank, alpha, targets) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_rank must be an integer >= 1, got {rank!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0):
        raise ValueError(f"lora_alpha must be a number > 0, got {alpha!r}")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if not targets or set(targets) - set(LORA_TARGETS):
        raise ValueError(f"lora_targets must be a non-empty subset of {LORA_TARGETS}, got {targets}")


@dataclass
class DynamicEvalOptions:
    learning_rate: float = limit(3e-4, gt=0, help="the optimizer's rate")
    n_steps: int = limit(1, min=1, help="gradient steps on the prompt")
    reduction: Literal["sum", "mean"] = option("sum", "the loss over the prompt's tokens")
    optimizer: Literal["sgd", "adamw"] = option("sgd", "plain SGD (Krause et al., TinT's R-dyn) or AdamW")
    n_top_layers: int | None = limit(None, min=1, help="only the top n blocks descend (null: all)")
    keep_prompt: bool = option(False, "the prompt also stays in the context of the updated model")
    separator: list[int] | None = option(None, "token ids that split the prompt into training sequences")
    lora_rank: int | None = limit(None, min=1, help="the steps train a LoRA of this rank instead (merged)")
    lora_alpha: float | None = limit(None, gt=0, help="its alpha (null: twice the rank)")
    lora_targets: tuple[str, ...] | str = option(("attn.qkv", "attn.out"), "its linears")
    seed: int = limit(0, min=0, help="the LoRA's initial draw")
    params: str | list[str] | None = option(None,
        "parameter groups that descend (e.g. tint, attention,mlp; our Transformer)")


class DynamicEval(AbsorbMethod):
    """Gradient steps on the prompt's LM loss (or its masked tokens): plain SGD on all parameters by default,
    as Krause et al. and TinT's R-dyn; AdamW, the top-n layers only, some parameter groups only (`params`, e.g.
    "tint": TinT's subset) and a LoRA (`lora_rank`, merged into the weights) are options."""

    name = "dynamic-eval"
    Options = DynamicEvalOptions
    needs = "a token-input causal LM"
    summary = "gradient steps on the prompt (params=GROUPS: our Transformer's groups)"

    def setup(self) -> None:
        o = self.options
        check_sgd_options(o.learning_rate, o.n_steps, o.reduction, o.optimizer)
        check_separator(o.separator)
        targets = tuple(t.strip() for t in o.lora_targets.split(",")) if isinstance(o.lora_targets, str) \
            else tuple(o.lora_targets)
        if o.lora_rank is not None:
            check_lora_options(o.lora_rank, o.lora_alpha, targets)
        if o.params is not None:
            select_groups(o.params)  # a bad name fails here, before any work
            if o.lora_rank is not None:
                raise ValueError("params= and lora_rank cannot be combined (the LoRA chooses its own targets)")
        self.lora = {"lora_rank": o.lora_rank, "lora_alpha": o.lora_alpha, "seed": o.seed, "lora_targets": targets}

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or not model.config.tokens:
            return "needs a token-input causal LM"
        return None

    @property
    def needs_internals(self) -> bool:
        return self.options.params is not None  # parameter groups are our Transformer's

    def _absorb(self, model, given) -> AdaptedModel:
        prompt, loss_mask, o = given.prompt, given.loss_mask, self.options
        sequences, masks = training_sequences(prompt, loss_mask, o.separator, "dynamic evaluation")
        targets = None if loss_mask is None else masks
        updated, _ = prompt_sgd(model, sequences, targets, learning_rate=o.learning_rate, n_steps=o.n_steps,
                                reduction=o.reduction, optimizer=o.optimizer, n_top_layers=o.n_top_layers,
                                params=o.params, **self.lora)
        return updated_adapted(updated, prompt, o.keep_prompt, o.separator)


