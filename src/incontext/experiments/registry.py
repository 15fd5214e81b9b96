"""Experiment registry: name -> (description, run function taking an argparse-style namespace of options)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import pkgutil
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_EXPERIMENTS: dict[str, "Experiment"] = {}


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    config_class: type
    run: Callable  # (config, out_dir) -> the results as written (results.json's content)


def register_experiment(name: str, description: str, config_class: type):
    """Decorator for `run(config, out_dir) -> Result` (common.Result, written by common.save_result); a run
    that writes its own files returns the results dict instead."""
    def decorate(run: Callable) -> Callable:
        if name in _EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")

        def run_and_save(config, out_dir: Path) -> dict:
            from ..outputs import Result, save_result

            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            result = run(config, out_dir)
            return save_result(result, out_dir, name, config) if isinstance(result, Result) else result

        _EXPERIMENTS[name] = Experiment(name, description, config_class, run_and_save)
        return run

    return decorate


def _load_all() -> None:
    """Import every module of this package: the experiments register themselves (imported only when asked
    for, so that `incontext --help` stays fast)."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name != "catalog":  # the catalog is data written from the registry, not an experiment
            importlib.import_module(f"{__package__}.{module.name}")


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
    """Write the catalog as data (catalog.json, read by catalog.py); run after changing an experiment or its config."""
    path = path or Path(__file__).with_name("catalog.json")
    path.write_text(json.dumps(build_catalog(), indent=1) + "\n")
    return path


if __name__ == "__main__":  # the experiments register into the imported module, not into __main__
    from incontext.experiments import registry

    print(f"wrote {registry.write_catalog()}")
