"""Experiment registry: name -> (description, run function taking an argparse-style namespace of options)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

_EXPERIMENTS: dict[str, "Experiment"] = {}
_MODULES = ("regression_demo", "hf_parity", "iclca_table1", "iclca_table2", "iclca_approx", "iclca_approx_trained", "amicl", "residual_bursty", "residual_lm", "cgt_table1", "cgt_regression", "cgt_text", "tint_table3", "tint_perplexity", "tint_classification")  # imported lazily so `incontext --help` stays fast


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    config_class: type
    run: Callable


def register_experiment(name: str, description: str, config_class: type):
    def decorate(run: Callable) -> Callable:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")
        _EXPERIMENTS[name] = Experiment(name, description, config_class, run)
        return run

    return decorate


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(f"{__package__}.{module}")


def list_experiments() -> list[Experiment]:
    _load_all()
    return [_EXPERIMENTS[name] for name in sorted(_EXPERIMENTS)]


def get_experiment(name: str) -> Experiment:
    _load_all()
    if name not in _EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; registered: {sorted(_EXPERIMENTS)}")
    return _EXPERIMENTS[name]
