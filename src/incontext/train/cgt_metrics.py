"""CGT metrics (paper sec. 4.2, spec "Metrics"): base and specialised accuracy on the arithmetic sequences,
representation variation (eq. 4), linear-fit error of the task parameters from y, the <n_s . n_t> map, t-SNE;
and on text mixtures (sec. 4.4): y's transition at a join, document embeddings and their topic accuracy, y's
spread across documents (collapse), per-position cross-entropy with y frozen after a prefix.

Arithmetic layout: task k spans examples k*n_ex .. (k+1)*n_ex - 1 of `example_length(d)` characters each,
the last one a separator. "Prompt" = the first n_prompt examples of a task (2 of 4 in the paper), "E1";
the rest, "E2", is what accuracy, variation and the linear fit are measured on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..models import CGT
from ..tasks.arithmetic import ArithmeticConfig, example_length
from ..tasks.base import Batch


@dataclass(frozen=True)
class TaskSpans:
    """Where each task's prompt examples (E1) and measured examples (E2) sit in a sequence."""

    example_len: int
    n_ex: int
    n_tasks: int
    n_prompt: int

    @classmethod
    def of(cls, config: ArithmeticConfig, n_prompt: int | None = None) -> TaskSpans:
        n_prompt = config.n_ex // 2 if n_prompt is None else n_prompt
        if not 1 <= n_prompt < config.n_ex:
            raise ValueError(f"n_prompt must lie in [1, n_ex={config.n_ex}), got {n_prompt}")
        return cls(example_length(config.digits), config.n_ex, config.n_tasks, n_prompt)

    def task(self, k: int) -> tuple[int, int, int]:
        """(start, cut, end): the task spans [start, end), its E2 examples [cut, end)."""
        start = k * self.n_ex * self.example_len
        return start, start + self.n_prompt * self.example_len, start + self.n_ex * self.example_len


def answer_scores(logits: torch.Tensor, batch: Batch, select: torch.Tensor, answer_chars: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-character correctness and per-answer exact match on the answer positions inside `select`."""
    correct = logits.argmax(-1) == batch.targets
    chosen = batch.mask & select
    chars = correct[chosen]
    return chars.float(), chars.reshape(-1, answer_chars).all(-1).float()


@torch.no_grad()
def base_accuracy(model: torch.nn.Module, batch: Batch, spans: TaskSpans, answer_chars: int) -> dict[str, float]:
    """Teacher-forced accuracy on the answers of the E2 examples, the whole sequence in context (dynamic y)."""
    select = batch.info["example_index"] >= spans.n_prompt
    chars, exact = answer_scores(model(batch.inputs), batch, select, answer_chars)
    return {"char_accuracy": chars.mean().item(), "exact_match": exact.mean().item()}


@torch.no_grad()
def specialized_accuracy(model: torch.nn.Module, batch: Batch, spans: TaskSpans, answer_chars: int,
                         frozen: bool = True) -> dict[str, float]:
    """Accuracy on each task's E2 examples run alone (positions from 0). frozen=True: a CGT with y frozen at
    the separator that ends the prompt examples (the specialised model; folding gives the same logits);
    frozen=False: the prompt examples are simply dropped (no context; any model)."""
    contexts = model.context(batch.inputs) if frozen else None
    chars, exact = [], []
    for k in range(spans.n_tasks):
        _, cut, end = spans.task(k)
        piece = Batch(batch.inputs[:, cut:end], batch.targets[:, cut:end], batch.mask[:, cut:end], {})
        logits = model(piece.inputs, y=contexts[:, cut - 1]) if frozen else model(piece.inputs)
        c, e = answer_scores(logits, piece, torch.ones_like(piece.mask), answer_chars)
        chars.append(c)
        exact.append(e)
    return {"char_accuracy": torch.cat(chars).mean().item(), "exact_match": torch.cat(exact).mean().item()}


def representation_variation(y: torch.Tensor, spans: TaskSpans) -> float:
    """Eq. (4): total variation of y over E2, after centring and normalising over each task's E1 + E2."""
    values = []
    for k in range(spans.n_tasks):
        start, cut, end = spans.task(k)
        delta = y[:, start:end] - y[:, start:end].mean(dim=1, keepdim=True)
        scale = delta.square().sum(-1).mean(dim=1, keepdim=True).sqrt()[..., None]
        normalised = delta / scale.clamp_min(1e-12)
        local = cut - start
        steps = normalised[:, local:] - normalised[:, local - 1 : -1]  # s in E2, s - 1 may be E1's last
        values.append(steps.norm(dim=-1).mean(dim=1))
    return torch.stack(values).mean().item()


def linear_fit(y: torch.Tensor, params: dict[str, torch.Tensor], spans: TaskSpans) -> dict[str, float]:
    """Least squares (with intercept) from y_s, s in E2, to the z-scored task parameters (a, b); fit on the
    first half of the sequences, scored on the second. Mean absolute error (z units) and R^2 per parameter."""
    n = y.shape[0]
    if n < 4:
        raise ValueError(f"the linear fit needs at least 4 sequences, got {n}")
    feats, targets = [], []
    for k in range(spans.n_tasks):
        _, cut, end = spans.task(k)
        feats.append(y[:, cut:end].double())  # (B, |E2|, d)
        targets.append(torch.stack([params[p][:, k] for p in sorted(params)], -1)[:, None].expand(-1, end - cut, -1))
    x = torch.cat(feats, 1)
    t = torch.cat(targets, 1).double()
    half = n // 2
    mean, std = t[:half].reshape(-1, t.shape[-1]).mean(0), t[:half].reshape(-1, t.shape[-1]).std(0)
    t = (t - mean) / std
    design = torch.cat([x, torch.ones_like(x[..., :1])], -1)
    train_x, train_t = design[:half].reshape(-1, design.shape[-1]), t[:half].reshape(-1, t.shape[-1])
    test_x, test_t = design[half:].reshape(-1, design.shape[-1]), t[half:].reshape(-1, t.shape[-1])
    # on CPU the default driver (gelsy) rounds differently with the data's memory alignment, so that two runs could
    # differ at 1e-10; the SVD driver gelsd (CPU only) gives the same bits every time
    weights = torch.linalg.lstsq(train_x, train_t, driver="gelsd" if train_x.device.type == "cpu" else None).solution
    error = test_x @ weights - test_t
    result = {"mean_abs_error": error.abs().mean().item()}
    for i, name in enumerate(sorted(params)):
        result[f"r2_{name}"] = (1 - error[:, i].square().mean() / test_t[:, i].var(unbiased=False)).item()
        result[f"mean_abs_error_{name}"] = error[:, i].abs().mean().item()
    return result


def unit_rows(y: torch.Tensor) -> torch.Tensor:
    return y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def dot_product_map(y: torch.Tensor) -> torch.Tensor:
    """<n_s . n_t> averaged over sequences, n = y / ||y||: (T, T)."""
    n = unit_rows(y)
    return torch.einsum("bsd,btd->st", n, n) / y.shape[0]


def probe_r2(features: torch.Tensor, targets: torch.Tensor, lam: float = 1e-3) -> float:
    """Held-out R^2 (mean over target columns) of a ridge map features -> targets fitted on the first half of the
    rows (standardised features, an intercept) and scored on the second half."""
    features, targets = features.double(), targets.double()
    half = features.shape[0] // 2
    mean, std = features[:half].mean(0), features[:half].std(0).clamp_min(1e-12)
    design = torch.cat([(features - mean) / std, torch.ones(features.shape[0], 1, dtype=torch.float64)], dim=1)
    fit, test = design[:half], design[half:]
    weights = torch.linalg.solve(fit.T @ fit + lam * half * torch.eye(fit.shape[1], dtype=torch.float64), fit.T @ targets[:half])
    residual = ((test @ weights - targets[half:]) ** 2).sum(0)
    total = ((targets[half:] - targets[half:].mean(0)) ** 2).sum(0)
    return float((1 - residual / total).mean())


def cgt_arithmetic_metrics(model: torch.nn.Module, batch: Batch, config: ArithmeticConfig) -> dict[str, float]:
    """Every Table-1 metric for one model on one held-out batch (CGT-only metrics skipped for a Transformer)."""
    spans, answer_chars = TaskSpans.of(config), config.digits + 3
    metrics = {f"base_{k}": v for k, v in base_accuracy(model, batch, spans, answer_chars).items()}
    metrics.update({f"no_prompt_{k}": v for k, v in specialized_accuracy(model, batch, spans, answer_chars, frozen=False).items()})
    if isinstance(model, CGT):
        metrics.update({f"specialized_{k}": v for k, v in specialized_accuracy(model, batch, spans, answer_chars).items()})
        y = model.context(batch.inputs)
        metrics["variation"] = representation_variation(y, spans)
        fit = linear_fit(y, {"a": batch.info["a"], "b": batch.info["b"]}, spans)
        metrics.update({f"linear_fit_{k}": v for k, v in fit.items()})
    return metrics


# ----------------------------------------------------------------------------- text mixtures (sec. 4.4)


def join_transition(y: torch.Tensor, joins: torch.Tensor, window: int) -> dict[str, list[float]]:
    """Mean cosine of n_{j+d} with n_{j-1} (before the join) and with n_{T-1} (end), d = -window..window."""
    n = unit_rows(y)
    before, after = [], []
    for d in range(-window, window + 1):
        rows = [(b, int(j) + d) for b, j in enumerate(joins) if 0 <= int(j) + d < y.shape[1]]
        before.append(float(np.mean([float(n[b, s] @ n[b, int(joins[b]) - 1]) for b, s in rows])))
        after.append(float(np.mean([float(n[b, s] @ n[b, -1]) for b, s in rows])))
    return {"offsets": list(range(-window, window + 1)), "cos_with_before_join": before, "cos_with_end": after}


def document_embeddings(model, docs: list[tuple[int, torch.Tensor]], seq_len: int) -> np.ndarray:
    """Mean y over the last 16 tokens of each document's first seq_len tokens."""
    return np.stack([model.context(tokens[None, :seq_len])[0, -16:].mean(0).numpy() for _, tokens in docs])


def knn_topic_accuracy(vectors: np.ndarray, labels: list[int]) -> float | None:
    """Cross-validated 5-nearest-neighbour topic accuracy of the (normalised) vectors; None with too few per topic."""
    from sklearn.model_selection import cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    folds = min(5, min(labels.count(t) for t in set(labels)))
    if folds < 2:
        return None
    normalised = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
    return float(cross_val_score(KNeighborsClassifier(min(5, len(labels) - len(labels) // folds)), normalised, labels, cv=folds).mean())


@torch.no_grad()
def y_spread(model, docs: list[tuple[int, torch.Tensor]], seq_len: int, skip: int) -> dict[str, float]:
    """Has y collapsed? For each document, the unit directions n_s of y over its positions skip..seq_len-1:
    `cos_within` = mean cosine of n_s with the document's mean direction; `cos_across` = mean cosine between two
    documents' mean directions (distinct pairs); `between_share` = share of y's total variance (over all those
    positions) that lies between the documents' means. A collapsed y has cos_across ~ cos_within ~ 1."""
    length = min(seq_len, *(len(tokens) for _, tokens in docs))  # documents differ in length: compare equal spans
    if length <= skip:
        raise ValueError(f"y_spread: the shortest document has {length} tokens, not more than skip={skip}")
    ys = torch.stack([model.context(tokens[None, :length])[0, skip:] for _, tokens in docs]).double()  # (D, S, d_y)
    n = unit_rows(ys)
    means = unit_rows(n.mean(1))
    within = float((n * means[:, None]).sum(-1).mean())
    gram = means @ means.T
    d = len(docs)
    across = float((gram.sum() - gram.diagonal().sum()) / (d * (d - 1))) if d > 1 else float("nan")
    flat = ys.reshape(-1, ys.shape[-1])
    total = float(((flat - flat.mean(0)) ** 2).sum(-1).mean())
    between = float(((ys.mean(1) - flat.mean(0)) ** 2).sum(-1).mean())
    return {"cos_within": within, "cos_across": across, "between_share": between / total if total > 0 else float("nan"),
            "mean_norm": float(ys.norm(dim=-1).mean())}


def ce_by_position(logits: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Cross-entropy at each position, averaged over the documents (rows)."""
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(0).tolist()


@torch.no_grad()
def baseline_ce(model, docs: list[torch.Tensor], prefix: int, length: int) -> dict[str, list[float]]:
    """The plain transformer's CE at each position after the prefix, without and with the prefix in context."""
    tokens = torch.stack([d[: prefix + length + 1] for d in docs])
    targets = tokens[:, prefix + 1 :]
    return {"no prefix": ce_by_position(model(tokens[:, prefix:-1]), targets),
            "with prefix": ce_by_position(model(tokens[:, :-1])[:, prefix:], targets)}


@torch.no_grad()
def per_position_ce(model, docs: list[torch.Tensor], prefix: int, length: int) -> dict[str, list[float]]:
    """CE at each position of the part after the prefix: frozen y (prefix dropped), dynamic without the prefix,
    dynamic with it."""
    tokens = torch.stack([d[: prefix + length + 1] for d in docs])
    part, targets = tokens[:, prefix:-1], tokens[:, prefix + 1 :]
    y = model.context(tokens[:, :prefix])[:, -1]
    return {"specialised (frozen y, no prefix)": ce_by_position(model(part, y=y), targets),
            "dynamic, no prefix": ce_by_position(model(part), targets),
            "dynamic, with prefix": ce_by_position(model(tokens[:, :-1])[:, prefix:], targets)}
