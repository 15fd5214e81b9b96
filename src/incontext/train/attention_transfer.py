"""Attention transfer: learned feature maps distilled from a softmax model's own attention (Hedgehog, LoLCATs).

1. `capture_queries_keys`: one pass of the frozen softmax model over training windows records every layer's
   queries and keys after RoPE.
2. `fit_feature_maps`: per layer, `LearnedFeatures` (one map per query head for queries and for keys) trained to
   match the true causal softmax weights (ops/feature_maps.attention_distillation_loss) in two uses at once:
   all keys through the features (a linearized model) and keys before a random split through the features, the
   rest exact (the approximate conversion of a prompt). Saved after every layer (safetensors + JSON of the
   options and losses), so an interrupted run resumes at the next layer.
3. `tune_maps_for_conversion` (optional): the fitted maps trained further end to end, so that the approximate
   conversion of a prompt (its keys through the maps, the query exact) gives the prompted model's next-token
   distributions on the query. The per-layer fit sees each layer's inputs from the exact model; in use, the errors
   of earlier layers' conversions reach the later layers and compound (README: which layers cost the facts).
4. `linearize`: the same weights in a linear-attention Transformer that uses the maps; exact ICLCA applies to it.

    captures = capture_queries_keys(model, windows)
    maps = fit_feature_maps(captures, TransferConfig(), scale=model_scale(model), folder="maps")
    linear = linearize(model, maps)
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..config import from_dict, to_dict
from ..fileio import durable_replace, strict_json, write_text_atomic
from ..models import Cache, Transformer, TransformerConfig
from ..ops import apply_rope, rope_cos_sin
from ..ops.prefix_attention import absorb_layer
from ..ops.feature_maps import LearnedFeatures, attention_distillation_loss, attention_distillation_losses

MAPS_FILE, OPTIONS_FILE = "feature_maps.safetensors", "feature_maps.json"


@dataclass
class TransferConfig:
    n_features: int = 128  # per head: m directions, both signs
    steps: int = 150  # Adam steps per layer
    lr: float = 0.01
    batch: int = 4  # windows per step
    split_weight: float = 1.0  # weight of the conversion (split) loss beside the all-features one
    seed: int = 0

    def __post_init__(self):
        for name in ("n_features", "steps", "batch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TransferConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.n_features % 2:
            raise ValueError(f"TransferConfig.n_features must be even (+/- pairs), got {self.n_features}")
        if not (self.lr > 0 and self.split_weight >= 0):
            raise ValueError("TransferConfig.lr must be > 0 and split_weight >= 0")


def model_scale(model: Transformer) -> float:
    c = model.config
    return 1.0 / math.sqrt(c.dim_head) if c.scale_attn else 1.0


@torch.no_grad()
def capture_queries_keys(model: Transformer, windows: torch.Tensor, batch: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (q (N, H, T, d), k (N, H_kv, T, d)) after RoPE at positions 0..T-1, for token windows (N, T)."""
    c = model.config
    if c.attention != "softmax":
        raise ValueError(f"attention transfer reads a softmax model; this one has attention={c.attention!r}")
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(c.n_layer)}
    hooks = [block.attn.qkv.register_forward_hook(lambda _m, _i, out, i=i: seen[i].append(out))
             for i, block in enumerate(model.blocks)]
    try:
        for start in range(0, windows.shape[0], batch):
            model(windows[start:start + batch])
    finally:
        for hook in hooks:
            hook.remove()
    t = windows.shape[1]
    rope = rope_cos_sin(torch.arange(t), c.dim_head, c.rope_theta, torch.float32) if c.positions == "rope" else None
    layers = []
    for i in range(c.n_layer):
        qkv = torch.cat(seen.pop(i)).float()
        q, k, _ = qkv.split([c.n_head * c.dim_head, c.kv_heads * c.dim_head, c.kv_heads * c.dim_head], -1)
        q = q.view(*q.shape[:2], c.n_head, c.dim_head).transpose(1, 2)
        k = k.view(*k.shape[:2], c.kv_heads, c.dim_head).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        layers.append((q.contiguous(), k.contiguous()))
    return layers


def transfer_loss(maps: LearnedFeatures, q: torch.Tensor, k: torch.Tensor, scale: float,
                  split: int | torch.Tensor | None, split_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(total, all-features loss, split loss) for q (B, H, T, d) and k repeated to the query heads."""
    if split is None or split_weight == 0:
        linear = attention_distillation_loss(maps, q, k, scale)
        return linear, linear, None
    linear, converted = attention_distillation_losses(maps, q, k, scale, (None, split))
    return linear + split_weight * converted, linear, converted


def save_feature_maps(maps: list[LearnedFeatures], folder: str | Path, options: dict) -> None:
    """Every finished layer's maps (safetensors) and the options, losses and progress (JSON)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{i}.{name}": t.detach().contiguous().float() for i, layer in enumerate(maps)
               for name, t in layer.state_dict().items()}
    partial = folder / f".{MAPS_FILE}.partial"
    save_file(tensors, str(partial))
    durable_replace(partial, folder / MAPS_FILE)
    write_text_atomic(folder / OPTIONS_FILE, strict_json({**options, "layers_done": len(maps)}))


def read_options(folder: str | Path) -> dict:
    path = Path(folder) / OPTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} holds no learned feature maps ({OPTIONS_FILE} is missing)")
    return json.loads(path.read_text())


def load_feature_maps(folder: str | Path, *, partial: bool = False) -> list[LearnedFeatures]:
    """The maps of every layer saved in `folder` (refuses an unfinished run unless partial=True)."""
    options = read_options(folder)
    done = options["layers_done"]
    if done < options["n_layer"] and not partial:
        raise ValueError(f"{folder}: only {done} of {options['n_layer']} layers are trained; resume the training first")
    tensors = load_file(str(Path(folder) / MAPS_FILE)) if done else {}
    maps = []
    for i in range(done):
        layer = LearnedFeatures(options["n_head"], options["dim"], options["n_features"], scale=options["scale"])
        layer.load_state_dict({name: tensors[f"{i}.{name}"] for name in layer.state_dict()})
        maps.append(layer)
    return maps


RESUME_KEYS = ("n_layer", "n_head", "dim", "n_features", "training", "splits")  # must match to resume a fit


def differing_options(saved: dict, wanted: dict) -> list[str]:
    """The keys of `wanted` whose saved value differs (a key absent from `saved` reads as None)."""
    return [key for key, value in wanted.items() if saved.get(key) != value]


def load_finished_maps(folder: str | Path, n_layer: int, wanted: dict) -> list[LearnedFeatures] | None:
    """The maps saved in `folder` when all `n_layer` layers are fitted (None when there are none or only some); finished
    maps whose saved options differ from `wanted` (e.g. the training settings) are refused, so they are never
    reused for a run that asked for others."""
    if not (Path(folder) / OPTIONS_FILE).is_file():
        return None
    saved = read_options(folder)
    if saved["layers_done"] != n_layer:
        return None
    mismatched = differing_options(saved, wanted)
    if mismatched:
        raise ValueError(f"{folder} holds finished maps fitted with other settings ({', '.join(mismatched)}); use a new output folder")
    return load_feature_maps(folder)


