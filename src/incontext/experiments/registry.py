"""Experiment registry: name -> (description, run function taking an argparse-style namespace of options)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import pprint
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_EXPERIMENTS: dict[str, "Experiment"] = {}
_MODULES = ("regression_demo", "hf_parity", "iclca_table1", "iclca_table2", "iclca_approx", "iclca_approx_trained", "amicl", "residual_bursty", "residual_lm", "cgt_table1", "cgt_regression", "cgt_text", "cgt_pretrained", "tint_table3", "tint_perplexity", "tint_classification")  # imported lazily so `incontext --help` stays fast


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


# ----------------------------------------------------------------------------- the catalog (help without torch)


def _field_comments(config_class: type) -> dict[str, str]:
    """Field name -> the comment at the end of its line in the class source."""
    source = textwrap.dedent(inspect.getsource(config_class))
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT and not token.line.strip().startswith("#")}
    return {node.target.id: comments.get(node.end_lineno, "") for node in ast.parse(source).body[0].body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def _default_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def build_catalog() -> dict[str, tuple[str, list[tuple[str, str, str, str]]]]:
    """name -> (description, [(key, type, default, comment), ...]) for every registered experiment."""
    catalog = {}
    for experiment in list_experiments():
        comments = _field_comments(experiment.config_class)
        fields = [(f.name, str(f.type), _default_text(f), comments.get(f.name, ""))
                  for f in dataclasses.fields(experiment.config_class)]
        catalog[experiment.name] = (experiment.description, fields)
    return catalog


def write_catalog(path: Path | None = None) -> Path:
    path = path or Path(__file__).with_name("catalog.py")
    path.write_text(
        '"""The registered experiments: name -> (description, [(config key, type, default, comment), ...]).\n\n'
        "Generated from the registry by `python -m incontext.experiments.registry` (run it after changing an\n"
        "experiment or its config); `incontext run --help` reads it so that help needs no torch import, and a test\n"
        'checks that it matches the registry.\n"""\n\n'
        f"EXPERIMENTS = {pprint.pformat(build_catalog(), width=118, sort_dicts=False)}\n"
    )
    return path


if __name__ == "__main__":  # the experiments register into the imported module, not into __main__
    from incontext.experiments import registry

    print(f"wrote {registry.write_catalog()}")
