"""The registered experiments as data, for `incontext run --help`: name -> (description, [(config key, type,
default, comment), ...]).

The data lives in cli_catalog.json, generated from the experiment registry by `python -m incontext.cli_catalog`
(run it after changing an experiment or its config); help reads it so that it needs no torch import (the
experiments import torch), and a test checks that it matches the registry.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from pathlib import Path

CATALOG = Path(__file__).with_name("cli_catalog.json")
EXPERIMENTS = {name: (description, [tuple(field) for field in fields])
               for name, (description, fields) in json.loads(CATALOG.read_text()).items()}


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


def _type_text(field: dataclasses.Field, hint: object) -> str:
    """The annotation as written, but a named Literal (e.g. `FeatureMap`) spelled out with its choices."""
    if typing.get_origin(hint) is typing.Literal:
        return f"Literal[{', '.join(map(repr, typing.get_args(hint)))}]"
    return str(field.type)


def build_catalog() -> dict[str, tuple[str, list[tuple[str, str, str, str]]]]:
    """name -> (description, [(key, type, default, comment), ...]) for every registered experiment."""
    from .experiments.registry import list_experiments

    catalog = {}
    for experiment in list_experiments():
        comments = _field_comments(experiment.config_class)
        hints = typing.get_type_hints(experiment.config_class)
        fields = [(f.name, _type_text(f, hints[f.name]), _default_text(f), comments.get(f.name, ""))
                  for f in dataclasses.fields(experiment.config_class)]
        catalog[experiment.name] = (experiment.description, fields)
    return catalog


def write_catalog(path: Path | None = None) -> Path:
    """Write the catalog as data (read into EXPERIMENTS); run after changing an experiment or its config."""
    path = path or CATALOG
    path.write_text(json.dumps(build_catalog(), indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write_catalog()}")
