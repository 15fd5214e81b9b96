"""CGT Figs 7-9 (App. B): the specialised accuracy as one setting of cgt-table1's CGT + aux + reg changes: the layer
l where y guides (Fig. 7a; Fig. 9: with the prompt examples in context and without them), the rank of the generated
matrices (Fig. 7b) and the regulariser's weights w_C / w_D (Fig. 8). Every point is cgt-table1 with that one
setting changed, the others at the preset's; a point shared by two axes (the preset's own) is trained once.

    incontext run cgt-ablations                      # CPU: cgt-table1's preset cpu, seeds 0 and 1
    incontext run cgt-ablations --set preset=paper   # 6 layers, l in 2..5 (a GPU job)

Runs go to <out>/l<l>-r<rank>-wc<w_C>-wd<w_D>/cgt_aux_reg-seed<k>/ (cgt-table1's layout, reused when finished).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..outputs import Result, markdown_table, pyplot
from .cgt_table1 import Table1Config, as_table1
from .cgt_table1 import run as run_table1
from .registry import register_experiment

METRICS = (("with the prompt (base)", "base_char_accuracy"), ("specialised (frozen y)", "specialized_char_accuracy"),
           ("no prompt", "no_prompt_char_accuracy"))


@dataclass
class AblationConfig(Table1Config):
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: ["cgt_aux_reg"])
    split_layers: list[int] = field(default_factory=lambda: [1, 2, 3])  # Fig. 7a / 9 (the cpu preset has 4 layers)
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # Fig. 7b
    weights: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0], [0.02, 0.01], [0.08, 0.04], [0.32, 0.16]])  # Fig. 8: [w_C, w_D]

    def __post_init__(self):
        super().__post_init__()
        if any(len(pair) != 2 for pair in self.weights):
            raise ValueError(f"weights: give [w_C, w_D] pairs, got {self.weights}")


def points(config: AblationConfig) -> list[tuple[str, Any, dict[str, Any]]]:
    """(axis, value, the Table1Config fields it changes) for every point of the three axes."""
    return ([("layer l", l, {"split_layer": l}) for l in config.split_layers]
            + [("rank", r, {"rank": r}) for r in config.ranks]
            + [("w_C / w_D", f"{wc:g} / {wd:g}", {"w_c": wc, "w_d": wd}) for wc, wd in config.weights])


@register_experiment("cgt-ablations", "CGT Figs 7-9: specialised accuracy by the layer l, the rank and w_C / w_D "
                     "(each point a cgt-table1 training)", AblationConfig)
def run(config: AblationConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, done = [], {}
    for axis, value, changes in points(config):
        point = as_table1(config, **changes, reuse=True)
        s = point.resolved()
        key = f"l{s['split_layer']}-r{s['rank']}-wc{point.w_c:g}-wd{point.w_d:g}"
        if key not in done:
            done[key] = run_table1(point, out_dir / key).results["summary"]["cgt_aux_reg"]
        summary = done[key]
        rows.append({"axis": axis, "value": value, "folder": key, "seeds": summary["seeds"],
                     **{name: summary[name] for _, name in METRICS if name in summary}})
    results = {"resolved": config.resolved(), "points": rows,
               "paper": "Fig. 7a: specialised accuracy best at l = 4 of 6; 7b: flat in the rank from 2; Fig. 8: "
                        "specialised accuracy falls with w_C, w_D = 0 the lowest (plots, no table)"}
    return Result(results, tables={"table.md": table}, figures={"ablations.png": plot})


def table(results: dict) -> str:
    s = results["resolved"]
    head = (f"CGT + aux + reg, cgt-table1's preset {results['config']['preset']} ({s['n_layer']} layers, d_x {s['d_x']}, "
            f"{s['steps']} steps) with one setting changed; answer-character accuracy on examples 3-4, mean +- 3 standard "
            f"errors over seeds {', '.join(map(str, results['config']['seeds']))}.")
    body = [[p["axis"], p["value"], *(f"{100 * p[k][0]:.1f} +- {100 * p[k][1]:.1f}" if k in p else "-" for _, k in METRICS)]
            for p in results["points"]]
    return "\n".join([head, "", *markdown_table(["axis", "value", *(label for label, _ in METRICS)], body)])


def plot(results: dict):
    axes_names = list(dict.fromkeys(p["axis"] for p in results["points"]))
    fig, axes = pyplot().subplots(1, len(axes_names), figsize=(4.2 * len(axes_names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], axes_names):
        mine = [p for p in results["points"] if p["axis"] == name]
        for label, key in METRICS:
            if all(key in p for p in mine):
                ax.errorbar(range(len(mine)), [100 * p[key][0] for p in mine], yerr=[100 * p[key][1] for p in mine],
                            marker="o", capsize=3, label=label)
        ax.set_xticks(range(len(mine)), [str(p["value"]) for p in mine])
        ax.set(xlabel=name, ylabel="accuracy (%)", ylim=(0, 100))
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig
