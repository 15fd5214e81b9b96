"""CGT on text mixtures with known topics (paper sec. 4.4, Fig. 6; offline BBC News + Shakespeare instead of c4).

Trains two CGTs on joined documents (tasks/topic_mixture.py), with and without the element-wise regulariser
(R_C, R_D), and reports:
- y's transition at the join: cosine of n_s = y_s / |y_s| with n just before the join and with n at the end,
  by offset from the join (Fig. 6b), and the <n_s . n_t> map of one sequence;
- t-SNE of y per held-out document (mean over its last 16 tokens), coloured by topic, with and without the
  regulariser (Fig. 6c), plus a 5-nearest-neighbour topic accuracy in y space as a number;
- per-position cross-entropy on the second part of held-out documents: specialised (y frozen after the first
  `prefix` tokens, the prefix dropped), dynamic without the prefix, and dynamic with it (Fig. 6a);
- whether y has collapsed to one direction (then freezing it changes nothing: specialised CE = no-prefix CE):
  the spread of y across documents vs within one (`y_spread`);
- a same-size plain transformer (n_layer layers of width d_x, no y) trained on the same data, with and
  without the prefix, so the CGTs' cross-entropies have a reference.
Reduced scale (4 layers, l = 3, d_x 64, d_y 32, 2048-token BPE, 256-token sequences) by default.

    incontext run cgt-text [--set steps=4000]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..outputs import Result, markdown_table, pyplot
from ..train.cgt_metrics import (baseline_ce, document_embeddings, dot_product_map, join_transition, knn_topic_accuracy,
                                 per_position_ce, y_spread)
from ..train.fresh import train_fresh
from .cgt_plots import dot_map_figure, tsne_figure
from .common import CGTOptions
from .registry import register_experiment


@dataclass
class TextConfig(CGTOptions):
    vocab_size: int = 2048
    seq_len: int = 256
    cut_lo: int = 128
    cut_hi: int = 192
    corpus_docs: int = 0  # documents per topic; 0 = all
    w_c: float = 0.04  # the regularised model; the other has w_c = w_d = 0
    w_d: float = 0.02
    steps: int = 1500
    batch_size: int = 8
    eval_sequences: int = 128
    docs_per_topic: int = 40  # t-SNE
    prefix: int = 64  # tokens read before y is frozen


def settings(config: TextConfig, regularised: bool | None) -> dict:
    """Trainer settings of the regularised / unregularised CGT, or (None) of the same-size plain transformer."""
    model, loss = (config.baseline_model(), {}) if regularised is None else config.cgt_sections(regularised)
    task = {"name": "topic_mixture", "vocab_size": config.vocab_size, "seq_len": config.seq_len,
            "cut_range": [config.cut_lo, config.cut_hi], "max_docs": config.corpus_docs}
    return config.trainer_sections(task, model, loss, eval_sequences=64, eval_batch_size=32)


def documents_per_topic(task, docs: list, n: int) -> list:
    """The first `n` (topic, tokens) documents of each topic, topic by topic."""
    return [d for t in range(len(task.topics)) for d in [d for d in docs if d[0] == t][:n]]


@register_experiment("cgt-text", "CGT text mixtures (BBC News topics + Shakespeare): y at the join, t-SNE, specialised CE", TextConfig)
def run(config: TextConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    models, task = {}, None
    for name, regularised in (("regularised", True), ("unregularised", False)):
        models[name], train_config, _ = train_fresh(out_dir / name, settings(config, regularised))
        task = train_config.build_task()
    baseline, _, _ = train_fresh(out_dir / "baseline", settings(config, None))
    g = torch.Generator().manual_seed(config.seed + 99)
    mixtures = task.mixtures("validation", config.eval_sequences, g)
    docs = task.documents("validation")
    chosen = documents_per_topic(task, docs, config.docs_per_topic)
    length = config.seq_len - config.prefix
    long_docs = [tokens for _, tokens in docs if len(tokens) > config.prefix + length][: config.eval_sequences]

    results, figures = {"topics": list(task.topics), "models": {}}, {}
    with torch.no_grad():
        results["baseline"] = {"parameters": baseline.num_parameters(),
                               "validation_ce": F.cross_entropy(baseline(mixtures.inputs).transpose(1, 2), mixtures.targets).item(),
                               "per_position_ce": baseline_ce(baseline, long_docs, config.prefix, length)}
    for name, model in models.items():
        with torch.no_grad():
            y = model.context(mixtures.inputs)
            dynamic_ce = F.cross_entropy(model(mixtures.inputs).transpose(1, 2), mixtures.targets).item()
        vectors = document_embeddings(model, chosen, config.seq_len)
        labels = [t for t, _ in chosen]
        window = min(48, config.cut_lo - 1, config.seq_len - config.cut_hi - 1)  # every mixture has these offsets
        entry = {"validation_ce": dynamic_ce, "transition": join_transition(y, mixtures.info["join"], window),
                 "knn_topic_accuracy": knn_topic_accuracy(vectors, labels),
                 "per_position_ce": per_position_ce(model, long_docs, config.prefix, length),
                 "y_spread": y_spread(model, chosen, config.seq_len, config.prefix), "parameters": model.num_parameters()}
        results["models"][name] = entry
        title = (f"t-SNE of y per document ({name}); 5-NN topic accuracy "
                 + ("–" if entry["knn_topic_accuracy"] is None else f"{entry['knn_topic_accuracy']:.2f}"))
        topics = [task.topics[t] for t in labels]
        figures[f"tsne_{name}.png"] = lambda r, v=vectors, topics=topics, t=title: tsne_figure(v, topics, t, config.seed)
        join = int(mixtures.info["join"][0])
        figures[f"dot_map_{name}.png"] = lambda r, m=dot_product_map(y[:1]), j=join, name=name: dot_map_figure(
            m, f"<n_s . n_t>, one mixture joined at {j} ({name})", [j])
    return Result(results, tables={"table.md": table}, figures={**figures, "cgt_text.png": plot})


def table(results: dict) -> str:
    c = results["config"]
    lines = [(f"CGT on BBC News + Shakespeare mixtures ({c['n_layer']} layers, l = {c['split_layer']}, d_x {c['d_x']}, "
             f"d_y {c['d_y']}, {c['steps']} steps of {c['batch_size']} x {c['seq_len']} tokens); regularised: w_C "
             f"{c['w_c']}, w_D {c['w_d']}. Per-position CE averaged over the {c['seq_len'] - c['prefix']} tokens after a "
             f"{c['prefix']}-token prefix."), ""]
    rows = []
    for name, m in results["models"].items():
        t = m["transition"]
        after = t["cos_with_before_join"][t["offsets"].index(min(16, t["offsets"][-1]))]
        knn = "–" if m["knn_topic_accuracy"] is None else f"{m['knn_topic_accuracy']:.3f}"
        rows.append([name, f"{m['validation_ce']:.3f}", knn, f"{after:.3f}", *(f"{np.mean(v):.3f}" for v in m["per_position_ce"].values())])
    lines += markdown_table(["model", "validation CE (dynamic)", "5-NN topic accuracy of y", "cos(n, n before join) 16 tokens "
                             "after the join", "CE specialised", "CE dynamic, no prefix", "CE dynamic, with prefix"], rows)
    if "baseline" in results:
        b = results["baseline"]
        no_prefix, with_prefix = (float(np.mean(b["per_position_ce"][k])) for k in ("no prefix", "with prefix"))
        lines.append(f"| plain transformer, same width and depth ({b['parameters']:,} parameters) | {b['validation_ce']:.3f} "
                     f"| | | | {no_prefix:.3f} | {with_prefix:.3f} |")
    spreads = {name: m["y_spread"] for name, m in results["models"].items() if "y_spread" in m}
    if spreads:
        lines += ["", (f"Has y collapsed? Unit directions of y over positions {c['prefix']}..{c['seq_len'] - 1} of "
                       f"{c['docs_per_topic']} held-out documents per topic: mean cosine with the document's own mean "
                       "direction (within), between two documents' mean directions (across), and the share of y's "
                       "variance between documents."), ""]
        lines += markdown_table(["model", "cos within a document", "cos across documents", "between-document share of variance",
                                 "mean norm of y"], [[name, f"{s['cos_within']:.3f}", f"{s['cos_across']:.3f}",
                                                      f"{s['between_share']:.3f}", f"{s['mean_norm']:.2f}"] for name, s in spreads.items()])
    return "\n".join(lines) + "\n"


def plot(results: dict):
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4))
    for name, m in results["models"].items():
        t = m["transition"]
        axes[0].plot(t["offsets"], t["cos_with_before_join"], label=f"{name}: with n before join")
        axes[0].plot(t["offsets"], t["cos_with_end"], ls="--", label=f"{name}: with n at the end")
        ce = m["per_position_ce"]
        smooth = np.ones(8) / 8
        base = np.array(ce["dynamic, no prefix"])
        for label, curve in ce.items():
            if label != "dynamic, no prefix":
                axes[1].plot(np.convolve(np.array(curve) - base, smooth, mode="valid"), label=f"{name}: {label}")
    axes[0].axvline(0, color="gray", lw=0.6)
    axes[0].set(xlabel="offset from the join", ylabel="mean cosine", title="y at the join of two documents")
    axes[0].legend(fontsize=7)
    axes[1].axhline(0, color="gray", lw=0.6)
    axes[1].set(xlabel="position after the prefix", ylabel="CE minus CE of the dynamic model without prefix",
                title="specialised vs dynamic (smoothed over 8)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig
