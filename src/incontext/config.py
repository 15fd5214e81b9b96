"""Typed configuration helpers: dataclasses built from plain dicts and `key=value` overrides.

Every error names the key, the value and what is allowed; nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def _check_type(cls: type, name: str, annotation: Any, value: Any) -> Any:
    """Coerce ints to floats where a float is expected; raise on anything else that does not fit."""
    origin = typing.get_origin(annotation)
    options = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option in (bool, str) and isinstance(value, option):
            return value
        if typing.get_origin(option) is typing.Literal and value in typing.get_args(option):
            return value
        if typing.get_origin(option) in (tuple, list) and isinstance(value, (list, tuple)):
            return typing.get_origin(option)(value)
    raise ValueError(f"{cls.__name__}.{name}: {value!r} is not a valid {annotation}")


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Build dataclass `cls` from `values`, rejecting unknown keys and values of the wrong type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} key(s) {unknown}; allowed: {sorted(fields)}")
    return cls(**{k: _check_type(cls, k, hints[k], v) for k, v in values.items()})


def apply_overrides(config: T, overrides: list[str]) -> T:
    """A copy of `config` with `key=value` strings applied (values parsed as YAML scalars)."""
    changes: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        changes[key.strip()] = yaml.safe_load(raw)
    merged = {**dataclasses.asdict(config), **changes}
    return from_dict(type(config), merged)
