"""TinT Tables 4 and 5 analogue: few-shot classification with the simulated fine-tuning spread over layers x steps.

The paper (App. L.2) gives TinT a fixed budget of simulated layers x SGD steps of its 12-layer auxiliary model
(OPT-125M): the top 12 layers for 1 step, the top 6 for 2 or the top 3 for 4 (its tables say 6 x 2, its text "6
layers for 3 steps": the tables' 6 x 2 keeps the product 12, and is what is run here), 32 shots, 7 tasks, label or
full-context loss, single or multi format; Table 4 with calibration, Table 5 without. Here the budgets are the
same proportions of the trained model's L layers, (L, 1), (L/2, 2), (L/4, 4): 4x1, 2x2, 1x4 at the reduced size.

The study is tint-classification's k-shot study (the same model, trained by the same settings; the same BBC News
demonstrations, validation and test queries, inner-learning-rate grid and choice on validation, per seed and
calibration mode), with TinT run at every budget (TintConfig.n_simulation_layers, n_steps) in its four settings.
Single format with several steps: each step sums the demonstrations' one-step updates from the weights the previous
step left (absorb.methods.tint.tint_update), as dynamic evaluation's steps do. Dynamic evaluation at the same budget
is the reference (exact SGD, n_steps steps of the summed loss; the top n blocks and the final norm, all parameters
for the all-layers budget as in tint-classification): it separates what the budget does to SGD from what TinT's
approximate step does. The all-layers 1-step rows are tint-classification's TinT and dynamic-eval rows exactly.
The update's CPU time per thread (the harness's absorb time on the validation episode, median over rates and seeds)
shows what each budget costs.

    incontext run tint-layer-steps                     # reduced: tint-classification's model, 4 shots, 4x1 / 2x2 / 1x4
    incontext run tint-layer-steps --set preset=paper  # 12 layers, width 768, 32 shots: 12x1 / 6x2 / 3x4 (a GPU job)

Any preset value can be overridden (`--set shots=8`, `--set "budgets=[[4, 1], [1, 4]]"`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..absorb.methods.tint import tint_simulate, tint_update
from ..absorb.prompt_update import full_mask
from ..harness.compare import compare
from ..outputs import Result, markdown_table
from ..tint import TintConfig
from ..train.fresh import train_fresh
from .registry import register_experiment
from .tint_classification import CALIBRATION, METHODS, ClassificationConfig, Study, summarize, train_settings

# Tables 4 (calibrated) and 5 (no calibration) of the paper, OPT-125M: the 7 tasks' average, (mean, std over 3 seeds)
PAPER = {
    "single/label": {"12x1": {"plain": (68.2, 0.1), "calibrated": (69.8, 0.1)},
                     "6x2": {"plain": (69.3, 0.3), "calibrated": (68.8, 1.4)},
                     "3x4": {"plain": (73.2, 0.1), "calibrated": (67.9, 0.8)}},
    "multi/label": {"12x1": {"plain": (59.4, 0.6), "calibrated": (67.3, 0.9)},
                    "6x2": {"plain": (56.7, 2.6), "calibrated": (63.6, 2.7)},
                    "3x4": {"plain": (59.6, 1.3), "calibrated": (63.3, 3.0)}},
    "single/full": {"12x1": {"plain": (69.0, 0.3), "calibrated": (67.2, 0.1)},
                    "6x2": {"plain": (68.9, 0.0), "calibrated": (68.5, 0.4)},
                    "3x4": {"plain": (68.7, 0.0), "calibrated": (67.5, 0.8)}},
    "multi/full": {"12x1": {"plain": (51.9, 2.2), "calibrated": (62.5, 2.8)},
                   "6x2": {"plain": (50.9, 1.8), "calibrated": (62.6, 2.6)},
                   "3x4": {"plain": (50.6, 2.0), "calibrated": (62.4, 2.8)}},
}
SETTINGS = ("single/label", "multi/label", "single/full", "multi/full")  # the tables' order
PAPER_LAYERS = 12
_DEFAULTS = ClassificationConfig()
PRESET_KEYS = ("n_layer", "d_model", "n_head", "vocab_size", "seq_len", "steps", "batch_size", "lr", "shots")
PRESETS: dict[str, dict[str, Any]] = {
    # tint-classification's model and study (its defaults): 4 layers, width 96, 1,000 steps of 8 x 256 tokens, 4 shots
    "reduced": {key: getattr(_DEFAULTS, key) for key in PRESET_KEYS},
    # the paper's auxiliary-model size (OPT-125M: 12 layers, width 768, 12 heads) and 32 shots, trained here from
    # scratch on BBC News (the paper's OPT is pretrained); 2,048 positions hold 32 demonstrations and the query
    "paper": {"n_layer": 12, "d_model": 768, "n_head": 12, "vocab_size": 8192, "seq_len": 2048, "steps": 2000,
              "batch_size": 16, "lr": 6e-4, "shots": 32},
}


def default_budgets(n_layer: int) -> list[list[int]]:
    """The paper's proportions of an L-layer model: (L, 1), (L/2, 2), (L/4, 4) (those with at least one layer)."""
    return [[n_layer // steps, steps] for steps in (1, 2, 4) if n_layer // steps >= 1]


def budget_name(budget: list[int]) -> str:
    return f"{budget[0]}x{budget[1]}"


@dataclass
class LayerStepsConfig:
    preset: str = "reduced"  # reduced (tint-classification's size) or paper (12 layers, width 768, 32 shots: a GPU)
    # TinT updates the top `layers` blocks for `steps` steps
    budgets: list[list[int]] | None = None  # [layers, steps] pairs; null: (L, 1), (L/2, 2), (L/4, 4) of the L layers
    dynamic_eval: bool = True  # exact SGD at each budget too (the reference)
    # the preset's values unless set (see PRESETS)
    n_layer: int | None = None  # null: the preset's
    d_model: int | None = None  # null: the preset's
    n_head: int | None = None  # null: the preset's
    vocab_size: int | None = None  # null: the preset's
    seq_len: int | None = None  # null: the preset's (training windows and the longest prompt)
    steps: int | None = None  # null: the preset's (training steps)
    batch_size: int | None = None  # null: the preset's
    lr: float | None = None  # null: the preset's (training)
    shots: int | None = None  # null: the preset's (demonstrations per prompt)
    # tint-classification's options, its defaults
    seed: int = _DEFAULTS.seed
    excerpt_words: int = _DEFAULTS.excerpt_words
    labelled_fraction: float = _DEFAULTS.labelled_fraction
    max_train_per_topic: int = _DEFAULTS.max_train_per_topic
    heldout_per_topic: int = _DEFAULTS.heldout_per_topic
    validation_per_topic: int = _DEFAULTS.validation_per_topic
    test_per_topic: int = _DEFAULTS.test_per_topic
    seeds: int = _DEFAULTS.seeds
    inner_lrs: list[float] = field(default_factory=lambda: list(_DEFAULTS.inner_lrs))
    check_queries: int = _DEFAULTS.check_queries

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r} is not one of {sorted(PRESETS)}")
        n_layer = self.classification().n_layer  # its own checks run here, before any training
        budgets = self.resolved_budgets()
        for budget in budgets:
            if len(budget) != 2 or not 1 <= budget[0] <= n_layer or budget[1] < 1:
                raise ValueError(f"budget {budget} must be [layers, steps] with 1 <= layers <= n_layer={n_layer} "
                                 "and steps >= 1")
        if not budgets or len({budget_name(b) for b in budgets}) != len(budgets):
            raise ValueError(f"budgets must be distinct and at least one, got {budgets}")

    def classification(self) -> ClassificationConfig:
        """tint-classification's config of this study: the preset, explicit settings on top."""
        values = dict(PRESETS[self.preset])
        values.update({key: getattr(self, key) for key in PRESET_KEYS if getattr(self, key) is not None})
        own = {f.name for f in dataclasses.fields(ClassificationConfig)} - set(PRESET_KEYS) - {"n_simulation_layers"}
        values.update({key: getattr(self, key) for key in own})
        return ClassificationConfig(**values)

    def resolved_budgets(self) -> list[list[int]]:
        if self.budgets is not None:
            return [list(b) for b in self.budgets]
        return default_budgets(self.classification().n_layer)


@register_experiment("tint-layer-steps", "TinT Tables 4-5 analogue: few-shot BBC News, the update spread over layers x "
                     "steps (12x1, 6x2, 3x4)", LayerStepsConfig)
def run(config: LayerStepsConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    base = config.classification()
    model, train_config, trained = train_fresh(out_dir, train_settings(base))
    train_seconds = time.perf_counter() - start
    model = model.double().eval()  # float64: TinT's finite-difference backward is exact to rounding
    study = BudgetStudy(model, train_config.build_task(), base, config.resolved_budgets(),
                        ["TinT", "dynamic eval"] if config.dynamic_eval else ["TinT"])
    results = {"resolved": dataclasses.asdict(base), "budgets": config.resolved_budgets(),
               "parameters": model.num_parameters(), "train_eval": trained.get("eval"),
               "train_seconds": round(train_seconds, 1), **study.run(), "paper_opt125m_average": PAPER}
    results["total_seconds"] = round(time.perf_counter() - start, 1)
    return Result(results, tables={"table.md": render_table})


class BudgetStudy(Study):
    """tint-classification's k-shot study with every TinT (and dynamic-evaluation) row run at each budget."""

    def __init__(self, model, task, config: ClassificationConfig, budgets: list[list[int]], methods: list[str]):
        super().__init__(model, task, config)
        self.budgets, self.methods = budgets, methods

    def budget_options(self, method: str, mode: str, lr: float, budget: list[int]) -> dict:
        layers, steps = budget
        options: dict[str, Any] = {"learning_rate": lr, "n_steps": steps}
        if method == "TinT":
            options["n_simulation_layers"] = layers
        elif layers < self.model.config.n_layer:  # all layers: every parameter, as tint-classification's step
            options["n_top_layers"] = layers
        return {**options, **({"separator": self.separator} if mode == "single" else {"keep_prompt": True})}

    def budget_tint_config(self, lr: float, budget: list[int]) -> TintConfig:
        return TintConfig(learning_rate=lr, n_simulation_layers=budget[0], n_steps=budget[1])

    def k_shot_budgets(self, seed: int, loss: str) -> dict:
        """One draw of demonstrations, one loss: every method, budget and format at every rate on the validation
        queries, then per calibration mode the best rate (ties: the smaller) on the test queries."""
        lrs = self.config.inner_lrs

        def label(method, budget, mode, lr):
            return f"{METHODS[method]}:{budget_name(budget)}-{mode}-{loss}-lr{lr}"

        keys = [(method, budget_name(b), b, mode) for method in self.methods for b in self.budgets for mode in ("single", "multi")]
        candidates = {label(m, b, mode, lr): self.budget_options(m, mode, lr, b) for m, _, b, mode in keys for lr in lrs}
        validation = {row["method"]: row for row in compare(self.model, self.source, [self.episodes[loss, "validation"][seed]],
                                                             candidates, references=False, progress=False)}

        def score(name: str, key: str) -> float:
            row = validation[name]
            return row[key]["mean"] if row["status"] == "ok" else -math.inf  # a diverged rate loses

        chosen = {(m, name, mode): {cal: max(lrs, key=lambda lr: (score(label(m, b, mode, lr), key), -lr))
                                    for cal, key in CALIBRATION.items()} for m, name, b, mode in keys}
        budget_of = {name: b for _, name, b, _ in keys}
        wanted = sorted({label(m, budget_of[name], mode, lr) for (m, name, mode), best in chosen.items() for lr in best.values()})
        test = {row["method"]: row for row in compare(self.model, self.source, [self.episodes[loss, "test"][seed]],
                                                      {name: candidates[name] for name in wanted},
                                                      references=loss == "label", progress=False)}
        out = {}
        if loss == "label":  # the references do not depend on the loss
            out["vanilla"] = {cal: 100 * test["drop-prompt"][key]["mean"] for cal, key in CALIBRATION.items()}
            out["in-context"] = {cal: 100 * test["keep-prompt"][key]["mean"] for cal, key in CALIBRATION.items()}
        for (method, name, mode), best in chosen.items():
            b = budget_of[name]
            rows = {cal: test[label(method, b, mode, lr)] for cal, lr in best.items()}
            out[f"{method} {name} {mode}/{loss}"] = {
                **{cal: 100 * row[CALIBRATION[cal]]["mean"] if row["status"] == "ok" else float("nan") for cal, row in rows.items()},
                "lr": best,
                "validation": {cal: 100 * score(label(method, b, mode, lr), CALIBRATION[cal]) for cal, lr in best.items()},
                "validation_by_lr": {str(lr): [100 * score(label(method, b, mode, lr), key) for key in CALIBRATION.values()]
                                     for lr in lrs},
                "update_ms": [validation[label(method, b, mode, lr)].get("absorb_ms") for lr in lrs]}
        return out

    def budget_check(self, loss: str, lr: float, budget: list[int]) -> dict:
        """Multi format, one budget: the simulator run on demonstrations + query (training segment = the
        demonstrations, its n steps of the top n layers inside one forward) gives the same label scores at the
        query as the auxiliary model read back from its prefixes (max abs gap over a few queries)."""
        episode = self.episodes[loss, "test"][0]
        prompt = episode.prompt
        targets = full_mask(prompt) if episode.prompt_loss_mask is None else episode.prompt_loss_mask
        tint_config = self.budget_tint_config(lr, budget)
        updated = tint_update(self.model, [prompt], [targets], tint_config)
        gap = 0.0
        for q in self.queries["test"][: self.config.check_queries]:
            ids = torch.cat([prompt, q])
            keep = torch.cat([targets, torch.zeros(len(q), dtype=torch.bool)])
            _, logits, _ = tint_simulate(self.model, ids, keep, tint_config)
            direct = F.log_softmax(logits[-1].double(), -1)[self.scorer.label_ids]
            gap = max(gap, float((direct - self.scorer.label_log_probs(updated, [ids])[0]).abs().max()))
        return {"budget": budget_name(budget), "setting": f"multi/{loss}", "lr": lr, "queries": self.config.check_queries,
                "max_abs_label_log_prob_gap": gap}

    def run(self) -> dict:
        c = self.config
        per_seed: dict[str, list[dict]] = {}
        checks = []
        for seed in range(c.seeds):
            rows = {**self.k_shot_budgets(seed, "label"), **self.k_shot_budgets(seed, "full")}
            if seed == 0:
                checks = [self.budget_check(loss, rows[f"TinT {budget_name(b)} multi/{loss}"]["lr"]["plain"], b)
                          for b in self.budgets for loss in ("label", "full")]
            for name, row in rows.items():
                per_seed.setdefault(name, []).append(row)
        n_test = len(self.queries["test"])
        shots = {name: summarize(rows, n_test) for name, rows in per_seed.items()}
        for name, rows in per_seed.items():
            times = [t for row in rows for t in row.get("update_ms", []) if t is not None]
            if times:
                shots[name]["update_ms"] = statistics.median(times)
        return {"n_queries": {split: len(q) for split, q in self.queries.items()}, "methods": self.methods,
                f"{c.shots}_shot": shots, f"{c.shots}_shot_per_seed": per_seed, "simulator_check": checks}


def paper_budget(budget: list[int], n_layer: int) -> str | None:
    """The paper's budget with the same share of the layers and the same steps (12x1, 6x2, 3x4), if any."""
    layers, steps = budget
    name = f"{PAPER_LAYERS // steps}x{steps}" if steps in (1, 2, 4) else None
    return name if name is not None and layers * steps == n_layer else None


def render_table(results: dict) -> str:
    c, k = results["resolved"], results["resolved"]["shots"]
    shots, n = results[f"{k}_shot"], results["n_queries"]
    dynamic = "dynamic eval" in results["methods"]

    def cell(entry: dict) -> str:
        return f"{entry['mean']:.1f} +- {entry['std']:.1f} [{entry['interval95']:.1f}]"

    def paper(setting: str, budget: list[int], cal: str) -> str:
        name = paper_budget(budget, c["n_layer"])
        if name is None:
            return "-"
        mean, std = PAPER[setting][name][cal]
        return f"{mean} ({std}), {name}"

    lines = [(f"BBC News topic classification (5 topics, chance 20%), accuracy % on {n['test']} held-out test queries, "
              f"{k} shots; GPT-2-style model, {c['n_layer']} layers, width {c['d_model']}, {results['parameters']:,} "
              f"parameters, {c['steps']} training steps (tint-classification's model at the same settings). A budget "
              "LxS: the top L layers updated for S steps. Inner learning rate (summed loss) chosen per seed and "
              f"calibration mode on {n['validation']} validation queries; mean +- std over {c['seeds']} draws of the "
              "demonstrations [95% interval half-width]. Paper: OPT-125M, 32 shots, the average of 7 tasks (std over 3 "
              "seeds), Table 5 without calibration, Table 4 with; its budget with the same share of the layers and "
              "steps named."), ""]
    header = ["setting", "budget", "TinT, no calibration", "paper Table 5", "TinT, calibrated", "paper Table 4"]
    if dynamic:
        header += ["dynamic eval, no calibration", "dynamic eval, calibrated"]
    header += ["TinT update ms"]
    body = []
    for setting in SETTINGS:
        for budget in results["budgets"]:
            name = budget_name(budget)
            tint = shots[f"TinT {name} {setting}"]
            row = [setting, name, cell(tint["plain"]), paper(setting, budget, "plain"), cell(tint["calibrated"]),
                   paper(setting, budget, "calibrated")]
            if dynamic:
                sgd = shots[f"dynamic eval {name} {setting}"]
                row += [cell(sgd["plain"]), cell(sgd["calibrated"])]
            row.append(f"{tint['update_ms']:.0f}" if "update_ms" in tint else "-")
            body.append(row)
    lines += markdown_table(header, body)
    vanilla, context = shots["vanilla"], shots["in-context"]
    lines += ["", (f"References (no calibration / calibrated): the query alone {vanilla['plain']['mean']:.1f} / "
                   f"{vanilla['calibrated']['mean']:.1f}; the demonstrations in context {cell(context['plain'])} / "
                   f"{cell(context['calibrated'])}. TinT update ms: CPU time per thread of the simulated update on the "
                   "validation episode (median over the rates and seeds); in the single format every step reads the "
                   "demonstrations' updates back, sums them and builds the next simulator, so its time grows with the "
                   "steps where the multi format's one simulator pass keeps the budget."), ""]
    lrs = [f"{setting} {budget_name(b)}: " + " / ".join(
        ",".join(f"{lr:g}" for lr in shots_lrs(results, f"TinT {budget_name(b)} {setting}", cal)) for cal in CALIBRATION)
        for setting in SETTINGS for b in results["budgets"]]
    lines += ["TinT's chosen inner learning rates per seed (no calibration / calibrated): " + "; ".join(lrs) + ".", ""]
    if results["simulator_check"]:
        gaps = ", ".join(f"{r['budget']} {r['setting']} {r['max_abs_label_log_prob_gap']:.1e}" for r in results["simulator_check"])
        lines.append(f"Simulator's own second forward vs the read-back updated model (multi format, seed 0, "
                     f"{results['simulator_check'][0]['queries']} queries), max abs gap of the label log-probabilities: {gaps}.")
    return "\n".join(lines) + "\n"


def shots_lrs(results: dict, name: str, cal: str) -> list[float]:
    return [row["lr"][cal] for row in results[f"{results['resolved']['shots']}_shot_per_seed"][name]]
