"""CGT App. D.1: one task of 8 examples (n_tasks = 1, n_ex = 8): the baseline and CGT + aux + reg of cgt-table1,
the specialised model's y frozen after the first 4 examples and scored on examples 5-8. The paper: an 8-layer
baseline reaches 82.7%, CGTs with y frozen 82.6-82.8%.

    incontext run cgt-single-task                      # CPU: cgt-table1's preset cpu with one task of 8 examples
    incontext run cgt-single-task --set preset=paper   # cgt-table1's paper preset, one task of 8 (a GPU job)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cgt_table1 import Table1Config
from .cgt_table1 import run as run_table1
from .cgt_table1 import table as table1
from ..outputs import Result
from .registry import register_experiment

PAPER = "paper (App. D.1): baseline with 8 layers 82.7%; CGT + aux + reg with y frozen 82.6-82.8%"


@dataclass
class SingleTaskConfig(Table1Config):
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: ["baseline", "cgt_aux_reg"])
    n_tasks: int | None = 1
    n_ex: int | None = 8


@register_experiment("cgt-single-task", "CGT App. D.1: one task of 8 examples, baseline vs CGT + aux + reg with y "
                     "frozen after 4", SingleTaskConfig)
def run(config: SingleTaskConfig, out_dir: Path) -> Result:
    result = run_table1(config, out_dir)
    result.results["paper_d1"] = PAPER
    result.tables = {"table.md": lambda r: table1(r).rstrip("\n") + f"\n\nOne task of {r['resolved']['n_ex']} examples "
                     f"(scored: examples {r['resolved']['n_ex'] // 2 + 1}-{r['resolved']['n_ex']}); the paper column is "
                     f"Table 1's. {PAPER}.\n"}
    return result
