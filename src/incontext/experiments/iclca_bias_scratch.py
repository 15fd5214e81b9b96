"""ICLCA Sec. 6.3 (Fig. 1): the biased architecture trained from scratch against the same model without the biases.

The biased architecture (Sec. 4.4; TransformerConfig.linear_bias) adds to every linear-attention layer a learned
b_KV and b_D per head, the starting sums of every sequence (as if a learned prompt preceded it); a converted prompt
adds to them, exactly. Both variants train iclca-table2's induction task with the same seeds, data and schedule;
reported per run: the training loss and the accuracy at the committed triggers on validation sequences by step (the
paper's two curves), the first step at 50% and 90%, the final loss and accuracy, and, on test episodes, the
accuracy with the prompt, without it and converted (ICLCA on top of the learned biases) with the conversion's error.

    incontext run iclca-bias-scratch                      # CPU: iclca-table2's model, 3000 steps, seeds 0 and 1
    incontext run iclca-bias-scratch --set preset=paper   # 12 layers, RoPE, 8000 steps (a GPU job)

The paper (12 layers, d 128, RoPE): "adding these bias terms makes training slightly faster" (a plot, no number).
A setting given with --set that differs from its default wins over the preset's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..harness.compare import compare
from ..outputs import Result, markdown_table, pyplot
from ..tasks.episodes import get_episode_source
from ..train import latest_checkpoint, load_for_eval
from ..train.fresh import finished_record, train_many
from ..train.metrics import read_metrics
from .iclca_table2 import Table2Config, learning_curve, train_settings
from .registry import register_experiment

VARIANTS = ("plain", "biased")
# the presets: cpu is the defaults (iclca-table2's recipe, 3000 steps); paper sets these fields where they are
# at their defaults (a value given with --set that differs from the default is kept)
PRESETS = {"cpu": {}, "paper": {"n_layer": 12, "positions": "rope", "steps": 8000}}


@dataclass
class BiasScratchConfig(Table2Config):
    steps: int = 3000
    preset: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    workers: int = 2  # runs trained at the same time (processes)
    threads: int = 1  # torch threads per run
    eval_sequences: int = 300  # test sequences of the with / without / converted accuracies, per run
    reuse: bool = False  # keep runs already trained to the end in <out>/<variant>-seed<k>

    def __post_init__(self):
        super().__post_init__()
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r} is not one of {sorted(PRESETS)}")
        if not self.seeds or self.workers < 1 or self.threads < 1:
            raise ValueError("give at least one seed, workers >= 1 and threads >= 1")


def resolved(config: BiasScratchConfig) -> BiasScratchConfig:
    """The preset's fields over those still at their defaults."""
    defaults = BiasScratchConfig()
    return dataclasses.replace(config, **{k: v for k, v in PRESETS[config.preset].items()
                                          if getattr(config, k) == getattr(defaults, k)})


def first_step(curve: list[dict], level: float) -> int | None:
    return next((r["step"] for r in curve if r["accuracy"] >= level), None)


def training_loss(train_dir: Path) -> list[list[float]]:
    """[step, loss] of the trainer's training records."""
    return [[r["step"], r["loss"]] for r in read_metrics(train_dir) if r.get("split") == "train" and "loss" in r]


@register_experiment("iclca-bias-scratch", "ICLCA Sec. 6.3: the biased architecture (learned b_KV, b_D) trained from "
                     "scratch vs without, induction task", BiasScratchConfig)
