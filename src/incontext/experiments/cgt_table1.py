"""CGT Table 1 (paper sec. 4.2): baseline vs CGT (eta = 1) vs CGT + aux vs CGT + aux + reg on the arithmetic
ICL sequences, several seeds, mean +- 3 standard errors.

    incontext run cgt-table1                      # CPU scale (preset "cpu"): see PRESETS for every deviation
    incontext run cgt-table1 --set preset=paper   # 6 layers, d_x 112, d_y 64, 3 digits, 4 tasks (a GPU job)

Any preset value can be overridden (`--set steps=3000`). Runs go to <out>/<variant>-seed<k>/train, `workers`
of them at a time (one CPU thread each on CPU). Every run's full record (training time, evaluation metrics) is
written to <out>/<variant>-seed<k>/record.json, which is committed (the checkpoints are not): `recompute(out)`
rebuilds the summary and table from those records alone, e.g. after seeds were trained by separate processes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..fileio import strict_json
from ..outputs import Result, markdown_table, pyplot, save_result
from ..stats import mean_3se
from ..train import latest_checkpoint, load_for_eval
from ..train.cgt_metrics import TaskSpans, cgt_arithmetic_metrics, dot_product_map
from ..train.fresh import finished_record, train_many
from .cgt_plots import dot_map_figure
from .common import CGTOptions
from .registry import register_experiment

VARIANTS = ("baseline", "cgt", "cgt_aux", "cgt_aux_reg")
# beyond Table 1 (asked for by name, never run by default): CGT + aux with App. A.2's distribution-matching R_P
EXTRA_VARIANTS = ("cgt_aux_rp",)
PAPER = {  # Table 1, mean +- 3 sigma over 6 runs
    "base_char_accuracy": {"baseline": (77.7, 0.8), "cgt": (79.0, 0.8), "cgt_aux": (77.5, 1.3), "cgt_aux_reg": (78.6, 1.2)},
    "specialized_char_accuracy": {"cgt": (15.3, 7.2), "cgt_aux": (77.0, 1.0), "cgt_aux_reg": (77.5, 0.9)},
    "variation": {"cgt": (0.80, None), "cgt_aux": (0.39, None), "cgt_aux_reg": (0.07, None)},
    "linear_fit_mean_abs_error": {"cgt": (0.19, None), "cgt_aux": (0.12, None), "cgt_aux_reg": (0.04, None)},
}
PRESETS: dict[str, dict[str, Any]] = {
    # CPU scale, every deviation from the paper: 4 layers (not 6), l = 3 (not 4), d_x 64 / 4 heads (not 112 / 7),
    # d_y 32 / 2 heads (not 64 / 4), M = 8 (not 16), 1-digit numbers, 2 tasks x 4 examples (not 3 digits, 4 tasks),
    # integer coefficients a in {0..4}, b in {-4..4} (not real a in [0, 10), b in (-10, 10)), 1500 steps of batch 64
    # at lr 2e-3 (not 400k steps of 128 at 2.5e-4..5e-4). Pilot (eta = 1, one seed): base 81.4% vs 68.6% with
    # examples 1-2 dropped, so the model does use its context at this scale.
    "cpu": {"n_layer": 4, "split_layer": 3, "d_x": 64, "n_head_x": 4, "d_y": 32, "n_head_y": 2, "rank": 4,
            "n_templates": 8, "digits": 1, "n_tasks": 2, "n_ex": 4, "integer_coefficients": True,
            "a_range": [0.0, 5.0], "b_range": [-5.0, 5.0], "steps": 1500, "batch_size": 64, "lr": 2e-3, "warmup": 100},
    "paper": {"n_layer": 6, "split_layer": 4, "d_x": 112, "n_head_x": 7, "d_y": 64, "n_head_y": 4, "rank": 4,
              "n_templates": 16, "digits": 3, "n_tasks": 4, "n_ex": 4, "integer_coefficients": False,
              "a_range": [0.0, 10.0], "b_range": [-10.0, 10.0],
              "steps": 400_000, "batch_size": 128, "lr": 5e-4, "warmup": 10_000},
}


@dataclass
class Table1Config:
    preset: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4, 5])
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    workers: int = 2  # runs trained at the same time (processes)
    threads: int = 1  # torch threads per run
    eval_sequences: int = 512
    reuse: bool = False  # keep runs already trained to the end in <out>/<variant>-seed<k> (split a study over processes)
    only_finished: bool = False  # with reuse: summarise the finished runs only (a variant may then have fewer seeds)
    # CGTOptions fields as copies, not inherited: the model and training ones default to None (the preset's value),
    # and a run's seed comes from `seeds`; variant_settings turns the resolved values into CGTOptions
    eta: float = 0.5
    w_c: float = 0.08
    w_d: float = 0.04
    w_p: float = 0.1  # R_P's weight, variant cgt_aux_rp only (cgt-rp sweeps it)
    aux_cuts: int = 4
    n_layer: int | None = None
    split_layer: int | None = None
    d_x: int | None = None
    n_head_x: int | None = None
    d_y: int | None = None
    n_head_y: int | None = None
    rank: int | None = None
    n_templates: int | None = None
    digits: int | None = None
    n_tasks: int | None = None
    n_ex: int | None = None
    integer_coefficients: bool | None = None
    a_range: list[float] | None = None
    b_range: list[float] | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r} is not one of {sorted(PRESETS)}")
        unknown = sorted(set(self.variants) - set(VARIANTS) - set(EXTRA_VARIANTS))
        if unknown or not self.variants:
            raise ValueError(f"variants {unknown or self.variants} not among {VARIANTS + EXTRA_VARIANTS}")
        if not self.seeds or self.workers < 1:
            raise ValueError("give at least one seed and workers >= 1")

    def resolved(self) -> dict[str, Any]:
        """The preset with explicit settings on top."""
        values = dict(PRESETS[self.preset])
        values.update({k: v for k, v in dataclasses.asdict(self).items() if k in values and v is not None})
        return values


def as_table1(config: Table1Config, **changes) -> Table1Config:
    """`config` (a study's config that extends Table1Config) as a plain Table1Config, `changes` on top."""
    return Table1Config(**{**{f.name: getattr(config, f.name) for f in dataclasses.fields(Table1Config)}, **changes})


def variant_settings(config: Table1Config, variant: str, seed: int) -> dict[str, Any]:
    """The trainer config of one run."""
    s = config.resolved()
    options = CGTOptions(**{f.name: s[f.name] for f in dataclasses.fields(CGTOptions) if f.name in s},
                         eta=1.0 if variant == "cgt" else config.eta, aux_cuts=config.aux_cuts, w_c=config.w_c,
                         w_d=config.w_d, seed=seed)
    model, loss = (options.baseline_model(), {}) if variant == "baseline" else options.cgt_sections(variant == "cgt_aux_reg")
    if variant == "cgt_aux_rp":  # R_P with the VAE's GP prior for ICL sequences (App. B.2.3: nu 0.03, lambda 0.1)
        loss = {**loss, "w_p": config.w_p, "prior": "rbf", "prior_nugget": 0.03, "prior_length": 0.1}
    task = {"name": "arithmetic", **{k: s[k] for k in ("digits", "n_tasks", "n_ex", "integer_coefficients", "a_range", "b_range")}}
    return options.trainer_sections(task, model, loss, warmup=s["warmup"], threads=config.threads)


@register_experiment("cgt-table1", "CGT Table 1: baseline / CGT / +aux / +aux+reg, base and specialised accuracy", Table1Config)
def run(config: Table1Config, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(variant, seed) for variant in config.variants for seed in config.seeds]
    settings = {job: variant_settings(config, *job) for job in jobs}
    run_dirs = {job: out_dir / f"{job[0]}-seed{job[1]}" for job in jobs}
    trained = {job: record for job in jobs if config.reuse and (record := finished_record(run_dirs[job], settings[job])) is not None}
    todo = [job for job in jobs if job not in trained]
    if config.reuse and config.only_finished:
        jobs, todo = [job for job in jobs if job in trained], []
        if not jobs:
            raise ValueError(f"only_finished: no finished runs under {out_dir}")
    trained.update(train_many({job: (run_dirs[job], settings[job]) for job in todo}, config.workers))

    runs, maps = [], {}
    for job in jobs:
        model, train_config = load_for_eval(latest_checkpoint(run_dirs[job] / "train"))
        task = train_config.build_task()
        batch = task.sample(config.eval_sequences, torch.Generator().manual_seed(RECORD_EVAL_SEED))
        metrics = cgt_arithmetic_metrics(model, batch, task.config)
        runs.append({"variant": job[0], "seed": job[1], **trained[job], "metrics": metrics})
        (run_dirs[job] / RECORD).write_text(strict_json({**runs[-1], "settings": settings[job],
                                                        "eval_sequences": config.eval_sequences, "eval_seed": RECORD_EVAL_SEED}))
        if job[0] != "baseline" and job[1] == config.seeds[0]:
            maps[job[0]] = dot_product_map(model.context(batch.inputs))
    spans = TaskSpans.of(task.config)
    boundaries = [spans.task(k)[0] for k in range(1, spans.n_tasks)]
    results = {"resolved": config.resolved(),
               "runs": runs, "summary": summarize_runs(runs, config.variants), "paper": PAPER}
    maps = {f"dot_map_{variant}.png": lambda r, m=matrix, v=variant: dot_map_figure(m, f"{v} (seed {config.seeds[0]})", boundaries)
            for variant, matrix in maps.items()}
    return Result(results, tables={"table.md": table}, figures={**maps, "table1.png": plot_summary})


RECORD = "record.json"  # one run's record, next to its (uncommitted) train folder
RECORD_EVAL_SEED = 123_457  # the evaluation batch of every run


def summarize_runs(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per variant: mean and 3 standard errors of every metric and of the time per step, and its seeds."""
    order = list(variants) + sorted({r["variant"] for r in runs} - set(variants))
    summary: dict[str, dict[str, list[float]]] = {}
    for variant in [v for v in order if any(r["variant"] == v for r in runs)]:
        mine = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seed"])
        summary[variant] = {key: list(mean_3se([r["metrics"][key] for r in mine])) for key in mine[0]["metrics"]}
        summary[variant]["seconds_per_step"] = list(mean_3se([r["seconds_per_step"] for r in mine]))
        summary[variant]["seeds"] = [r["seed"] for r in mine]
    return summary


def recompute(out_dir: Path) -> dict[str, Any]:
    """Rebuild results.json's runs and summary and table.md from the run records <out>/*/record.json (no model
    is loaded): the table of whatever runs have finished, in whichever processes."""
    out_dir = Path(out_dir)
    runs = [json.loads(path.read_text()) for path in sorted(out_dir.glob(f"*/{RECORD}"))]
    if not runs:
        raise FileNotFoundError(f"no run records ({RECORD}) under {out_dir}")
    results = json.loads((out_dir / "results.json").read_text())
    runs = [{k: v for k, v in r.items() if k not in ("settings", "eval_sequences", "eval_seed")} for r in runs]
    results["runs"] = sorted(runs, key=lambda r: (results["config"]["variants"].index(r["variant"])
                                                  if r["variant"] in results["config"]["variants"] else len(VARIANTS), r["seed"]))
    results["summary"] = summarize_runs(results["runs"], results["config"]["variants"])
    return save_result(Result(results, tables={"table.md": table}, figures={"table1.png": plot_summary}), out_dir)


ROWS = [("base accuracy (dynamic y)", "base_char_accuracy", 100), ("specialised accuracy (frozen y, examples 1-{h} dropped)", "specialized_char_accuracy", 100),
        ("no-prompt accuracy (examples 1-{h} dropped)", "no_prompt_char_accuracy", 100), ("base exact match", "base_exact_match", 100),
        ("specialised exact match", "specialized_exact_match", 100), ("representation variation, eq. (4)", "variation", 1),
        ("linear-fit error (z units)", "linear_fit_mean_abs_error", 1), ("linear-fit R^2 of a", "linear_fit_r2_a", 1),
        ("linear-fit R^2 of b", "linear_fit_r2_b", 1), ("seconds per training step", "seconds_per_step", 1)]


def table(results: dict) -> str:
    variants, s = list(results["summary"]), results["resolved"]
    seeds = {v: results["summary"][v].get("seeds", results["config"]["seeds"]) for v in variants}
    n = ", ".join(sorted({str(len(x)) for x in seeds.values()}))
    lines = [(f"CGT Table 1, preset {results['config']['preset']}: {s['n_layer']} layers (l = {s['split_layer']}), d_x {s['d_x']}, "
             f"d_y {s['d_y']}, r {s['rank']}, M {s['n_templates']}, {s['digits']}-digit numbers, {s['n_tasks']} tasks x "
             f"{s['n_ex']} examples, {s['steps']} steps of batch {s['batch_size']}; mean +- 3 standard errors over {n} seeds "
             f"(paper: 6 runs, 3 sigma). Accuracies on the answer characters of examples {s['n_ex'] // 2 + 1}-{s['n_ex']} of "
             "every task."), ""]

    def cell(variant: str, key: str, scale: int) -> str:
        if key not in results["summary"][variant]:
            return "–"
        mean, err = results["summary"][variant][key]
        digits = 1 if scale == 100 else 3
        paper = results["paper"].get(key, {}).get(variant)
        return f"{scale * mean:.{digits}f} ± {scale * err:.{digits}f}" + (
            f" (paper {paper[0]}{f' ± {paper[1]}' if paper[1] else ''})" if paper else "")

    lines += markdown_table(["metric", *(f"{v} ({len(seeds[v])} seeds)" for v in variants)],
                            [[label.format(h=s["n_ex"] // 2), *(cell(v, key, scale) for v in variants)]
                             for label, key, scale in ROWS])
    return "\n".join(lines) + "\n"


def plot_summary(results: dict):
    variants = list(results["summary"])
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.8))
    for ax, keys, title in ((axes[0], ["base_char_accuracy", "specialized_char_accuracy", "no_prompt_char_accuracy"], "accuracy"),
                            (axes[1], ["variation"], "representation variation"), (axes[2], ["linear_fit_mean_abs_error"], "linear-fit error")):
        width = 0.8 / len(keys)
        for j, key in enumerate(keys):
            xs = [i + j * width for i, v in enumerate(variants) if key in results["summary"][v]]
            values = [results["summary"][v][key] for v in variants if key in results["summary"][v]]
            ax.bar(xs, [m for m, _ in values], width, yerr=[e for _, e in values], label=key.replace("_char_accuracy", ""))
        ax.set_xticks(range(len(variants)), variants, rotation=15)
        ax.set_title(title)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
