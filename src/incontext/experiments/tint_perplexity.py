"""TinT Table 2 analogue: language-model perplexity on held-out documents when the first 30/50/70/90% of
each document is used for training inside the forward pass (TinT) or by an explicit SGD step (dynamic
evaluation), next to the plain model (vanilla).

Trains a small GPT-2-style model (learned positions, LayerNorm, tanh-GELU, tied head) on the training plays
of the Shakespeare task through the ordinary trainer. Documents are windows of the held-out plays. For
each fraction f the first round(f T) tokens are the training part; every method predicts the remaining
tokens with the whole document in context (after its update, for dynamic evaluation and TinT). The inner
learning rate (summed loss) of each method is tuned per fraction on separate held-out documents. The
evaluation is the absorb harness on `continuation` episodes of the task's held-out windows (prompt = the
training part): keep-prompt is vanilla, dynamic-eval and tint run with keep_prompt=True; the first token after
the training part is not scored (a query's first input is that token).
Paper (WikiText-103, GPT-2): vanilla 25.6/24.9/24.5/23.3, dynamic eval 24.9/24.0/23.5/22.2, TinT
25.1/24.3/23.8/22.6.

TinT's step updates a subset of the parameters (W_V, b_V, the attention output, the MLP, LayerNorm biases;
W_Q, W_K, the gains, positions and the tied embedding frozen). The subset table (`subset_table`) measures how
much of dynamic evaluation's gain that choice costs: exact SGD (dynamic evaluation with `params=`) on TinT's
subset, and on it plus one frozen group at a time, each with its own inner learning rate tuned like the others.
Every row is reported as its share of dynamic evaluation's gain (the drop of the summed held-out cross-entropy
from vanilla), with a 95% bootstrap interval over the documents (resampled jointly for all rows and fractions).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..harness.compare import compare
from ..outputs import Result, markdown_table
from ..tasks.episodes import get_episode_source
from ..tint import TinT, TintConfig
from ..tint.reference import compare_with_exact
from ..train.fresh import train_fresh
from .common import GPT2_ADAMW, GPT2_BLOCK, TrainedModelOptions
from .registry import register_experiment

METHODS = {"dynamic eval": "dynamic-eval", "TinT": "tint"}  # table row -> absorb method
# subset table row -> dynamic evaluation's `params` (exact SGD on those parameter groups only)
SUBSETS = {
    "TinT's subset, exact SGD (R-exact)": "tint",
    "+ token embedding (tied: input and head)": "tint,embeddings",
    "+ LM head (untied copy)": "tint,head",
    "+ input embedding (untied copy)": "tint,input_embedding",
    "+ W_Q, W_K": "tint,qk",
    "+ LayerNorm gains": "tint,ln_gain",
    "+ positions": "tint,positions",
    "all but the token embedding": "tint,qk,ln_gain,positions",
    "token embedding only (tied)": "embeddings",
}
PAPER_GPT2 = {"vanilla": [25.6, 24.9, 24.5, 23.3], "dynamic eval": [24.9, 24.0, 23.5, 22.2], "TinT": [25.1, 24.3, 23.8, 22.6]}


@dataclass
class PerplexityConfig(TrainedModelOptions):
    d_model: int = 96  # divisible by the shards (3); K = d_model / 3 <= head size d_model / 3
    vocab_size: int = 2048
    seq_len: int = 128  # document length
    fractions: list[float] = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9])
    documents: int = 64  # held-out documents evaluated
    tune_documents: int = 16  # other held-out documents for the inner learning rate
    inner_lrs: list[float] = field(default_factory=lambda: [3e-5, 1e-4, 2e-4, 5e-4, 1e-3])
    n_simulation_layers: int | None = None  # None: all layers (as dynamic evaluation's step)
    exact_documents: int = 8  # documents on which TinT's step is compared with exact SGD (R-exact)
    subset_table: bool = True  # exact SGD on TinT's parameter subset and on it plus each frozen group
    bootstrap: int = 2000  # resamples of the documents for the intervals of the gain shares


def method_options(method: str, lr: float, config: PerplexityConfig) -> dict:
    """Absorb options of a row: one step of the summed loss on the training part, which stays in the context."""
    if method == "dynamic eval":
        return {"learning_rate": lr, "keep_prompt": True}
    if method in SUBSETS:
        return {"learning_rate": lr, "keep_prompt": True, "params": SUBSETS[method]}
    return {"learning_rate": lr, "n_simulation_layers": config.n_simulation_layers, "keep_prompt": True}


def perplexity(row: dict) -> float:
    mean = row["score_pooled"] if row["status"] == "ok" else math.inf  # CE over all scored tokens of all documents
    return math.exp(mean) if math.isfinite(mean) else math.inf


@register_experiment("tint-perplexity", "TinT Table 2 analogue: held-out perplexity, vanilla vs dynamic eval vs TinT", PerplexityConfig)
def run(config: PerplexityConfig, out_dir: Path) -> Result:
    start = time.perf_counter()
    task = {"name": "shakespeare", "vocab_size": config.vocab_size, "seq_len": config.seq_len}
    model, train_config, trained = train_fresh(out_dir, config.train_config(
        task, model=GPT2_BLOCK, optimizer=GPT2_ADAMW, warmup_steps=min(100, config.steps)))
    train_seconds = time.perf_counter() - start
    model = model.double().eval()  # float64: the finite-difference backward of TinT is exact to rounding
    task = train_config.build_task()
    by_method: dict[str, list[float]] = {"vanilla": [], "dynamic eval": [], "TinT": []}
    without_context: list[float] = []
    methods = {**METHODS, **({row: f"dynamic-eval:{params}" for row, params in SUBSETS.items()} if config.subset_table else {})}
    chosen: dict[str, list[float]] = {method: [] for method in methods}
    tuning: dict[str, dict] = {method: {} for method in methods}
    subset_perplexity: dict[str, list[float]] = {row: [] for row in methods if row in SUBSETS}
    losses: dict[str, list[list[float]]] = {row: [] for row in ["vanilla", *methods]}  # per fraction, per document
    for fraction in config.fractions:
        n_train = max(2, round(fraction * config.seq_len))
        source = get_episode_source("continuation", prompt_tokens=n_train, query_tokens=config.seq_len - n_train, passages="task")
        # the same held-out windows for every fraction: the first tune_documents choose the learning rates
        windows = source.episodes(config.tune_documents + config.documents, config.seed + 11, task=task)
        tune, documents = windows[: config.tune_documents], windows[config.tune_documents :]
        chosen_options = {}
        for method, name in methods.items():
            rows = compare(model, source, tune, {f"{name}:lr={lr}": method_options(method, lr, config) for lr in config.inner_lrs},
                           references=False, progress=False)
            scores = {lr: perplexity(row) for lr, row in zip(config.inner_lrs, rows)}
            best = min(scores, key=scores.get)
            tuning[method][str(fraction)] = {str(lr): s for lr, s in scores.items()}
            chosen[method].append(best)
            chosen_options[name] = method_options(method, best, config)
        rows = {row["method"]: row for row in compare(model, source, documents, chosen_options, progress=False, per_episode=True)}
        by_method["vanilla"].append(perplexity(rows["keep-prompt"]))
        without_context.append(perplexity(rows["drop-prompt"]))
        for method, name in methods.items():
            (by_method if method in METHODS else subset_perplexity)[method].append(perplexity(rows[name]))
        for row, name in {"vanilla": "keep-prompt", **methods}.items():
            losses[row].append(document_losses(rows[name], config.documents))
    g = torch.Generator().manual_seed(config.seed + 11)
    documents = task.validation_windows(config.documents + config.tune_documents, g)[config.tune_documents :, : config.seq_len]
    exact = against_exact(model, documents[: config.exact_documents], config, chosen["TinT"])
    results = {"parameters": model.num_parameters(), "train_eval": trained.get("eval"), "train_seconds": round(train_seconds, 1),
               "total_seconds": round(time.perf_counter() - start, 1), "perplexity": by_method,
               "perplexity_without_context": without_context,
               "inner_learning_rate": chosen, "tuning_perplexity": tuning, "vs_r_exact": exact,
               "paper_gpt2_wikitext103": PAPER_GPT2, "subset_perplexity": subset_perplexity,
               "subset_params": {row: SUBSETS[row] for row in subset_perplexity},
               "gain_share": gain_shares(losses, config)}
    return Result(results, {"table.md": lambda r: table(r, config)})


def table(results: dict, config: PerplexityConfig) -> str:
    by_method, chosen, exact = results["perplexity"], results["inner_learning_rate"], results["vs_r_exact"]
    fracs = [f"{round(100 * f)}%" for f in config.fractions]
    lines = [(f"Held-out perplexity, {config.documents} documents of {config.seq_len} tokens (Shakespeare plays held out), "
             f"GPT-2-style model with {config.n_layer} layers, width {config.d_model}, {results['parameters']:,} parameters; "
             "inner learning rate (summed loss) tuned per fraction on "
             f"{config.tune_documents} other documents."), ""]
    lines += markdown_table(["method", *fracs, "paper (GPT-2, WikiText-103)"], [
        [method + ("" if method == "vanilla" else " (lr " + ", ".join(f"{x:g}" for x in chosen[method]) + ")"),
         *(f"{v:.2f}" for v in values), " / ".join(str(p) for p in PAPER_GPT2[method])] for method, values in by_method.items()])
    lines += ["", "Without the document's training part in the context (drop-prompt): "
              + ", ".join(f"{v:.2f}" for v in results["perplexity_without_context"]) + "."]
    lines += ["", "Share of dynamic evaluation's gain (drop of the held-out cross-entropy from vanilla, summed over the "
              f"{config.documents} documents), % [95% bootstrap interval, {config.bootstrap} resamples of the documents]; "
              "rows below TinT: exact SGD on the parameter groups named (dynamic evaluation with `params=`), inner "
              "learning rate tuned per fraction like the others:", ""]
    params = results["subset_params"]
    lines += markdown_table(["row (params; lr)", *fracs, "all fractions"], [
        [f"{row} (`{params[row]}`; lr " + ", ".join(f"{x:g}" for x in chosen[row]) + ")" if row in params else row,
         *(percent(s) for s in share["per_fraction"]), percent(share["pooled"])] for row, share in results["gain_share"].items()])
    lines += ["", f"TinT's step vs exact SGD on the same parameters (R-exact), mean over {config.exact_documents} documents:", ""]
    lines += markdown_table(["fraction", "TinT lr", "logits rel. gap", "update cosine", "update norm ratio",
                             "held-out loss before / TinT / exact"], [
        [fraction, f"{r['learning_rate']:g}", f"{r['logits_rel_gap']:.2e}", f"{r['update_cosine']:.5f}", f"{r['update_norm_ratio']:.4f}",
         f"{r['heldout_loss_before']:.4f} / {r['heldout_loss_tint']:.4f} / {r['heldout_loss_exact']:.4f}"] for fraction, r in exact.items()])
    return "\n".join(lines) + "\n"


def document_losses(row: dict, n_documents: int) -> list[float]:
    """Each document's summed cross-entropy over its scored tokens (a harness row with per-episode scores)."""
    if row["status"] != "ok" or len(row["episode_scores"]) != n_documents:
        raise RuntimeError(f"{row['method']} did not run on every document: {row.get('reason') or row.get('first_error')}")
    return [s["score"] * n for s, n in zip(row["episode_scores"], row["episode_positions"])]


def gain_shares(losses: dict[str, list[list[float]]], config: PerplexityConfig) -> dict[str, dict]:
    """Per row (every method but vanilla and dynamic eval): (vanilla - row) / (vanilla - dynamic eval) of the
    held-out cross-entropy summed over documents, per fraction and over all fractions, with 95% percentile
    intervals from resampling the documents (the same resample for every row and fraction: paired)."""
    vanilla, dynamic = torch.tensor(losses["vanilla"], dtype=torch.float64), torch.tensor(losses["dynamic eval"], dtype=torch.float64)
    n = vanilla.shape[1]
    draws = torch.randint(0, n, (config.bootstrap, n), generator=torch.Generator().manual_seed(config.seed + 12))

    def share(method: torch.Tensor, docs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        v, d, m = ((x if docs is None else x[:, docs]).sum(-1) for x in (vanilla, dynamic, method))  # (F,) or (F, B)
        return (v - m) / (v - d), (v - m).sum(0) / (v - d).sum(0)

    report = {}
    for row, values in losses.items():
        if row in ("vanilla", "dynamic eval"):
            continue
        method = torch.tensor(values, dtype=torch.float64)
        point, boot = share(method, None), share(method, draws)
        summary = [{"share": float(p), "low": float(b.quantile(0.025)), "high": float(b.quantile(0.975))}
                   for p, b in zip([*point[0], point[1]], [*boot[0], boot[1]])]
        report[row] = {"per_fraction": summary[:-1], "pooled": summary[-1]}
    return report


def percent(share: dict) -> str:
    return f"{100 * share['share']:.0f} [{100 * share['low']:.0f}, {100 * share['high']:.0f}]"


def against_exact(model, documents: torch.Tensor, config: PerplexityConfig, learning_rates: list[float]) -> dict:
    """Per fraction: TinT's step (its tuned learning rate) against R-exact, averaged over documents."""
    report = {}
    for fraction, lr in zip(config.fractions, learning_rates):
        tint_config = TintConfig(learning_rate=lr, n_simulation_layers=config.n_simulation_layers)
        rows = []
        for ids in documents:
            n_train = max(2, round(fraction * ids.shape[0]))
            sim = TinT(model, tint_config)
            with torch.no_grad():
                logits, banks, _ = sim.simulate(ids, n_train)
            state = {**model.state_dict(), **sim.read_weights(banks)}
            rows.append(compare_with_exact(model, ids, n_train, tint_config, logits, state))
        report[str(fraction)] = {"learning_rate": lr, **{k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}}
    return report