def run(config: BiasScratchConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    config = resolved(config)
    jobs = [(variant, seed) for variant in VARIANTS for seed in config.seeds]
    settings = {job: train_settings(dataclasses.replace(config, seed=job[1]), linear_bias=job[0] == "biased",
                                    threads=config.threads) for job in jobs}
    run_dirs = {job: out_dir / f"{job[0]}-seed{job[1]}" for job in jobs}
    trained = {job: record for job in jobs if config.reuse and (record := finished_record(run_dirs[job], settings[job]))}
    trained.update(train_many({job: (run_dirs[job], settings[job]) for job in jobs if job not in trained}, config.workers))

    source = get_episode_source("induction", prompt_fraction=0.5)
    runs = []
    for variant, seed in jobs:
        train_dir = run_dirs[(variant, seed)] / "train"
        model, train_config = load_for_eval(latest_checkpoint(train_dir))
        task = train_config.build_task()
        episodes = source.episodes(config.eval_sequences, seed + 10_000, task=task)  # the test split of iclca-table2
        rows = {row["method"]: row for row in compare(model, source, episodes, {"iclca": {}})}
        curve = learning_curve(train_dir)
        runs.append({"variant": variant, "seed": seed, "seconds": trained[(variant, seed)]["seconds"],
                     "parameters": trained[(variant, seed)]["parameters"], "curve": curve,
                     "train_loss": training_loss(train_dir),
                     "step_50": first_step(curve, 0.5), "step_90": first_step(curve, 0.9),
                     "final_accuracy": curve[-1]["accuracy"] if curve else None,
                     "final_loss": curve[-1]["loss"] if curve else None,
                     "with_prompt": rows["keep-prompt"]["score_pooled"], "without_prompt": rows["drop-prompt"]["score_pooled"],
                     "converted": rows["iclca"]["score_pooled"],
                     "relative_logits_error_converted": rows["iclca"]["agreement"]["relative_logits_error"]})
    (out_dir / "runs.json").write_text(json.dumps(runs, indent=1))
    results = {"runs": runs, "paper": "adding the bias terms makes training slightly faster (Fig. 1, no number)",
               "scale": {"ours": f"{config.n_layer} layers, {config.positions} positions, {config.steps} steps",
                         "paper": "12 layers, d 128, RoPE"}}
    return Result(results, tables={"table.md": lambda r: table(r, config)}, figures={"curves.png": plot})


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def table(results: dict, config: BiasScratchConfig) -> str:
    rows = [[r["variant"], r["seed"], r["step_50"] if r["step_50"] is not None else "never",
             r["step_90"] if r["step_90"] is not None else "never", f"{r['final_loss']:.3f}", _pct(r["final_accuracy"]),
             _pct(r["with_prompt"]), _pct(r["without_prompt"]), _pct(r["converted"]),
             f"{r['relative_logits_error_converted']:.1e}", f"{r['seconds']:.0f}"] for r in results["runs"]]
    head = (f"ICLCA Sec. 6.3 at {results['scale']['ours']} (paper: {results['scale']['paper']}); width {config.d_model}, "
            f"{config.n_head} heads, {config.feature_map} features, lr {config.lr:g}; the same seeds, data and schedule for "
            f"both variants. Steps to 50% / 90%: the first validation evaluation (every {config.eval_every} steps) at that "
            f"accuracy at the committed triggers; with / without / converted: {config.eval_sequences} test sequences.")
    return "\n".join([head, "", *markdown_table(
        ["variant", "seed", "step at 50%", "step at 90%", "final val. loss", "final val. accuracy", "with prompt",
         "without prompt", "converted", "conversion rel. error", "train s"], rows)])


def plot(results: dict):
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4))
    colors = {"plain": "tab:blue", "biased": "tab:red"}
    for r in results["runs"]:
        style = dict(color=colors[r["variant"]], ls="-" if r["seed"] == results["runs"][0]["seed"] else "--", lw=1)
        label = f"{r['variant']}, seed {r['seed']}"
        if r["train_loss"]:
            steps, losses = zip(*r["train_loss"])
            window = max(1, len(losses) // 60)
            smooth = [sum(losses[max(0, i - window + 1): i + 1]) / len(losses[max(0, i - window + 1): i + 1])
                      for i in range(len(losses))]
            left.plot(steps, smooth, label=label, **style)
        right.plot([c["step"] for c in r["curve"]], [100 * c["accuracy"] for c in r["curve"]], label=label, **style)
    left.set(xlabel="training step", ylabel="training loss", title="training loss (moving mean)")
    right.set(xlabel="training step", ylabel="accuracy at committed triggers (%)", ylim=(0, 102),
              title="in-context accuracy (validation)")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig
