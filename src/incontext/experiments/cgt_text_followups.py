"""Three studies on cgt-text's data: two of its trained CGT (the regulariser on; cgt-text's settings, trained again into <out>/regularised,
or reused there when trained to its end with the same settings):

- cgt-moving-average (paper App. C, Fig. 14): on the second part of held-out documents, the per-position
  cross-entropy of the "informed" model, whose y starts at the y computed at the end of the first part and then
  follows the y computed on the second part as a moving average, y_used_i = (1 - gamma) y_used_(i-1) + gamma y_i
  (gamma = 1/300), against the "uninformed" dynamic model reading the second part alone, and beside y frozen
  (cgt-text's specialised model) and the whole document read. The paper: the informed model is better across the
  whole sequence (the difference below zero everywhere), where the frozen y falls behind after ~200 tokens.
- cgt-three-excerpts (paper App. B.4, Fig. 13b): y along sequences of three excerpts of different topics (the model
  trained on two), the <n_s . n_t> map, and at each boundary the first offset where n is closer to the new
  excerpt's last direction than to the direction just before the boundary (the paper's plot: ~10-20 tokens).

- cgt-vae (App. A.1 / D.4, Figs 17-20): the VAE variant (y ~ N(mu, sigma^2), the GP prior's KL weighted by beta)
  trained at several beta: y's smoothness along the sequence, its switch at the boundaries of three excerpts and
  its topic accuracy (the paper: larger beta, smoother y).

    incontext run cgt-moving-average [--set gamma=0.01]
    incontext run cgt-vae [--set "betas=[1, 10]"]
    incontext run cgt-three-excerpts [--set model_from=results/cgt-moving-average]   # its CGT, not trained again
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..outputs import Result, markdown_table, pyplot
from ..train.cgt_metrics import (ce_by_position, document_embeddings, dot_product_map, knn_topic_accuracy,
                                 per_position_ce, unit_rows)
from ..config import merge
from ..train import latest_checkpoint, load_for_eval
from ..train.config import config_from_dict
from ..train.fresh import finished_training, train_fresh
from .cgt_plots import dot_map_figure
from .cgt_text import TextConfig, documents_per_topic, settings
from .registry import register_experiment


@dataclass
class MovingAverageConfig(TextConfig):
    gamma: float = 1 / 300  # the moving average's rate (the paper's)

    def __post_init__(self):
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")


def moving_average(y_init: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T, d): y_used_i = (1 - gamma) y_used_(i-1) + gamma y_i, y_used_(-1) = y_init (B, d)."""
    used, out = y_init, []
    for i in range(y.shape[1]):
        used = (1 - gamma) * used + gamma * y[:, i]
        out.append(used)
    return torch.stack(out, 1)


def trained_cgt(config: TextConfig, out_dir: Path, model_from: str = ""):
    """cgt-text's regularised CGT: trained into out_dir/regularised (reused there when trained to its end with the
    same settings), or read from `model_from`/regularised, another study's, which must hold it finished."""
    if model_from:
        train_dir = Path(model_from) / "regularised" / "train"
        wanted = config_from_dict(merge(settings(config, True), {"run": {"out_dir": str(train_dir)}}))
        if finished_training(train_dir, wanted) is None:
            raise ValueError(f"{train_dir} holds no finished training of these settings: train it there first "
                             "(incontext run cgt-moving-average with the same settings), or leave model_from empty")
        model, train_config = load_for_eval(latest_checkpoint(train_dir))
        return model, train_config.build_task()
    model, train_config, _ = train_fresh(out_dir / "regularised", settings(config, True), reuse=True)
    return model, train_config.build_task()


def held_out_documents(task, config: TextConfig) -> list[torch.Tensor]:
    length = config.seq_len - config.prefix
    return [tokens for _, tokens in task.documents("validation") if len(tokens) > config.prefix + length][: config.eval_sequences]


@register_experiment("cgt-moving-average", "CGT App. C, Fig. 14: y kept as a moving average of the second part's y "
                     "(informed) vs dynamic y without the first part", MovingAverageConfig)
def run_moving_average(config: MovingAverageConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    model, task = trained_cgt(config, out_dir)
    docs = held_out_documents(task, config)
    length = config.seq_len - config.prefix
    tokens = torch.stack([d[: config.prefix + length + 1] for d in docs])
    part, targets = tokens[:, config.prefix:-1], tokens[:, config.prefix + 1:]
    with torch.no_grad():
        curves = per_position_ce(model, docs, config.prefix, length)
        y_init = model.context(tokens[:, :config.prefix])[:, -1]
        informed = moving_average(y_init, model.context(part), config.gamma)
        curves[f"informed (moving average, gamma {config.gamma:.4g})"] = ce_by_position(model(part, y=informed), targets)
    uninformed = np.array(curves["dynamic, no prefix"])
    results = {"documents": len(docs), "prefix": config.prefix, "length": length, "curves": curves,
               "difference_vs_uninformed": {name: (np.array(c) - uninformed).tolist() for name, c in curves.items()
                                            if name != "dynamic, no prefix"},
               "paper": "informed minus uninformed below zero across the whole sequence (Fig. 14, c4, ~1000 tokens)"}
    return Result(results, tables={"table.md": lambda r: moving_average_table(r, config)},
                  figures={"moving_average.png": plot_moving_average})


def _thirds(values: list[float]) -> list[float]:
    parts = np.array_split(np.array(values), 3)
    return [float(p.mean()) for p in parts]


def moving_average_table(results: dict, config: MovingAverageConfig) -> str:
    rows = []
    for name, diff in results["difference_vs_uninformed"].items():
        below = float(np.mean(np.array(diff) < 0))
        rows.append([name, f"{np.mean(results['curves'][name]):.3f}", f"{np.mean(diff):+.3f}",
                     *(f"{v:+.3f}" for v in _thirds(diff)), f"{100 * below:.0f}%"])
    head = (f"cgt-text's regularised CGT ({config.n_layer} layers, d_x {config.d_x}, d_y {config.d_y}, {config.steps} "
            f"steps) on {results['documents']} held-out documents: the {results['length']} tokens after a "
            f"{results['prefix']}-token first part; uninformed (dynamic y, the first part dropped) CE "
            f"{np.mean(results['curves']['dynamic, no prefix']):.3f}. Paper (c4, Fig. 14): the informed model's difference "
            "is below zero across the whole sequence.")
    return "\n".join([head, "", *markdown_table(
        ["model", "mean CE", "minus uninformed", "first third", "second third", "last third", "positions below zero"],
        rows)])


def plot_moving_average(results: dict):
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for name, diff in results["difference_vs_uninformed"].items():
        smooth = np.convolve(diff, np.ones(8) / 8, mode="valid")
        ax.plot(np.arange(len(smooth)) + 4, smooth, label=name, lw=1.2)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set(xlabel="position after the first part", ylabel="CE minus uninformed (nats, smoothed over 8)",
           title="y frozen, or kept as a moving average, against dynamic y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- three excerpts


@dataclass
class ThreeExcerptsConfig(TextConfig):
    sequences: int = 64  # sequences of three excerpts (three different topics)
    model_from: str = ""  # a cgt-moving-average output folder whose CGT (same settings) to read instead of training


def three_excerpts(task, n: int, seq_len: int, generator: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    """n sequences of seq_len tokens: three held-out excerpts of three different topics, seq_len // 3 tokens each
    (the last takes the rest); and the two boundaries."""
    cut = seq_len // 3
    by_topic: dict[int, list[torch.Tensor]] = {}
    for topic, tokens in task.documents("validation"):
        if len(tokens) >= seq_len - 2 * cut:
            by_topic.setdefault(topic, []).append(tokens)
    topics = [t for t, docs in by_topic.items() if docs]
    if len(topics) < 3:
        raise ValueError(f"three excerpts need held-out documents of three topics, found {len(topics)}")
    rows = []
    for _ in range(n):
        chosen = [topics[i] for i in torch.randperm(len(topics), generator=generator)[:3].tolist()]
        docs = [by_topic[t][int(torch.randint(len(by_topic[t]), (1,), generator=generator))] for t in chosen]
        rows.append(torch.cat([docs[0][:cut], docs[1][:cut], docs[2][: seq_len - 2 * cut]]))
    return torch.stack(rows), [cut, 2 * cut]


def switch_offset(y: torch.Tensor, start: int, end: int) -> list[int | None]:
    """Per sequence: the first offset d >= 0 from `start` at which n_(start+d) is closer (cosine) to n_(end-1), the
    excerpt's last direction, than to n_(start-1), the direction before the boundary; None when it never is."""
    n = unit_rows(y)
    found = []
    for b in range(y.shape[0]):
        before, last = n[b, start - 1], n[b, end - 1]
        closer = [int(d) for d in range(end - start) if float(n[b, start + d] @ last) > float(n[b, start + d] @ before)]
        found.append(closer[0] if closer else None)
    return found


@register_experiment("cgt-three-excerpts", "CGT App. B.4, Fig. 13b: y along three joined excerpts of different topics, "
                     "the tokens y takes to switch at each boundary", ThreeExcerptsConfig)
def run_three_excerpts(config: ThreeExcerptsConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    model, task = trained_cgt(config, out_dir, config.model_from)
    inputs, bounds = three_excerpts(task, config.sequences, config.seq_len, torch.Generator().manual_seed(config.seed + 77))
    with torch.no_grad():
        y = model.context(inputs)
    ends = [*bounds[1:], config.seq_len]
    offsets = {f"boundary at {s}": switch_offset(y, s, e) for s, e in zip(bounds, ends)}
    summary = {}
    for name, values in offsets.items():
        seen = [v for v in values if v is not None]
        summary[name] = {"median": float(np.median(seen)) if seen else None,
                         "quartiles": [float(np.percentile(seen, 25)), float(np.percentile(seen, 75))] if seen else None,
                         "never": len(values) - len(seen)}
    results = {"sequences": config.sequences, "boundaries": bounds, "offsets": offsets, "summary": summary,
               "paper": "y switches within ~10-20 tokens of a boundary (Fig. 13b, read off the plot)"}
    matrix = dot_product_map(y)
    return Result(results, tables={"table.md": lambda r: three_table(r, config)},
                  figures={"dot_map_three.png": lambda r: dot_map_figure(
                      matrix, f"<n_s . n_t>, mean over {config.sequences} sequences of three excerpts", bounds)})


def three_table(results: dict, config: ThreeExcerptsConfig) -> str:
    rows = [[name, "-" if s["median"] is None else f"{s['median']:.0f}",
             "-" if s["quartiles"] is None else f"{s['quartiles'][0]:.0f}-{s['quartiles'][1]:.0f}", s["never"]]
            for name, s in results["summary"].items()]
    head = (f"cgt-text's regularised CGT ({config.n_layer} layers, d_y {config.d_y}, {config.steps} steps, trained on two "
            f"excerpts) on {results['sequences']} sequences of three held-out excerpts of three topics "
            f"({config.seq_len} tokens). Tokens after a boundary until n is closer to the new excerpt's last direction "
            "than to the one before the boundary; paper (Fig. 13b): ~10-20.")
    return "\n".join([head, "", *markdown_table(["boundary", "median tokens", "quartiles", "never switched"], rows)])


# ----------------------------------------------------------------------------- the VAE variant


@dataclass
class VAEConfig(ThreeExcerptsConfig):
    betas: list[float] = field(default_factory=lambda: [1.0, 3.0, 10.0])  # Figs 18-20's
    prior_nugget: float = 0.1  # nu of the GP prior (the paper's for text)
    prior_length: float = 0.1  # lambda, a fraction of the sequence (the paper's)
    docs_per_topic: int = 40

    def __post_init__(self):
        if not self.betas or any(b <= 0 for b in self.betas):
            raise ValueError(f"betas must be positive, got {self.betas}")


def vae_settings(config: VAEConfig, beta: float) -> dict:
    """cgt-text's regularised CGT as a VAE (y ~ N(mu, sigma^2), App. A.1) with the GP prior's KL weighted by beta; the
    element-wise regulariser off (the VAE's prior takes its place)."""
    base = settings(config, False)
    base["model"]["vae"] = True
    base["loss"].update({"beta": beta, "prior": "rbf", "prior_nugget": config.prior_nugget,
                         "prior_length": config.prior_length})
    return base


def spectrum_low_share(y: torch.Tensor, share: float = 0.1) -> float:
    """Fig. 17's measure as one number: of the power of y's components along the sequence (each centred, DFT over
    positions, averaged over sequences and components), the share in the lowest `share` of the frequencies."""
    centred = y - y.mean(1, keepdim=True)
    power = torch.fft.rfft(centred.double(), dim=1).abs().square().mean((0, 2))[1:]
    keep = max(1, int(round(share * len(power))))
    return float(power[:keep].sum() / power.sum())


@register_experiment("cgt-vae", "CGT App. A.1 / D.4, Figs 17-20: the VAE variant with the GP prior at several beta: "
                     "y's smoothness, its switch at boundaries, topic accuracy", VAEConfig)
def run_vae(config: VAEConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, figures = [], {}
    for beta in config.betas:
        model, train_config, trained = train_fresh(out_dir / f"beta{beta:g}", vae_settings(config, beta), reuse=True)
        task = train_config.build_task()
        inputs, bounds = three_excerpts(task, config.sequences, config.seq_len, torch.Generator().manual_seed(config.seed + 77))
        chosen = documents_per_topic(task, task.documents("validation"), config.docs_per_topic)
        with torch.no_grad():
            y = model.context(inputs)  # the posterior means (the VAE's y at evaluation)
            offsets = [v for s, e in zip(bounds, [*bounds[1:], config.seq_len]) for v in switch_offset(y, s, e)]
        seen = [v for v in offsets if v is not None]
        vectors = document_embeddings(model, chosen, config.seq_len)
        rows.append({"beta": beta, "validation_ce": trained["eval"].get("loss") if "eval" in trained else None,
                     "low_frequency_share": spectrum_low_share(y),
                     "switch_median": float(np.median(seen)) if seen else None, "never_switched": len(offsets) - len(seen),
                     "knn_topic_accuracy": knn_topic_accuracy(vectors, [t for t, _ in chosen])})
        figures[f"dot_map_beta{beta:g}.png"] = lambda r, m=dot_product_map(y), b=beta: dot_map_figure(
            m, f"<n_s . n_t>, three excerpts, VAE beta {b:g}", bounds)
    results = {"runs": rows, "paper": "larger beta: smoother y (more power at low frequencies, Fig. 17), slower "
               "switches at boundaries (Figs 18, 20), topics still separated (Fig. 19); c4, plots only"}
    return Result(results, tables={"table.md": lambda r: vae_table(r, config)}, figures=figures)


def vae_table(results: dict, config: VAEConfig) -> str:
    rows = [[f"{r['beta']:g}", "-" if r["validation_ce"] is None else f"{r['validation_ce']:.3f}",
             f"{r['low_frequency_share']:.3f}", "-" if r["switch_median"] is None else f"{r['switch_median']:.0f}",
             r["never_switched"], "-" if r["knn_topic_accuracy"] is None else f"{r['knn_topic_accuracy']:.3f}"]
            for r in results["runs"]]
    head = (f"The VAE variant of cgt-text's CGT ({config.n_layer} layers, d_y {config.d_y}, {config.steps} steps, GP prior "
            f"nu {config.prior_nugget:g}, lambda {config.prior_length:g} of the sequence), one per beta. Low-frequency "
            "share: of y's power along the sequence, the share in the lowest tenth of the frequencies; switch: median "
            f"tokens after a boundary of {config.sequences} three-excerpt sequences (cgt-three-excerpts' measure).")
    return "\n".join([head, "", *markdown_table(["beta", "validation loss", "low-frequency share of y's power",
                                                 "switch (median tokens)", "never switched", "5-NN topic accuracy of y"], rows)])
