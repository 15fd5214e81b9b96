"""`incontext compare` and `incontext demo`: the command line over harness.job (CompareSpec, run_compare: the absorb
harness on one model and one task, written out as results.json, table.md and compare.png). Here only what reads the
command line: --set values split between the task and the methods, --tune's candidates."""

from __future__ import annotations

from typing import Any

import yaml

from ..absorb import absorb_methods
from ..harness.compare import method_name
from ..harness.job import CompareSpec, command_line, run_compare  # noqa: F401  (the commands' one import)


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """--set values: `method.option=v` for a registered method, anything else for the task."""
    known = set(absorb_methods())
    task, methods = {}, {}
    for key, value in settings.items():
        if method_name(key) in known:
            if not isinstance(value, dict):
                raise ValueError(f"--set {key}=... needs an option: {key}.OPTION=VALUE")
            methods[key] = value
        else:
            task[key] = value
    return task, methods


def parse_tune(items: list[str]) -> dict[str, list[Any]]:
    """["dynamic-eval.learning_rate=1e-5,1e-4"] -> {"dynamic-eval.learning_rate": [1e-05, 0.0001]}."""
    from ..config import scalar

    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option or not raw:
            raise ValueError(f"--tune {item!r} must look like METHOD.OPTION=v1,v2,... (e.g. dynamic-eval.learning_rate=1e-5,1e-4)")
        if method not in absorb_methods():
            raise ValueError(f"--tune {item!r}: unknown method {method!r}; methods: {', '.join(absorb_methods())}")
        try:
            out[key] = [scalar(v) for v in raw.split(",")]
        except yaml.YAMLError:
            raise ValueError(f"--tune {item!r}: a value is not a valid YAML scalar (give v1,v2,... e.g. 1e-5,1e-4)") from None
    return out