def fit_feature_maps(captures: list[tuple[torch.Tensor, torch.Tensor]], config: TransferConfig, *, scale: float,
                     folder: str | Path | None = None, progress: bool = True, extra: dict | None = None,
                     splits: list[int | None] | None = None) -> list[LearnedFeatures]:
    """Train one `LearnedFeatures` per layer on captured (q, k); with `folder`, save after every layer and
    resume from what is there (same options required). The conversion loss splits each step's windows at one
    random place in the middle half; `splits` (one per window) fixes a window's split instead (e.g. where its
    prompt ends; None there: random)."""
    n_layer = len(captures)
    q0, k0 = captures[0]
    n_windows, n_head, t, dim = q0.shape
    groups = n_head // k0.shape[1]
    if splits is not None and (len(splits) != n_windows or any(m is not None and not 0 < m < t for m in splits)):
        raise ValueError(f"splits must give one split in 1..{t - 1} (or None) per window ({n_windows}), got {splits}")
    options = {"n_layer": n_layer, "n_head": n_head, "dim": dim, "n_features": config.n_features, "scale": scale,
               **({"splits": list(splits)} if splits is not None else {}),
               "training": dataclasses.asdict(config), "windows": n_windows, "window_tokens": t, **(extra or {})}
    maps: list[LearnedFeatures] = []
    losses: list[dict] = []
    if folder is not None and (Path(folder) / OPTIONS_FILE).is_file():
        saved = read_options(folder)
        mismatched = differing_options(saved, {key: options.get(key) for key in RESUME_KEYS})
        if mismatched:
            raise ValueError(f"{folder} holds maps trained with other options ({', '.join(mismatched)}); use a new folder")
        maps, losses = load_feature_maps(folder, partial=True), saved.get("losses", [])
    bar = tqdm(total=n_layer * config.steps, initial=len(maps) * config.steps, desc="feature maps", disable=not progress)
    for i in range(len(maps), n_layer):
        rng = random.Random(f"transfer-{config.seed}-{i}")  # per layer: a resumed run trains as an uninterrupted one
        q_all, k_all = captures[i]
        k_all = k_all.repeat_interleave(groups, dim=1)
        layer = LearnedFeatures(n_head, dim, config.n_features, scale=scale, seed=config.seed + i)
        optimizer = torch.optim.Adam(layer.parameters(), lr=config.lr)
        held = slice(0, min(config.batch, n_windows))  # a fixed batch to report the loss before and after

        def measure() -> dict:
            with torch.no_grad():
                _, linear, converted = transfer_loss(layer, q_all[held], k_all[held], scale, t // 2, 1.0)
            return {"linear": linear.item(), "converted": converted.item()}

        before = measure()
        for _ in range(config.steps):
            pick = rng.sample(range(n_windows), min(config.batch, n_windows))
            split = rng.randint(t // 4, 3 * t // 4)
            if splits is not None:
                split = torch.tensor([split if splits[j] is None else splits[j] for j in pick])
            loss, _, _ = transfer_loss(layer, q_all[pick], k_all[pick], scale, split, config.split_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.update(1)
            bar.set_postfix(layer=i, loss=f"{loss.item():.3f}")
        with torch.no_grad():  # keeps exp(log phi(k)) in float range in linear attention (cancels there)
            layer.key_offset.copy_(layer.log_k(k_all).amax(dim=(0, 2, 3)))
        maps.append(layer)
        losses.append({"layer": i, "before": before, "after": measure()})
        if folder is not None:
            save_feature_maps(maps, folder, {**options, "losses": losses})
    bar.close()
    return maps


def prompt_cache(model: Transformer, prompt: torch.Tensor) -> Cache:
    """The exact model's cache after the prompt (1, M): what a conversion absorbs (it does not depend on the maps)."""
    cache = Cache.empty(model.config.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    return cache


def conversion_kl(model: Transformer, maps: list[LearnedFeatures], prompt: torch.Tensor, query: torch.Tensor,
                  target: torch.Tensor | None = None, cache: Cache | None = None) -> torch.Tensor:
    """KL(prompted || converted) per query token, mean over the query's tokens: the prompt (1, M) runs exactly and its
    keys/values go through `maps` (differentiable in them), the query (1, T) attends to it so; `target`, the prompted
    model's log-probabilities on the query, and `cache`, the prompt's `prompt_cache`, are computed when not given."""
    c = model.config
    groups = c.n_head // c.kv_heads
    if target is None:
        with torch.no_grad():
            target = torch.log_softmax(model(torch.cat([prompt, query], 1))[:, prompt.shape[1]:], -1)
    cache = prompt_cache(model, prompt) if cache is None else cache
    states = [absorb_layer(k, v, scale=model_scale(model), groups=groups, learned=maps[i])
              for i, (k, v) in enumerate(cache.layers)]
    log_converted = torch.log_softmax(model(query, cache=Cache(layers=states, position=cache.position)), -1)
    return torch.nn.functional.kl_div(log_converted.flatten(0, 1), target.flatten(0, 1), log_target=True,
                                      reduction="batchmean")


def tune_maps_for_conversion(model: Transformer, maps: list[LearnedFeatures], pairs: list[tuple[torch.Tensor, torch.Tensor]],
                             *, steps: int, lr: float, batch: int, seed: int = 0, progress: bool = True) -> list[float]:
    """Train `maps` (in place; the model stays frozen) by Adam on conversion_kl over (prompt (M,), query (T,)) pairs,
    `batch` pairs a step drawn at random (seeded), gradients clipped to norm 1. Returns the loss per step."""
    if not pairs or steps < 1 or batch < 1 or not lr > 0:
        raise ValueError(f"tune_maps_for_conversion needs pairs, steps >= 1, batch >= 1 and lr > 0; got {len(pairs)} "
                         f"pairs, steps={steps}, batch={batch}, lr={lr}")
    frozen = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    with torch.no_grad():  # the prompted model's targets, once
        targets = [torch.log_softmax(model(torch.cat([p, q])[None])[:, len(p):], -1) for p, q in pairs]
    # the prompts' exact caches, once (they do not depend on the maps; 30 layers x 160 tokens of SmolLM2 K/V: ~8 MB a pair)
    caches = [prompt_cache(model, p[None]) for p, _ in pairs]
    params = [p for layer in maps for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=lr)
    rng = random.Random(f"conversion-{seed}")
    losses, per_step = [], min(batch, len(pairs))
    try:
        for _ in tqdm(range(steps), desc="conversion tuning", disable=not progress):
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for j in rng.sample(range(len(pairs)), per_step):
                loss = conversion_kl(model, maps, pairs[j][0][None], pairs[j][1][None], targets[j], caches[j]) / per_step
                loss.backward()  # one pair at a time: prompts differ in length
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(total)
    finally:
        for p, flag in zip(model.parameters(), frozen):
            p.requires_grad_(flag)
        for p in params:
            p.requires_grad_(False)
    return losses


def linearize(model: Transformer, maps: list[LearnedFeatures], *, linear_impl: str = "chunked") -> Transformer:
    """A linear-attention copy of the softmax `model`: the same weights, attention through the learned maps."""
    c = model.config
    if c.attention != "softmax":
        raise ValueError(f"linearize needs a softmax model; this one has attention={c.attention!r}")
    if len(maps) != c.n_layer or any(m.n_head != c.n_head or m.dim != c.dim_head for m in maps):
        raise ValueError(f"the maps do not fit the model: {len(maps)} layers for {c.n_layer}, "
                         f"heads/dim {maps[0].n_head if maps else None}/{maps[0].dim if maps else None} for {c.n_head}/{c.dim_head}")
    config = from_dict(TransformerConfig, {**to_dict(c), "attention": "linear", "feature_map": "learned",
                                           "n_features": maps[0].n_features, "linear_impl": linear_impl})
    dtype = next(model.parameters()).dtype
    linear = Transformer(config).to(dtype)
    state = dict(model.state_dict())
    for i, layer in enumerate(maps):
        state.update({f"blocks.{i}.attn.learned.{name}": t.to(dtype) for name, t in layer.state_dict().items()})
    linear.load_state_dict(state)
    return linear.eval() if not model.training else linear
