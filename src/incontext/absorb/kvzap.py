"""KVzap (Jegou et al. 2026, arXiv 2601.07891) trained for the models here: per layer, a linear map from the hidden
state entering the attention to KVzip's log importance of each K/V head's pair at that position, fitted once across
documents; a document is then pressed in its one prefill (no reconstruction pass) by kvpress's own KVzapPress with
these weights. kvpress ships KVzap weights only for large models on the hub (nvidia/KVzap-*); this trains them with
the recipe's linear variant (targets: KVzip's scores, log; least squares).

    stats = KVzapFit.for_model(model)                       # running sums of one fit
    stats.add(kvzip_targets(model, ids, codec))             # a document: the hidden states and KVzip's scores
    scorer = stats.solve(ridge=1e-3)                        # kvpress's KVzapModel (linear), in closed form
    scorer.save_pretrained(folder)                          # config.json + model.safetensors (transformers' format)
    get_absorb_method("kv-press", press="kvzap", weights=folder, ratio=0.1)

The fit accumulates X^T X, X^T Y and the sums per layer in float64 (the hidden states of long documents never sit in
memory together); `solve` is ridge regression with an intercept, the penalty relative to the mean diagonal of the
centred X^T X. `presses.load_scorer` reads it back for kv-press; `scores_of(scorer, targets)` is the scorer's forward on the captured hidden states, what kvpress's
KVzapPress computes during the prefill (tests/absorb/test_kvzap.py checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..interop.hf import hf_twin
from ..models import Cache
from .presses import (_placed, _quiet_kvpress, _tokenizer_folder, backend_cache, document_start, press_classes,
                      with_bos, with_cache_position)

FLOOR = 1e-8  # KVzip's scores are attention probabilities; their log is taken above this floor


@dataclass
class KVzipTargets:
    """One document: per layer the hidden states entering the attention at the positions KVzip scores ((S, d)) and
    KVzip's scores there ((S, H_kv), max attention over the reconstruction's queries and each head's group)."""

    hidden: list[torch.Tensor]
    scores: list[torch.Tensor]

    @property
    def positions(self) -> int:
        return self.hidden[0].shape[0]


@torch.no_grad()
def kvzip_targets(model, prompt: torch.Tensor, codec, start: int | None = None) -> KVzipTargets:
    """Run kvpress's KVzip on the prompt ((M,) or (1, M) ids; the document placed as kv-press places it) and keep,
    instead of pressing, its scores and the hidden states each attention layer read in the prefill, at the positions
    KVzip scores (the document after the template's head: `start`, default from the codec's chat template)."""
    ids, bos = with_bos(model, prompt.reshape(1, -1)), getattr(model, "bos_id", None)
    hf = hf_twin(model)
    first = (document_start(codec, prompt.reshape(-1).tolist()) if start is None else start) + (bos is not None)
    if codec is None:
        raise ValueError("KVzip's targets need the model's tokenizer (KVzip writes its reconstruction prompt with it)")
    captured: dict[str, torch.Tensor] = {}

    class Scores(_placed(press_classes()["kvzip"], first)):
        def compress_post(self, model):  # keep the scores; evict nothing
            captured["scores"] = self.score_val[:, 0].detach().clone()  # (L, H, S)

    hidden: dict[int, torch.Tensor] = {}

    def keep_hidden(module, args, kwargs):
        if module.layer_idx not in hidden:  # the prefill, the first call; the reconstruction passes come later
            hidden[module.layer_idx] = kwargs["hidden_states"][0].detach().clone()

    from transformers import DynamicCache

    attention = [layer.self_attn for layer in hf.model.layers]
    hooks = [module.register_forward_pre_hook(keep_hidden, with_kwargs=True) for module in attention]
    try:
        with _quiet_kvpress(), _tokenizer_folder(hf, codec):
            press = with_cache_position(Scores(compression_ratio=0.5))
            with press(hf):
                hf.model(input_ids=ids.to(next(hf.parameters()).device), past_key_values=DynamicCache(config=hf.config))
    finally:
        for hook in hooks:
            hook.remove()
        for module in attention:
            module.masked_key_indices = None
    if "scores" not in captured:
        raise ValueError("KVzip scored nothing (an empty document?)")
    scores = captured["scores"]
    return KVzipTargets(hidden=[hidden[i][first:].float().cpu() for i in range(len(attention))],
                        scores=[scores[i][:, first:].T.float().cpu() for i in range(len(attention))])


def _log_scores(scores: torch.Tensor) -> torch.Tensor:
    return scores.double().clamp_min(FLOOR).log()


