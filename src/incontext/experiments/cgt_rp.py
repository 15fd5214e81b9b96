"""CGT App. A.2: the distribution-matching regulariser R_P (y's batch statistics matched to a stationary zero-mean GP,
models/cgt_losses.py) in place of the element-wise R_C / R_D, on cgt-table1's arithmetic sequences: CGT + aux + R_P
at several weights w_P beside CGT + aux and CGT + aux + reg trained with the same seeds. The paper proposes R_P and
reports no run of it (it calls it "computationally expensive and noisy"); the measures are Table 1's.

    incontext run cgt-rp                      # CPU: cgt-table1's preset cpu, seeds 0 and 1, w_P 0.01 / 0.1 / 1
    incontext run cgt-rp --set preset=paper   # cgt-table1's paper preset (a GPU job)

Runs go to <out>/references/ (cgt_aux, cgt_aux_reg) and <out>/rp-<w_P>/ in cgt-table1's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..outputs import Result, markdown_table
from .cgt_table1 import Table1Config, as_table1
from .cgt_table1 import run as run_table1
from .registry import register_experiment

METRICS = (("base accuracy", "base_char_accuracy", 100), ("specialised accuracy", "specialized_char_accuracy", 100),
           ("variation, eq. (4)", "variation", 1), ("linear-fit error", "linear_fit_mean_abs_error", 1))


@dataclass
class RPConfig(Table1Config):
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: ["cgt_aux", "cgt_aux_reg"])  # the references
    w_ps: list[float] = field(default_factory=lambda: [0.01, 0.1, 1.0])

    def __post_init__(self):
        super().__post_init__()
        if not self.w_ps or any(w <= 0 for w in self.w_ps):
            raise ValueError(f"w_ps must be positive, got {self.w_ps}")


@register_experiment("cgt-rp", "CGT App. A.2: the distribution-matching regulariser R_P vs R_C / R_D, Table 1's "
                     "measures", RPConfig)
def run(config: RPConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    references = run_table1(as_table1(config, reuse=True), out_dir / "references").results["summary"]
    rows += [{"model": variant, **summary} for variant, summary in references.items()]
    for w in config.w_ps:
        summary = run_table1(as_table1(config, variants=["cgt_aux_rp"], w_p=w, reuse=True), out_dir / f"rp-{w:g}")
        rows.append({"model": f"cgt_aux_rp, w_P {w:g}", **summary.results["summary"]["cgt_aux_rp"]})
    return Result({"resolved": config.resolved(), "rows": rows,
                   "paper": "App. A.2 proposes R_P without a run; Table 1's cgt_aux_reg: specialised 77.5, variation "
                            "0.07, fit error 0.04"}, tables={"table.md": table})


def table(results: dict) -> str:
    s = results["resolved"]
    head = (f"R_P (App. A.2) against Table 1's variants, cgt-table1's preset {results['config']['preset']} ({s['n_layer']} "
            f"layers, {s['steps']} steps); mean +- 3 standard errors over seeds "
            f"{', '.join(map(str, results['config']['seeds']))}; accuracies on the answer characters of examples 3-4.")
    body = [[r["model"], *(f"{scale * r[k][0]:.{1 if scale == 100 else 3}f} +- {scale * r[k][1]:.{1 if scale == 100 else 3}f}"
                           if k in r else "-" for _, k, scale in METRICS)] for r in results["rows"]]
    return "\n".join([head, "", *markdown_table(["model", *(label for label, _, _ in METRICS)], body)])
