"""Burns et al. sec. 4 at reduced scale: classic vs residual-V-stream small language models, probed for ICL.

Trains GPT-2-style transformers (pre-LN, learned positions, GELU MLP x4, tied head, dropout 0.1, no
1/sqrt(d_head) attention scaling, Adam lr 1e-3 betas (0.9, 0.95)) of each variant with the same seeds on the
"stories" task (procedurally generated children's stories, an offline stand-in for TinyStories), each through
the ordinary trainer, then evaluates every model in its own architecture, in eval mode:

- validation loss on new stories;
- IOI: probability of the indirect object (correct) and of the subject (incorrect) as the next word, and their
  log-probability difference (= logit difference for one-token names), both name orders, on the paper's four
  prompts, on many prompts with training names and on prompts with HELD-OUT names never seen in training;
  a name's probability is that of all of its tokens (one token for every training name);
- in-context loss score: mean loss late in the context minus early (negative = the context helps), on stories
  with held-out names, each window a story from its start;
- induction: accuracy of predicting the second copy of a repeated sequence of random tokens.

Paper (TinyStories, hidden 256, 8 layers, 3 seeds): validation loss 1.56 vs 1.55; IOI correct 7.2% vs 41.0%,
incorrect 5.1% vs 3.2% (classic vs residual V).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..outputs import Result, earlier_results, markdown_table, pyplot, save_result
from ..stats import mean_std
from ..tasks.stories import PAPER_IOI_PROMPTS
from ..train.config import TrainConfig
from ..train.fresh import train_fresh
from ..train.lm_probes import probe_checkpoints, probe_model
from ..train.metrics import read_metrics
from .common import TransformerOptions, WarmupOption
from .registry import register_experiment

PAPER = {  # Burns et al., Table 2 and sec. 4 (percent; classic, residual V)
    "ioi_correct": {"none": 7.2, "v": 41.0},
    "ioi_incorrect": {"none": 5.1, "v": 3.2},
    "validation_loss": {"none": 1.56, "v": 1.55},
    "sentence_correct": {"none": [11.73, 11.88, 3.83, 1.54], "v": [42.89, 43.44, 49.24, 28.56]},
    "sentence_incorrect": {"none": [6.93, 7.99, 0.51, 4.86], "v": [5.68, 6.8, 0.03, 0.18]},
}
VARIANT_NAMES = {"none": "classic", "v": "residual V", "q": "residual Q", "k": "residual K", "value_residual": "value residual"}


@dataclass
class ResidualLMConfig(WarmupOption, TransformerOptions):  # one model per variant and seed: no `seed` option
    variants: list[str] = field(default_factory=lambda: ["none", "v"])  # TransformerConfig.residual_stream values
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    n_head: int = 8  # head_dim 16, as in the paper (256 / 16)
    dropout: float = 0.1
    attn_dropout: float = 0.1
    vocab_size: int = 1024
    seq_len: int = 64
    train_stories: int = 50000
    corpus_seed: int = 0
    steps: int = 1000
    lr: float = 1e-3
    ioi_pairs: int = 100  # random name pairs per IOI group (training names / held-out names), both orders
    eval_windows: int = 1024
    icl_stories: int = 256
    icl_early: list[int] = field(default_factory=lambda: [4, 12])  # positions [start, end) of the early mean
    icl_late: list[int] = field(default_factory=lambda: [48, 63])
    induction_sequences: int = 256
    probe_every: int = 250  # steps between checkpoints probed for IOI / induction during training; 0 = final only
    threads: int = 1
    # keep the runs of other seeds already in <out>/results.json (same settings otherwise) and add these seeds:
    # a study can grow one seed per process, e.g. --set seeds=[2] --set add_to_existing=true
    add_to_existing: bool = False

    def __post_init__(self):
        super().__post_init__()
        unknown = [v for v in self.variants if v not in VARIANT_NAMES]
        if unknown or not self.variants:
            raise ValueError(f"variants must be residual_stream values from {sorted(VARIANT_NAMES)}, got {self.variants}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.probe_every < 0:
            raise ValueError(f"probe_every must be >= 0 (0 = probe the final model only), got {self.probe_every}")
        for name in ("icl_early", "icl_late"):
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi <= self.seq_len:
                raise ValueError(f"{name}={getattr(self, name)} must be [start, end) with 0 <= start < end <= seq_len")


def train_settings(config: ResidualLMConfig, variant: str, seed: int) -> TrainConfig:
    return config.train_config(
        {"name": "stories", "vocab_size": config.vocab_size, "seq_len": config.seq_len,
         "train_stories": config.train_stories, "seed": config.corpus_seed}, seed=seed,
        model={"positions": "learned", "norm": "layernorm", "mlp": "gelu", "tie_embeddings": True, "scale_attn": False,
               "dropout": config.dropout, "attn_dropout": config.attn_dropout, "residual_stream": variant},
        optimizer={"name": "adamw", "weight_decay": 0.0, "betas": (0.9, 0.95)},  # = Adam
        warmup_steps=config.warmup_steps, schedule={"kind": "constant"}, checkpoint_every=config.probe_every,
        keep_checkpoints=config.steps // max(config.probe_every, 1) + 1, device="cpu", threads=config.threads,
        tensorboard=False)


# Rows of the summary: (label, path into a run's results, scale, format)
SUMMARY_ROWS = (
    ("validation loss", ("validation_loss",), 1, ".3f"),
    ("IOI paper prompts: P(correct) %", ("ioi", "paper", "correct"), 1, ".1f"),
    ("IOI paper prompts: P(incorrect) %", ("ioi", "paper", "incorrect"), 1, ".1f"),
    ("IOI paper prompts: logit diff", ("ioi", "paper", "logit_diff"), 1, ".2f"),
    ("IOI training names: P(correct) %", ("ioi", "train names", "correct"), 1, ".1f"),
    ("IOI training names: P(incorrect) %", ("ioi", "train names", "incorrect"), 1, ".1f"),
    ("IOI training names: logit diff", ("ioi", "train names", "logit_diff"), 1, ".2f"),
    ("IOI held-out names: P(correct) %", ("ioi", "held-out names", "correct"), 1, ".1f"),
    ("IOI held-out names: P(incorrect) %", ("ioi", "held-out names", "incorrect"), 1, ".1f"),
    ("IOI held-out names: log-prob diff", ("ioi", "held-out names", "logit_diff"), 1, ".2f"),
    ("IOI held-out names: accuracy", ("ioi", "held-out names", "accuracy"), 1, ".2f"),
    ("in-context loss score (late - early)", ("in_context_score",), 1, ".3f"),
    ("induction accuracy (repeated random tokens)", ("induction", "accuracy"), 1, ".3f"),
    ("training time per model (s)", ("train_seconds",), 1, ".0f"),
)
PAPER_ROWS = {"validation loss": "validation_loss", "IOI paper prompts: P(correct) %": "ioi_correct",
              "IOI paper prompts: P(incorrect) %": "ioi_incorrect"}


def _get(run: dict, path: tuple[str, ...]) -> float:
    for key in path:
        run = run[key]
    return float(run)


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, list[float]]]:
    """{variant: {row label: [mean, std]}} over seeds."""
    return {variant: {label: list(mean_std([_get(r, path) * scale for r in seed_runs]))
                      for label, path, scale, _ in SUMMARY_ROWS}
            for variant, seed_runs in runs.items()}


def table(config: ResidualLMConfig, runs: dict[str, list[dict]], summary: dict, parameters: int,
          curves: dict[str, list[list[tuple[int, float]]]] | None = None) -> str:
    variants = list(runs)
    intro = (f"GPT-2-style LMs on the procedurally generated stories (offline stand-in for TinyStories): {config.n_layer} "
             f"layers, width {config.d_model}, {config.n_head} heads, {parameters:,} parameters, T = {config.seq_len}, "
             f"vocab {config.vocab_size}, {config.steps} steps of batch {config.batch_size}; mean +- std (population) over "
             f"seeds {[r['seed'] for r in runs[variants[0]]]}. Paper: TinyStories, width 256, 8 layers, 3 seeds.")
    paper_variants = [v for v in variants if v in PAPER["ioi_correct"]]
    names = [VARIANT_NAMES[v] for v in variants] + [f"paper {VARIANT_NAMES[v]}" for v in paper_variants]
    rows = [[label, *(f"{summary[v][label][0]:{fmt}} +- {summary[v][label][1]:{fmt}}" for v in variants),
             *(f"{PAPER[PAPER_ROWS[label]][v]}" if label in PAPER_ROWS else "" for v in paper_variants)]
            for label, _, _, fmt in SUMMARY_ROWS]
    lines = [intro, "", *markdown_table(["metric", *names], rows), "",
             "Per paper sentence (both name orders), P(correct) / P(incorrect) in %, ours vs paper Table 2:", ""]
    rows = []
    for i in range(1, len(PAPER_IOI_PROMPTS) + 1):
        cells = []
        for v in variants:
            c = mean_std([r["ioi"][f"paper {i}"]["correct"] for r in runs[v]])
            w = mean_std([r["ioi"][f"paper {i}"]["incorrect"] for r in runs[v]])
            cells.append(f"{c[0]:.1f} +- {c[1]:.1f} / {w[0]:.1f} +- {w[1]:.1f}")
        cells += [f"{PAPER['sentence_correct'][v][i - 1]} / {PAPER['sentence_incorrect'][v][i - 1]}" for v in paper_variants]
        rows.append([f"{i}: {PAPER_IOI_PROMPTS[i - 1][0].format(s='*')}", *cells])
    lines += markdown_table(["sentence", *names], rows)
    lines += ["", *training_table(runs, curves or {})]
    return "\n".join(lines) + "\n"


def first_step(probes: list[dict], value, threshold: float) -> int | None:
    """The first probed step where value(probe) >= threshold (None if never)."""
    return next((row["step"] for row in probes if value(row) >= threshold), None)


LOSS_THRESHOLDS = (1.5, 1.3, 1.1)
EMERGENCE = (  # (label, value of a probe row, threshold)
    ("IOI training names P(correct) >= 50%", lambda row: row["ioi"]["train names"]["correct"], 50.0),
    ("IOI training names logit diff >= 2", lambda row: row["ioi"]["train names"]["logit_diff"], 2.0),
    ("induction accuracy >= 0.5", lambda row: row["induction_accuracy"], 0.5),
)


def first_step_below(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """The first logged step whose training loss (a 10-step mean) is below threshold (None if never)."""
    return next((step for step, loss in curve if loss < threshold), None)


def training_table(runs: dict[str, list[dict]], curves: dict[str, list[list[tuple[int, float]]]]) -> list[str]:
    """ICL during training: the first step past each threshold (training loss every 10 steps, probes every
    probe_every steps), and the probes step by step (seed means)."""
    variants = [v for v in runs if all(r.get("during_training") for r in runs[v])]
    if not variants:
        return []
    intro = ("First step past a threshold (per seed; - = not reached). The training loss has a plateau until the model "
             "starts copying names from the context, then drops: the loss thresholds time that drop.")
    names = [VARIANT_NAMES[v] for v in variants]
    rows = [[f"training loss < {threshold} (logged every 10 steps)",
             *(", ".join(str(first_step_below(c, threshold) or "-") for c in curves.get(v, [])) for v in variants)]
            for threshold in LOSS_THRESHOLDS]
    rows += [[f"{label} (probed)", *(", ".join(str(first_step(r["during_training"], value, threshold) or "-") for r in runs[v])
                                     for v in variants)] for label, value, threshold in EMERGENCE]
    lines = [intro, "", *markdown_table(["threshold", *names], rows), "", "During training, mean over seeds: IOI with "
             "training names P(correct) / P(incorrect) %, induction accuracy, validation loss:", ""]
    rows = []
    for i in range(min(len(r["during_training"]) for v in variants for r in runs[v])):
        cells = []
        for v in variants:
            probes = [r["during_training"][i] for r in runs[v]]
            c, w = (np.mean([row["ioi"]["train names"][key] for row in probes]) for key in ("correct", "incorrect"))
            induction = np.mean([row["induction_accuracy"] for row in probes])
            loss = np.mean([row["validation_loss"] for row in probes])
            cells.append(f"{c:.1f} / {w:.1f}, {induction:.2f}, {loss:.3f}")
        rows.append([runs[variants[0]][0]["during_training"][i]["step"], *cells])
    lines += markdown_table(["step", *names], rows)
    return lines


def rewrite_outputs(out_dir: Path) -> dict:
    """Rewrite table.md and the plots of a finished (or cut-short) study from its results.json."""
    saved = json.loads((Path(out_dir) / "results.json").read_text())
    config = ResidualLMConfig(**saved["config"])
    return save_result(study_result(config, saved["runs"], saved["train_loss_curves"], saved["parameters"]), out_dir,
                       "residual-lm", config)


@register_experiment("residual-lm", "Classic vs residual-V-stream small LMs on generated stories: IOI, in-context loss, induction", ResidualLMConfig)
def run(config: ResidualLMConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(config.threads)
    runs, curves = earlier_runs(config, out_dir) if config.add_to_existing else ({v: [] for v in config.variants}, {v: [] for v in config.variants})
    new_seeds = config.seeds
    earlier = [r["seed"] for r in runs[config.variants[0]]]
    config = dataclasses.replace(config, seeds=earlier + [s for s in new_seeds if s not in earlier])  # what results.json covers
    parameters = 0
    for i, seed in enumerate(new_seeds):  # seeds outermost: a cut-short study still has both variants for the first seeds
        for variant in config.variants:
            run_dir = out_dir / "train" / f"{variant}-seed{seed}"
            started = time.perf_counter()
            model, train_config, trained = train_fresh(run_dir, train_settings(config, variant, seed))
            seconds = time.perf_counter() - started
            task = train_config.build_task()
            probes = {"ioi_pairs": config.ioi_pairs, "seed": config.corpus_seed, "induction_sequences": config.induction_sequences}
            result = {"seed": seed, "variant": variant, "train_seconds": seconds, "final_train_loss": trained["eval"].get("loss"),
                      **probe_model(model, task, windows=config.eval_windows, icl_stories=config.icl_stories,
                                    icl_early=tuple(config.icl_early), icl_late=tuple(config.icl_late), **probes),
                      "during_training": probe_checkpoints(run_dir / "train", task, windows=min(config.eval_windows, 256), **probes)}
            runs[variant].append(result)
            curves[variant].append([(r["step"], r["loss"]) for r in read_metrics(run_dir / "train") if r["split"] == "train"])
            parameters = model.num_parameters()
            print(f"{VARIANT_NAMES[variant]} seed {seed}: {seconds:.0f} s, validation loss {result['validation_loss']:.3f}, "
                  f"IOI paper correct {result['ioi']['paper']['correct']:.1f}% incorrect {result['ioi']['paper']['incorrect']:.1f}%, "
                  f"held-out {result['ioi']['held-out names']['correct']:.1f}% / {result['ioi']['held-out names']['incorrect']:.1f}%")
        if i < len(new_seeds) - 1:  # saved after every seed (the last by the registry): a cut-short study keeps its seeds
            save_result(study_result(config, runs, curves, parameters), out_dir, "residual-lm", config)
    return study_result(config, runs, curves, parameters)


SEED_INDEPENDENT = ("seeds", "threads", "add_to_existing")  # settings that may differ between runs of one study


def earlier_runs(config: ResidualLMConfig, out_dir: Path) -> tuple[dict[str, list[dict]], dict[str, list]]:
    """Runs and loss curves of the seeds not in config.seeds from an earlier study in out_dir (none if there is
    none), which must have used the same settings apart from its seeds."""
    try:
        saved = earlier_results(out_dir, config, free=SEED_INDEPENDENT) or {"runs": {}, "train_loss_curves": {}}
    except ValueError as error:
        raise ValueError(f"add_to_existing: {error}") from None
    runs: dict[str, list[dict]] = {v: [] for v in config.variants}
    curves: dict[str, list] = {v: [] for v in config.variants}
    for variant in config.variants:
        for run, curve in zip(saved["runs"].get(variant, []), saved["train_loss_curves"].get(variant, [])):
            if run["seed"] not in config.seeds:  # the seeds asked for now are trained again
                runs[variant].append(run)
                curves[variant].append([tuple(point) for point in curve])
    return runs, curves


def study_result(config: ResidualLMConfig, runs: dict, curves: dict, parameters: int) -> Result:
    """The study so far. Its config names every seed of the study (earlier runs' too): it replaces the one the
    registry writes, which names this call's seeds."""
    summary = summarize(runs)
    results = {"config": dataclasses.asdict(config), "parameters": parameters,
               "seeds_done": [r["seed"] for r in runs[config.variants[-1]]], "summary": summary,
               "runs": runs, "train_loss_curves": curves, "paper": PAPER}
    return Result(results, tables={"table.md": lambda r: table(config, runs, summary, parameters, curves)},
                  figures={"loss_curves.png": plot_losses, "icl_during_training.png": plot_icl_during_training,
                           "ioi.png": plot_ioi})


def _figure(results: dict, columns: int, width: float):
    """The study's variants, a colour per variant, and a figure of `columns` panels."""
    variants = list(results["runs"])
    colors = dict(zip(variants, pyplot().rcParams["axes.prop_cycle"].by_key()["color"]))
    return variants, colors, *pyplot().subplots(1, columns, figsize=(width, 4))


def _legends(fig, axes, **options):
    for ax in axes:
        ax.legend(**options)
    fig.tight_layout()
    return fig


def plot_losses(results: dict):
    """Training loss curves (each seed thin, the mean over seeds thick) and the loss by position."""
    variants, colors, fig, axes = _figure(results, 2, 12)
    for v in variants:
        seed_curves = results["train_loss_curves"][v]
        for curve in seed_curves:
            axes[0].plot([s for s, _ in curve], [x for _, x in curve], color=colors[v], alpha=0.25, lw=0.8)
        n = min(len(c) for c in seed_curves)
        steps = [s for s, _ in seed_curves[0][:n]]
        mean = np.mean([[x for _, x in c[:n]] for c in seed_curves], axis=0)
        axes[0].plot(steps, mean, color=colors[v], lw=2, label=VARIANT_NAMES[v])
        icl = np.array([r["in_context_curve"] for r in results["runs"][v]])
        axes[1].plot(np.arange(1, icl.shape[1] + 1), icl.mean(0), color=colors[v], label=VARIANT_NAMES[v])
    axes[0].set(xlabel="step", ylabel="training loss (10-step means)", yscale="log", title="training loss")
    axes[1].set(xlabel="position in the story (tokens)", ylabel="mean loss", title="loss by position, held-out-name stories")
    return _legends(fig, axes)


def plot_icl_during_training(results: dict):
    """IOI with training / held-out names and induction at the probed checkpoints, mean over seeds."""
    variants, colors, fig, axes = _figure(results, 3, 15)
    for v in variants:
        probes = [r["during_training"] for r in results["runs"][v]]
        n = min(len(p) for p in probes)
        if n == 0:
            continue
        steps = [row["step"] for row in probes[0][:n]]
        for ax, group in zip(axes[:2], ("train names", "held-out names")):
            for key, style in (("correct", "-"), ("incorrect", "--")):
                values = np.mean([[row["ioi"][group][key] for row in p[:n]] for p in probes], axis=0)
                ax.plot(steps, values, style, color=colors[v], marker="o", label=f"{VARIANT_NAMES[v]}: {key}")
            ax.set(xlabel="step", ylabel="probability (%)", title=f"IOI, {group}")
        induction = np.mean([[row["induction_accuracy"] for row in p[:n]] for p in probes], axis=0)
        axes[2].plot(steps, induction, color=colors[v], marker="o", label=VARIANT_NAMES[v])
    axes[2].set(xlabel="step", ylabel="accuracy", title="induction (repeated random tokens)")
    return _legends(fig, axes, fontsize=8)


def plot_ioi(results: dict):
    """IOI probabilities: correct (solid) and incorrect (hatched) per prompt group, mean +- std over seeds."""
    variants, colors, fig, ax = _figure(results, 1, 12)
    groups = [f"paper {i}" for i in range(1, len(PAPER_IOI_PROMPTS) + 1)] + ["paper", "train names", "held-out names"]
    width = 0.8 / (2 * len(variants))
    x = np.arange(len(groups))
    for j, v in enumerate(variants):
        for k, key in enumerate(("correct", "incorrect")):
            values = np.array([[r["ioi"][g][key] for g in groups] for r in results["runs"][v]])
            ax.bar(x + (2 * j + k - len(variants) + 0.5) * width, values.mean(0), width, yerr=values.std(0),
                   color=colors[v], alpha=1.0 if key == "correct" else 0.45, hatch=None if key == "correct" else "//",
                   label=f"{VARIANT_NAMES[v]}: {key}")
    ax.set_xticks(x, ["paper 1", "paper 2", "paper 3", "paper 4", "paper (mean)", "training names", "held-out names"])
    ax.set(ylabel="next-name probability (%)", title="IOI: indirect object (correct) vs subject (incorrect)")
    return _legends(fig, [ax], ncol=2, fontsize=8)
