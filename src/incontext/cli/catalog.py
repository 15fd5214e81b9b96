"""The registries (incontext/registry.py: each one's `listing`) as data, for `--help` without importing torch: the
experiments (`incontext run --help`), the absorb methods (`compare --help`, `absorb --help`, `absorb --list`), the
episode tasks (`compare --help`) and the metrics they score with.

    catalog()["experiments"][name] == [description, [[config key, type, default, comment], ...]]
    catalog()["methods"][name] == {"summary": ..., "needs": ..., "options": [[name, default, help], ...]}
    catalog()["option_groups"][group] == {"methods": [...], "options": [[name, default, help], ...]}
    catalog()["tasks"][name] == {"description": ..., "metric": ..., "models": ..., "options": ["key=default", ...]}
    catalog()["metrics"][name] == {"label": ..., "higher_is_better": ..., "description": ...}
    catalog()["paper_status"] == {"registered": {name: {"paper", "reproduces", "scale", "status", "cause", "page"}}, "pending": [...]}

The data lives in cli/catalog.json, generated from the registries by `python -m incontext.cli.catalog` (run it
after adding or changing an experiment, a method, a task or a metric); help reads it so that it needs no torch
import (the registries import torch), and tests/test_cli_help.py checks that it matches the registries and that
every registered name is in the help.
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

CATALOG = Path(__file__).with_name("catalog.json")


def catalog() -> dict:
    """The catalog as written to CATALOG (read each time: small, and a test may point CATALOG elsewhere)."""
    return json.loads(CATALOG.read_text())


EXPERIMENTS = {name: (description, [tuple(field) for field in fields])
               for name, (description, fields) in catalog()["experiments"].items()}


def _field_comments(config_class: type) -> dict[str, str]:
    """Field name -> its help: the field's own (`help` of config.limit / config.option: its metadata), else the comment
    at the end of its line in the class source (an experiment's config); a subclass's own definition first, then the
    classes it inherits from."""
    out: dict[str, str] = {}
    for cls in config_class.__mro__:
        if not dataclasses.is_dataclass(cls) or cls is object:
            continue
        own = cls.__dict__.get("__annotations__", {})
        for name in own:
            field = cls.__dataclass_fields__.get(name)
            if field is not None and field.metadata.get("help") and not out.get(name):
                out[name] = field.metadata["help"]
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):  # a class without a source file (defined in exec'd code): its metadata alone
            continue
        comments = {token.start[0]: token.string.lstrip("#").strip()
                    for token in tokenize.generate_tokens(io.StringIO(source).readline)
                    if token.type == tokenize.COMMENT and not token.line.strip().startswith("#")}
        for node in ast.parse(source).body[0].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not out.get(node.target.id):
                out[node.target.id] = comments.get(node.end_lineno, "")
    return out


def _default_value(field: dataclasses.Field):
    """The field's default (made by its factory where it has one), or MISSING."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _default_text(field: dataclasses.Field) -> str:
    value = _default_value(field)
    if value is dataclasses.MISSING:
        return "(required)"
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def _type_text(field: dataclasses.Field, hint: object) -> str:
    """The annotation as written, but a named Literal (e.g. `FeatureMap`) spelled out with its choices."""
    if typing.get_origin(hint) is typing.Literal:
        return f"Literal[{', '.join(map(repr, typing.get_args(hint)))}]"
    return str(field.type)


def experiments_catalog() -> dict[str, list]:
    """name -> [description, [[key, type, default, comment], ...]] for every registered experiment."""
    from ..experiments.registry import EXPERIMENTS

    def entry(experiment) -> list:
        comments = _field_comments(experiment.config_class)
        hints = typing.get_type_hints(experiment.config_class)
        fields = [[f.name, _type_text(f, hints[f.name]), _default_text(f), comments.get(f.name, "")]
                  for f in dataclasses.fields(experiment.config_class)]
        return [experiment.description, fields]

    return EXPERIMENTS.listing(entry)


def _options(config_class: type) -> list[list[str]]:
    """[[name, default as typed after --set name=, help], ...] for a method's options; a nested options class (the
    distillers' `study`) as one "study.*" entry (its options: the catalog's option_groups)."""
    comments = _field_comments(config_class)
    inherited = {f.name for base in config_class.__mro__[1:] if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}
    out = []
    fields = dataclasses.fields(config_class)
    for f in [f for f in fields if f.name not in inherited] + [f for f in fields if f.name in inherited]:  # own first
        if dataclasses.is_dataclass(f.default_factory):
            out.append([f"{f.name}.*", "", comments.get(f.name, "")])
            continue
        value = _default_value(f)
        out.append([f.name, (value or '""') if isinstance(value, str) else _default_text(f), comments.get(f.name, "")])
    return out


def methods_catalog() -> dict[str, dict]:
    """name -> summary, needs and options ([name, default, help]) of every registered absorb method (the two
    reference points, keep-prompt and drop-prompt, first)."""
    from ..absorb.methods.reference import DropPrompt, KeepPrompt
    from ..absorb.protocol import METHODS

    return METHODS.listing(lambda method: {"summary": method.summary, "needs": method.needs,
                                           "options": _options(method.Options)}, first=(KeepPrompt.name, DropPrompt.name))


def option_groups_catalog() -> dict[str, dict]:
    """The nested options classes the methods share (`--set study.OPTION=VALUE`): name -> which methods take it and
    its options."""
    from ..absorb.protocol import METHODS

    groups: dict[str, dict] = {}
    for name in METHODS.names():
        for f in dataclasses.fields(METHODS.get(name).Options):
            if dataclasses.is_dataclass(f.default_factory):  # the shared class's defaults, then a method's own
                root = [c for c in f.default_factory.__mro__ if dataclasses.is_dataclass(c)][-1]
                group = groups.setdefault(f.name, {"methods": [], "options": _options(root), "defaults": {}})
                group["methods"].append(name)
                shared = {option: default for option, default, _ in group["options"]}
                own = {option: default for option, default, _ in _options(f.default_factory) if shared.get(option) != default}
                if own:
                    group["defaults"][name] = own
    return groups


def tasks_catalog() -> dict[str, dict]:
    """name -> description, metric, the models it is for and its options (`--set key=value`, with defaults) of every
    registered episode task."""
    from ..tasks.episodes import SOURCES

    def options(config_class) -> list[str]:  # a string default as it is typed after --set key=, others as JSON
        return [f"{f.name}={value if isinstance(value, str) else _default_text(f)}"
                for f, value in ((f, _default_value(f)) for f in dataclasses.fields(config_class))]

    return SOURCES.listing(lambda source: {
        "description": source.description, "metric": source.metric,
        "models": "text models" if source.needs_tokenizer else f"models trained on the {source.task_name} task",
        "options": options(source.config_class)})


def metrics_catalog() -> dict[str, dict]:
    from ..tasks.metrics import METRICS

    return METRICS.listing(lambda m: {"label": m.label, "higher_is_better": m.higher_is_better,
                                      "description": m.description})


def paper_status_catalog() -> dict[str, dict]:
    """name -> what the experiment reproduces of its paper, at which scale, and its status (experiments/status.py),
    for every registered experiment; `papers_pending`: the papers' experiments that have none, with the reason."""
    from dataclasses import asdict

    from ..experiments.status import STATUS, UNREGISTERED

    return {"registered": {name: asdict(entry) for name, entry in sorted(STATUS.items())},
            "pending": [asdict(entry) for entry in UNREGISTERED]}


def build_catalog() -> dict[str, dict]:
    """Every registry's entries as JSON data (what cli/catalog.json holds)."""
    return {"experiments": experiments_catalog(), "paper_status": paper_status_catalog(), "methods": methods_catalog(),
            "option_groups": option_groups_catalog(), "tasks": tasks_catalog(), "metrics": metrics_catalog()}


def write_catalog(path: Path | None = None) -> Path:
    """Write the catalog as data (read into EXPERIMENTS); run after changing an experiment or its config."""
    path = path or CATALOG
    path.write_text(json.dumps(build_catalog(), indent=1) + "\n")
    return path


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(prog="python -m incontext.cli.catalog", description=
        "Regenerate cli/catalog.json (the registries' names, summaries and option help that --help and "
        "`absorb --list` show) from the code; run it after changing a method, task or option.").parse_args()
    print(f"wrote {write_catalog()}")
