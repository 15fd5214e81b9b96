"""Experiment registry: name -> (description, run function taking an argparse-style namespace of options)."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..registry import Registry


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    config_class: type
    run: Callable  # (config, out_dir) -> the results as written (results.json's content)


def register_experiment(name: str, description: str, config_class: type):
    """Decorator for `run(config, out_dir) -> Result` (outputs.Result): the registered run writes the Result
    through the one writer, outputs.save_result, with the experiment's name and config (a name registered twice
    is refused)."""
    def decorate(run: Callable) -> Callable:
        def run_and_save(config, out_dir: Path) -> dict:
            from ..outputs import Result, save_result

            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            result = run(config, out_dir)
            if not isinstance(result, Result):
                raise TypeError(f"experiment {name!r} returned {type(result).__name__}, not a Result")
            return save_result(result, out_dir, name, config)

        EXPERIMENTS.register(name, Experiment(name, description, config_class, run_and_save))
        return run

    return decorate


def _load_all() -> None:
    """Import every module of this package: the experiments register themselves (imported only when asked
    for, so that `incontext --help` stays fast)."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")


EXPERIMENTS: Registry[Experiment] = Registry("experiment", load=_load_all)


def list_experiments() -> list[Experiment]:
    return [EXPERIMENTS.get(name) for name in EXPERIMENTS.names()]


def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)
