"""Context distillation ("prompt baking") into a LoRA adapter: the practical baseline the other methods are
weighed against. A peft LoRA on a copy of the frozen base (the student, without the prompt) is trained to match
the next-token distributions of the base with the prompt (the teacher), by KL(teacher || student), on:

- windows of the prompt's own text: the student reads the window alone, the teacher the full prefix;
- continuations the teacher samples from the prompt (seeded);
- `train_queries`, when the task gives some (never evaluation queries): teacher prompt + query, student query.

The student always runs as it will at query time: inputs start at position M (the prompt's length), as for
dynamic evaluation (`UpdatedWeights`). Nothing else reaches the method: it reads the model, the prompt and the
training queries, and draws all randomness from its own seeded generator.

    adapted = get_absorb_method("distill-lora", rank=8, steps=40).absorb(model, prompt, train_queries=[q1, q2])
    logits = adapted(query)        # the LoRA merged into a copy of the base: base speed
    interop.lora_export.save_peft_adapter(adapted, to_hf_llama(model), folder)  # the adapter alone, for peft
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..models import Cache, Transformer
from .base import AbsorbMethod, AdaptedModel

# linear layers of a Transformer block a LoRA can target (fused qkv and, for SwiGLU, fused gate/up)
LORA_TARGETS = ("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")


@dataclass(frozen=True)
class LoRASpec:
    rank: int
    alpha: float
    modules: tuple[str, ...]  # full module names in the Transformer, e.g. "blocks.0.attn.qkv"

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _factor_key(module: str, factor: str) -> str:
    return f"{module.replace('.', '_')}_{factor}"  # buffer names may not contain dots


class DistilledLoRA(AdaptedModel):
    """The base with a LoRA adapter W + (alpha / r) B A on `spec.modules`; queries start at position `offset`.

    merged: B A is added into the base's weights (queries at base speed) and the factors are kept as buffers
    (for export). Unmerged: the base carries peft's LoRA layers, which compute W x + (alpha / r) B A x."""

    method = "distill-lora"

    def __init__(self, base: Transformer, spec: LoRASpec, offset: int, merged: bool):
        super().__init__(base)
        self.spec, self.offset, self.merged = spec, offset, merged
        self.history: dict[str, Any] = {}  # training record of absorb(); not saved
        if merged:
            self.factors = nn.Module()
            for name in spec.modules:
                linear = base.get_submodule(name)
                self.factors.register_buffer(_factor_key(name, "A"), linear.weight.new_zeros(spec.rank, linear.in_features))
                self.factors.register_buffer(_factor_key(name, "B"), linear.weight.new_zeros(linear.out_features, spec.rank))
        else:
            _inject_lora(base, spec)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, position_offset=self.offset)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer, position=self.offset)

    def lora_factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module name -> (A (r, in), B (out, r)); the update of each module's weight is spec.scaling * B @ A."""
        if self.merged:
            return {name: (getattr(self.factors, _factor_key(name, "A")), getattr(self.factors, _factor_key(name, "B")))
                    for name in self.spec.modules}
        layers = {name: self.base.get_submodule(name) for name in self.spec.modules}
        return {name: (layer.lora_A["default"].weight, layer.lora_B["default"].weight) for name, layer in layers.items()}

    @torch.no_grad()
    def merged_model(self) -> "DistilledLoRA":
        """A merged copy (W <- W + scaling B A in each target); `self` is left as it is."""
        if self.merged:
            return copy.deepcopy(self)
        base = copy.deepcopy(self.base)
        factors = {name: (a.detach().clone(), b.detach().clone()) for name, (a, b) in self.lora_factors().items()}
        for name in self.spec.modules:
            parent_name, child = name.rsplit(".", 1)
            parent = base.get_submodule(parent_name)
            layer = getattr(parent, child)
            layer.merge()  # peft: base weight += scaling * B @ A
            setattr(parent, child, layer.base_layer)
        merged = DistilledLoRA(base, self.spec, self.offset, merged=True)
        for name, (a, b) in factors.items():
            getattr(merged.factors, _factor_key(name, "A")).copy_(a)
            getattr(merged.factors, _factor_key(name, "B")).copy_(b)
        merged.history = self.history
        return merged.eval()

    def extra_state(self) -> dict[str, Any]:
        return {"offset": self.offset, "merged": self.merged, "rank": self.spec.rank, "alpha": self.spec.alpha,
                "modules": list(self.spec.modules)}

    @classmethod
    def empty(cls, base, extra):
        spec = LoRASpec(extra["rank"], extra["alpha"], tuple(extra["modules"]))
        return cls(base, spec, extra["offset"], extra["merged"])


def _inject_lora(model: Transformer, spec: LoRASpec) -> None:
    """peft LoRA layers (dropout 0) on the named linears of `model`, in place; everything else frozen."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0, target_modules=list(spec.modules))
    with torch.random.fork_rng(devices=[]):  # peft initialises from the global generator; leave it untouched
        inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


# ----------------------------------------------------------------------------- the method


class DistillLoRA(AbsorbMethod):
    """Distil the prompted model into a LoRA on the model without the prompt (see the module docstring).

    Each epoch visits, in a seeded random order, ceil(M / window_tokens) prompt windows (a fresh random window
    each time, see `_window`), every continuation and every training query, `batch_size` sequences per AdamW
    step. Training stops after `steps` steps, or earlier when the mean KL of the last `patience` steps is not
    `min_improvement` (relative) below the mean of the `patience` steps before. The defaults absorb a 512-token
    prompt into SmolLM2-135M in about a minute on 2 CPU cores (benchmarks/distill_lora.py); more steps
    distil better. Randomness comes from one generator seeded with `seed` (CPU)."""

    name = "distill-lora"
    needs = "a token-input causal LM"

    def __init__(
        self,
        rank: int = 8,
        alpha: float = 16.0,
        target_modules: tuple[str, ...] | list[str] = ("attn.qkv", "attn.out"),
        steps: int = 16,
        learning_rate: float = 3e-3,
        n_continuations: int = 2,
        continuation_tokens: int = 32,
        window_tokens: int = 64,
        batch_size: int = 2,
        temperature: float = 1.0,
        patience: int = 8,
        min_improvement: float = 0.01,
        merge: bool = True,
        seed: int = 0,
        progress: bool = True,
    ):
        positive = {"rank": rank, "alpha": alpha, "learning_rate": learning_rate, "continuation_tokens": continuation_tokens,
                    "window_tokens": window_tokens, "batch_size": batch_size, "temperature": temperature,
                    "patience": patience}
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"distill-lora: {key} must be > 0, got {value}")
        if steps < 0 or n_continuations < 0 or min_improvement < 0:
            raise ValueError(f"distill-lora: steps, n_continuations and min_improvement must be >= 0, "
                             f"got {steps}, {n_continuations}, {min_improvement}")
        target_modules = (target_modules,) if isinstance(target_modules, str) else tuple(target_modules)
        unknown = sorted(set(target_modules) - set(LORA_TARGETS))
        if not target_modules or unknown:
            raise ValueError(f"distill-lora: target_modules must be a non-empty subset of {LORA_TARGETS}, "
                             f"got {target_modules}")
        self.rank, self.alpha, self.target_modules = int(rank), float(alpha), target_modules
        self.steps, self.learning_rate, self.batch_size = steps, learning_rate, batch_size
        self.n_continuations, self.continuation_tokens = n_continuations, continuation_tokens
        self.window_tokens = window_tokens
        self.temperature, self.patience, self.min_improvement = temperature, patience, min_improvement
        self.merge, self.seed, self.progress = merge, seed, progress

    def unsupported(self, model) -> str | None:
        if not isinstance(model, Transformer):
            return f"needs a token-input causal LM (an incontext Transformer), got {type(model).__name__}"
        if not model.config.tokens:
            return "needs a token-input causal LM; this model reads vectors"
        return None

    def _absorb(self, model: Transformer, prompt: torch.Tensor, loss_mask: torch.Tensor | None,
                train_queries: list[torch.Tensor] | None) -> DistilledLoRA:
        """`loss_mask` is ignored (the student matches the teacher everywhere); `train_queries` must never be
        evaluation queries."""
        max_len = model.config.max_seq_len
        prompt = _prompt_ids(prompt, max_len)
        m = prompt.shape[0]
        queries = _query_ids(train_queries, m, max_len)
        generator = torch.Generator().manual_seed(self.seed)

        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            prompt_logp, sequences = self._teacher_targets(model, prompt, queries, generator)
            spec = LoRASpec(self.rank, self.alpha, tuple(f"blocks.{i}.{t}" for i in range(model.config.n_layer)
                                                        for t in self.target_modules))
            adapted = DistilledLoRA(copy.deepcopy(model), spec, offset=m, merged=False).eval()
        finally:
            model.train(was_training)
        _init_lora(adapted, generator)
        teacher_seconds = time.perf_counter() - start
        adapted.history = self._train(adapted, prompt, prompt_logp, sequences, generator)
        adapted.history.update(teacher_seconds=teacher_seconds, train_seconds=time.perf_counter() - start - teacher_seconds)
        return adapted.merged_model() if self.merge else adapted

    @torch.no_grad()
    def _teacher_targets(self, model, prompt, queries, generator):
        """The teacher's next-token log-probabilities at every prompt position (M, V), and the other training
        sequences as (student tokens (L,), teacher log-probs (L, V)) pairs."""
        m = prompt.shape[0]
        cache = Cache.empty(model.config.n_layer)
        prompt_logits = model(prompt[None], cache=cache)[0]
        sequences = []
        room = model.config.max_seq_len - m
        if self.n_continuations:
            tokens, logits = _sample(model, cache, prompt_logits[-1], self.n_continuations,
                                     min(self.continuation_tokens, room), self.temperature, generator)
            sequences += [(t, F.log_softmax(x.float(), -1).to(x.dtype)) for t, x in zip(tokens, logits)]
        for query in queries:
            logits = model(query[None], cache=_copy(cache))[0]
            sequences.append((query, F.log_softmax(logits.float(), -1).to(logits.dtype)))
        return F.log_softmax(prompt_logits.float(), -1).to(prompt_logits.dtype), sequences

    def _train(self, adapted: DistilledLoRA, prompt, prompt_logp, sequences, generator) -> dict[str, Any]:
        m = prompt.shape[0]
        window = min(self.window_tokens, m, adapted.base.config.max_seq_len - m)
        n_windows = math.ceil(m / window)
        pool = [None] * n_windows + sequences  # None: draw a fresh prompt window
        params = [p for p in adapted.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        losses: list[float] = []
        stopped_early = False
        order: list[int] = []
        bar = tqdm(total=self.steps, desc="distill-lora", unit="step", disable=not self.progress, leave=False)
        for _ in range(self.steps):
            if len(order) < self.batch_size:
                order += torch.randperm(len(pool), generator=generator).tolist()
            picked, order = order[: self.batch_size], order[self.batch_size:]
            batch = [pool[i] if pool[i] is not None else _window(prompt, prompt_logp, window, generator) for i in picked]
            loss = _kl_loss(adapted, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(kl=f"{losses[-1]:.4f}")
            if _plateau(losses, self.patience, self.min_improvement):
                stopped_early = True
                break
        bar.close()
        for p in params:
            p.requires_grad_(False)
        return {"kl": losses, "steps": len(losses), "stopped_early": stopped_early,
                "pool": {"prompt_windows": n_windows, "other_sequences": len(sequences)}}


# ----------------------------------------------------------------------------- helpers


def _prompt_ids(prompt: torch.Tensor, max_len: int) -> torch.Tensor:
    if not isinstance(prompt, torch.Tensor) or prompt.dtype not in (torch.int64, torch.int32):
        raise ValueError("distill-lora: the prompt must be a tensor of token ids")
    if prompt.dim() == 2:
        if prompt.shape[0] != 1:
            raise ValueError(f"distill-lora: absorb one prompt at a time; got a batch of shape {tuple(prompt.shape)}")
        prompt = prompt[0]
    if prompt.dim() != 1 or prompt.shape[0] == 0:
        raise ValueError(f"distill-lora: the prompt must be a non-empty 1-D sequence of token ids, "
                         f"got shape {tuple(prompt.shape)}")
    if prompt.shape[0] >= max_len:
        raise ValueError(f"distill-lora: a prompt of {prompt.shape[0]} tokens leaves no room for queries within "
                         f"max_seq_len={max_len}")
    return prompt.long()


def _query_ids(queries, m: int, max_len: int) -> list[torch.Tensor]:
    if queries is None:
        return []
    out = []
    for i, query in enumerate(queries):
        if not isinstance(query, torch.Tensor) or query.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"distill-lora: train_queries[{i}] must be a tensor of token ids")
        query = query[0] if query.dim() == 2 and query.shape[0] == 1 else query
        if query.dim() != 1 or query.shape[0] == 0:
            raise ValueError(f"distill-lora: train_queries[{i}] must be a non-empty 1-D sequence, "
                             f"got shape {tuple(query.shape)}")
        if m + query.shape[0] > max_len:
            raise ValueError(f"distill-lora: train_queries[{i}] ({query.shape[0]} tokens) after the {m}-token prompt "
                             f"exceeds max_seq_len={max_len}")
        out.append(query.long())
    return out


def _copy(cache: Cache, batch: int = 1) -> Cache:
    """A cache of the same context that a forward pass can extend without touching `cache`, for `batch` rows."""
    layers = [tuple(t.expand(batch, *t.shape[1:]) for t in layer) for layer in cache.layers]
    return Cache(layers=layers, position=cache.position)


def _sample(model, cache, last_logits, n, length, temperature, generator):
    """n continuations of `length` tokens sampled from the model after the cached prompt, and the model's
    logits after each sampled token (n, length, V): the teacher's targets come with the sampling."""
    cache = _copy(cache, n)
    logits = last_logits.expand(n, -1)
    tokens, targets = [], []
    for _ in range(length):
        token = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator)
        logits = model(token, cache=cache)[:, -1]
        tokens.append(token)
        targets.append(logits)
    return torch.cat(tokens, 1), torch.stack(targets, 1)