class KVzapFit:
    """Running sums of a per-layer least-squares fit from hidden states to KVzip's log scores."""

    def __init__(self, layers: int, width: int, heads: int):
        self.layers, self.width, self.heads = layers, width, heads
        self.n = 0
        self.xx = torch.zeros(layers, width, width, dtype=torch.float64)
        self.xy = torch.zeros(layers, width, heads, dtype=torch.float64)
        self.x = torch.zeros(layers, width, dtype=torch.float64)
        self.y = torch.zeros(layers, heads, dtype=torch.float64)

    @classmethod
    def for_model(cls, model) -> "KVzapFit":
        config = hf_twin(model).config
        return cls(config.num_hidden_layers, config.hidden_size, config.num_key_value_heads)

    def add(self, targets: KVzipTargets) -> None:
        if len(targets.hidden) != self.layers or targets.hidden[0].shape[1] != self.width or \
                targets.scores[0].shape[1] != self.heads:
            raise ValueError(f"KVzip targets of {len(targets.hidden)} layers, width {targets.hidden[0].shape[1]}, "
                             f"{targets.scores[0].shape[1]} K/V heads do not fit a scorer of {self.layers} layers, "
                             f"width {self.width}, {self.heads} heads")
        for layer, (x, s) in enumerate(zip(targets.hidden, targets.scores)):
            x, y = x.double(), _log_scores(s)
            self.xx[layer] += x.T @ x
            self.xy[layer] += x.T @ y
            self.x[layer] += x.sum(0)
            self.y[layer] += y.sum(0)
        self.n += targets.positions

    def solve(self, ridge: float = 1e-3):
        """kvpress's KVzapModel (linear: one nn.Linear(width, heads) per layer), the ridge solution with intercept."""
        from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

        if self.n < 2:
            raise ValueError("a KVzap fit needs the scores of at least two positions")
        model = KVzapModel(KVzapConfig(input_dim=self.width, output_dim=self.heads, n_modules=self.layers))
        for layer, linear in enumerate(model.layers):
            mean_x, mean_y = self.x[layer] / self.n, self.y[layer] / self.n
            xx = self.xx[layer] - self.n * torch.outer(mean_x, mean_x)  # centred
            xy = self.xy[layer] - self.n * torch.outer(mean_x, mean_y)
            penalty = ridge * float(xx.diagonal().mean().clamp_min(1e-12))
            weights = torch.linalg.solve(xx + penalty * torch.eye(self.width, dtype=torch.float64), xy)  # (d, H)
            with torch.no_grad():
                linear.weight.copy_(weights.T.float())
                linear.bias.copy_((mean_y - mean_x @ weights).float())
        return model.eval()


@torch.no_grad()
def scores_of(scorer, targets: KVzipTargets) -> list[torch.Tensor]:
    """The scorer's predicted log scores ((S, H) per layer) on a document's captured hidden states."""
    return [scorer.layers[i](x.to(scorer.layers[i].weight.dtype)) for i, x in enumerate(targets.hidden)]


def r2(scorer, documents: list[KVzipTargets]) -> list[float]:
    """Per layer, R^2 of the scorer's log scores against KVzip's on `documents` (every head and position pooled)."""
    out = []
    for layer in range(len(documents[0].hidden)):
        predicted = torch.cat([scores_of(scorer, d)[layer].double() for d in documents])
        truth = torch.cat([_log_scores(d.scores[layer]) for d in documents])
        out.append(float(1 - (predicted - truth).square().sum() / (truth - truth.mean(0)).square().sum()))
    return out


def kvzip_selection(scores: torch.Tensor, ratio: float, n_sink: int = 4) -> torch.Tensor:
    """KVzip's eviction rule (kvpress's KVzipPress.compress_post, not layerwise) on scores (L, H, S): the first n_sink
    positions kept (the attention sinks), the lowest-scored pairs over all layers and heads evicted until `ratio`
    of them is kept, each layer then evicting its count of lowest pairs across its heads. Returns keep (L, H, S)."""
    score = scores.clone()
    score[..., :n_sink] = score.amax() + 1.0
    layers, heads, length = score.shape
    compression = 1.0 - ratio
    pruned = torch.topk(-score.reshape(-1), int(score.numel() * compression)).indices
    per_layer = torch.bincount(pruned // (heads * length), minlength=layers)
    keep = torch.ones_like(score, dtype=torch.bool)
    for layer in range(layers):
        index = torch.topk(-score[layer].reshape(-1), int(per_layer[layer])).indices
        keep[layer].view(-1)[index] = False
    return keep


@torch.no_grad()
def kvzap_cache(model, prompt: torch.Tensor, scorer, ratio: float, n_sink: int = 4) -> Cache:
    """press=kvzap select=global: the document ((M,) or (1, M) ids) prefilled once on the model's transformers twin,
    each layer's pairs scored by the scorer from the hidden states its attention read, and KVzip's eviction rule on
    those scores (kvzip_selection): one pass, no reconstruction. A masked cache of the model's backend at M."""
    from transformers import DynamicCache

    m = prompt.reshape(1, -1).shape[1]
    ids, hf = with_bos(model, prompt.reshape(1, -1)), hf_twin(model)
    attention = [layer.self_attn for layer in hf.model.layers]
    hidden: dict[int, torch.Tensor] = {}

    def keep_hidden(module, args, kwargs):
        hidden[module.layer_idx] = kwargs["hidden_states"][0]

    hooks = [module.register_forward_pre_hook(keep_hidden, with_kwargs=True) for module in attention]
    cache = DynamicCache(config=hf.config)
    try:
        hf.model(input_ids=ids.to(next(hf.parameters()).device), past_key_values=cache)
    finally:
        for hook in hooks:
            hook.remove()
    scores = torch.stack([scorer.layers[i](hidden[i].to(scorer.layers[i].weight.dtype)).T.float()
                          for i in range(len(attention))])  # (L, H, S)
    keep = kvzip_selection(scores, ratio, n_sink).to(cache.layers[0].keys.device)
    return backend_cache(model, cache, [k[None] for k in keep], m, ids.shape[1])