def _window(prompt, prompt_logp, width, generator):
    """A random window of the prompt (student tokens, teacher log-probs given the whole prefix). It starts after
    the first token (a window at 0 is the teacher's own context: nothing to learn) and is clipped at the end,
    so every position from `width` on is covered equally often, the last ones included."""
    m = prompt.shape[0]
    if m == 1:
        return prompt, prompt_logp
    start = int(torch.randint(1, m, (1,), generator=generator))
    return prompt[start: start + width], prompt_logp[start: start + width]


def _kl_loss(adapted: DistilledLoRA, batch) -> torch.Tensor:
    """Mean over real tokens of KL(teacher || student); sequences are right-padded (causal: padding is unseen)."""
    length = max(tokens.shape[0] for tokens, _ in batch)
    tokens = batch[0][0].new_zeros(len(batch), length)
    vocab = batch[0][1].shape[-1]
    teacher = batch[0][1].new_zeros(len(batch), length, vocab)
    mask = torch.zeros(len(batch), length, dtype=torch.bool, device=tokens.device)
    for row, (ids, logp) in enumerate(batch):
        tokens[row, : ids.shape[0]], teacher[row, : ids.shape[0]], mask[row, : ids.shape[0]] = ids, logp, True
    student = F.log_softmax(adapted(tokens), -1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return kl[mask].mean()


def _plateau(losses: list[float], patience: int, min_improvement: float) -> bool:
    if len(losses) < 2 * patience:
        return False
    recent = sum(losses[-patience:]) / patience
    before = sum(losses[-2 * patience: -patience]) / patience
    return recent > (1.0 - min_improvement) * before


def _init_lora(adapted: DistilledLoRA, generator: torch.Generator) -> None:
    """peft's initialisation (A ~ kaiming-uniform(a=sqrt(5)), B = 0) from our seeded generator."""
    with torch.no_grad():
        for a, b in adapted.lora_factors().values():
            bound = 1.0 / math.sqrt(a.shape[1])
            a.copy_(torch.empty(a.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator))
            b.zero_()
