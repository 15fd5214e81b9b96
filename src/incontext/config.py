"""Typed configuration: dataclasses built from plain dicts, YAML files and `key=value` overrides.

Every error names the key, the value and what is allowed; nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import re

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key, type or value that is not allowed (the message says which and why)."""


def _describe(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    name = getattr(annotation, "__name__", None)
    return name if name else str(annotation).replace("typing.", "")


def _coerce(where: str, annotation: Any, value: Any) -> Any:
    """Value converted to the annotated type where that is lossless (int -> float, "3e-4" -> float,
    list -> tuple, dict -> nested dataclass); anything else raises ConfigError."""
    origin = typing.get_origin(annotation)
    options = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        option_origin = typing.get_origin(option)
        if option is type(None):
            if value is None:
                return None
        elif option is typing.Any:
            return value
        elif option is bool:
            if isinstance(value, bool):
                return value
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif option is float:
            number = None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                try:
                    number = float(value)
                except OverflowError:  # an integer past every float (10**400): not a finite number
                    number = math.inf
            elif isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
                try:
                    number = float(value)
                except ValueError:
                    pass
            if number is not None:
                if not math.isfinite(number):  # nan passes every `<` check below it: refuse it here
                    raise ConfigError(f"{where}: {value!r} is not a finite number")
                return number
        elif option is str:
            if isinstance(value, str):
                return value
            if isinstance(value, os.PathLike):  # a path given in Python for a path field
                return os.fspath(value)
        elif option_origin is typing.Literal:
            if value in typing.get_args(option):
                return value
        elif option_origin in (tuple, list):
            if isinstance(value, (list, tuple)):
                args = [a for a in typing.get_args(option) if a is not Ellipsis]
                if args and len(set(args)) == 1:
                    value = [_coerce(where, args[0], v) for v in value]
                return option_origin(value)
        elif option_origin is dict or option is dict:
            if isinstance(value, dict):
                return dict(value)
        elif dataclasses.is_dataclass(option):
            if isinstance(value, option):
                return value
            if isinstance(value, dict):
                return from_dict(option, value, where=where)
    raise ConfigError(f"{where}: {value!r} is not {_describe(annotation)}")


def from_dict(cls: type[T], values: dict[str, Any], where: str | None = None) -> T:
    """Dataclass `cls` from `values`: unknown keys and values of the wrong type raise ConfigError naming them;
    the dataclass's own __post_init__ checks (ValueError) are re-raised as ConfigError with the location."""
    where = where or cls.__name__
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of keys to values, got {values!r}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed keys: {fields}")
    resolve = getattr(cls, "resolve_plain", None)  # sections that depend on each other (a model on its task)
    if resolve is not None:
        values = resolve(dict(values))
    coerced = {key: _coerce(f"{where}.{key}", hints[key], value) for key, value in values.items()}
    try:
        return cls(**coerced)
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{where}: {error}") from error


def limit(default: Any, help: str = "", **bounds: float) -> Any:
    """A dataclass field with a range that `parse_options` checks: min / max (inclusive), gt / lt (exclusive); `help`:
    its one line for `--help` and `absorb --list` (the field's metadata, which the catalog reads)."""
    return dataclasses.field(default=default, metadata={**bounds, **({"help": help} if help else {})})


def option(default: Any, help: str) -> Any:
    """A dataclass field with its one line of help (metadata "help", which the catalog reads)."""
    return dataclasses.field(default=default, metadata={"help": help})


def redefault(cls: type, name: str, default: Any, help: str = "") -> Any:
    """Field `name` of options class `cls` with another default (a subclass's own: distill-lora's steps=48; an options
    class: its instances, as a default factory), its range and help kept (or `help` in place of the help)."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    metadata = {**field.metadata, **({"help": help} if help else {})}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_BOUND_WORDS = {"min": ">=", "gt": ">", "max": "<=", "lt": "<"}


def _wording(annotation: Any, bounds: dict[str, float]) -> str:
    """What a value of `annotation` within `bounds` is, in words ("an integer >= 1 (or null)")."""
    origin = typing.get_origin(annotation)
    options = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    optional = type(None) in options
    range_ = " and ".join(f"{_BOUND_WORDS[k]} {v:g}" for k, v in bounds.items() if k in _BOUND_WORDS)
    words = []
    for option in options:
        option_origin = typing.get_origin(option)
        if option is type(None):
            continue
        if option is bool:
            words.append("true or false")
        elif option is int:
            words.append("an integer" + (f" {range_}" if range_ else ""))
        elif option is float:
            words.append("a finite number" + (f" {range_}" if range_ else ""))
        elif option is str:
            words.append("a string")
        elif option_origin is typing.Literal:
            words.append("one of " + ", ".join(map(str, typing.get_args(option))))
        elif option_origin in (tuple, list):
            args = [a for a in typing.get_args(option) if a is not Ellipsis]
            words.append("a list" + (f" of {_wording(args[0], {})}s".replace("an ", "").replace("a ", "") if args else ""))
        else:
            words.append(_describe(option))
    return " or ".join(words) + (" (or null)" if optional else "")


def _within(value: Any, bounds: dict[str, float]) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    checks = {"min": lambda b: value >= b, "gt": lambda b: value > b, "max": lambda b: value <= b, "lt": lambda b: value < b}
    return all(checks[k](b) for k, b in bounds.items() if k in checks)


def _nested(cls: type) -> dict[str, type]:
    """Field name -> options class, for the fields of dataclass `cls` that hold a dataclass of options (built by
    their default factory, e.g. the distillers' `study`)."""
    return {f.name: f.default_factory for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default_factory)}


def parse_options(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """The options `values` (from Python, or YAML scalars from `--set KEY=VALUE`) checked against dataclass `cls`:
    unknown names, types (integers stay integers, booleans are true/false, floats finite), Literal choices and the
    fields' `limit` ranges; returns the given options converted to their types. A nested options class (a field
    whose default factory is a dataclass) takes "study.window_tokens" keys or a mapping under "study"; its options
    come back as dotted keys. Every error is one line naming `where` (the method) and the option."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of options to values, got {values!r}")
    fields, nested = {f.name: f for f in dataclasses.fields(cls)}, _nested(cls)
    plain, inner = {}, {}
    for key, value in values.items():
        head, dot, rest = str(key).partition(".")
        if head in nested and (dot or isinstance(value, dict)):
            inner.setdefault(head, {}).update({rest: value} if dot else value)
        elif key in nested:
            raise ConfigError(f"{where}: {key} holds options: give {key}.OPTION=VALUE "
                              f"({', '.join(f.name for f in dataclasses.fields(nested[key]))})")
        elif key not in fields and (owner := [h for h, sub in nested.items()
                                             if key in {f.name for f in dataclasses.fields(sub)}]):
            raise ConfigError(f"{where}: {key} is an option of {owner[0]}: give {owner[0]}.{key}=VALUE")
        elif key not in fields:
            raise ConfigError(f"{where}: unknown option {key!r}; options: "
                              f"{', '.join(f'{n}.*' if n in nested else n for n in fields) or '(none)'}")
        else:
            plain[key] = value
    hints = typing.get_type_hints(cls)
    coerced = {}
    for key, value in plain.items():
        bounds = dict(fields[key].metadata)
        try:
            coerced[key] = _coerce(f"{where}.{key}", hints[key], value)
        except ConfigError:
            coerced[key] = None
            bad = True
        else:
            bad = not _within(coerced[key], bounds)
        if bad:
            raise ConfigError(f"{where}: {key} must be {_wording(hints[key], bounds)}, got {value!r}")
    for head, sub in inner.items():
        coerced.update({f"{head}.{k}": v for k, v in parse_options(nested[head], sub, f"{where}.{head}").items()})
    try:
        build_options(cls, coerced)  # the dataclass's own checks (__post_init__) across options
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{where}: {' '.join(str(error).split())}") from None
    return coerced


def build_options(cls: type, given: dict[str, Any]) -> Any:
    """Dataclass `cls` from parse_options' result: its fields as given (the defaults elsewhere), a nested options
    class built from its own dotted keys."""
    nested = _nested(cls)
    plain = {k: v for k, v in given.items() if "." not in k}
    for head, factory in nested.items():
        sub = {k.partition(".")[2]: v for k, v in given.items() if k.startswith(f"{head}.")}
        plain[head] = factory(**sub)
    return cls(**plain)


def check_float_limit(cls: type, values: dict[str, Any], largest: float, where: str, what: str) -> None:
    """ConfigError naming the first float field of dataclass `cls` whose value in `values` exceeds `largest` in
    magnitude (what a dtype holds, `what` naming it: parse_options knows no dtype, the caller that knows one checks
    here), in parse_options' wording with the range; a nested options class's dotted keys too."""
    hints = typing.get_type_hints(cls)
    for head, sub in _nested(cls).items():
        check_float_limit(sub, {k.partition(".")[2]: v for k, v in values.items() if k.startswith(f"{head}.")},
                          largest, f"{where}.{head}", what)
    for field in dataclasses.fields(cls):
        hint, value = hints[field.name], values.get(field.name)
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if float not in options or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if abs(value) > largest:
            raise ConfigError(f"{where}: {field.name} must be {_wording(float, {**dict(field.metadata), 'max': largest})} "
                              f"({what}), got {value!r}")


def choices(cls: type) -> dict[str, tuple]:
    """Field name -> allowed values, for every field of dataclass `cls` annotated with a Literal."""
    return {name: typing.get_args(hint) for name, hint in typing.get_type_hints(cls).items()
            if typing.get_origin(hint) is typing.Literal}


def check_choices(config: Any) -> None:
    """ValueError naming the field if a Literal-annotated field of dataclass `config` holds another value
    (for configs built in Python; from_dict checks the same while loading)."""
    for name, allowed in choices(type(config)).items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"{type(config).__name__}.{name}={getattr(config, name)!r} is not one of {allowed}")


def to_dict(config: Any) -> dict[str, Any]:
    """Plain, YAML/JSON-ready dict (tuples become lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def parse_overrides(overrides: list[str], flat: bool = False) -> dict[str, Any]:
    """["a.b=1", "c=x"] -> {"a": {"b": 1}, "c": "x"}; values are parsed as YAML scalars. flat=True keeps dotted
    keys whole (a method's options, as `incontext absorb --set OPTION=VALUE` takes them)."""
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if flat and (not sep or not key.strip()):
            raise ConfigError(f"setting {item!r} must look like OPTION=VALUE (e.g. steps=8)")
        if not sep:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. optimizer.lr=3e-4)")
        parts = [key.strip()] if flat else key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty key")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part!r}")
        try:
            node[parts[-1]] = scalar(raw)
        except yaml.YAMLError as error:
            if flat:
                raise ConfigError(f"setting {item!r}: the value is not a valid YAML scalar") from None
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(error)})") from error
    return nested


def scalar(raw: str) -> Any:
    """A YAML scalar, with YAML 1.1's gap closed: "1e-3" (no dot) is a float, not a string."""
    value = yaml.load(raw, Loader=_StrictLoader)
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return float(value)
    return value


_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 1e-3, 2.5E4: floats YAML 1.1 reads as strings


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict update (changes win)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(config: T, overrides: list[str]) -> T:
    """A copy of dataclass `config` with `key=value` (dotted for nested sections) overrides applied."""
    return from_dict(type(config), merge(to_dict(config), parse_overrides(overrides)))


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(error: yaml.YAMLError) -> str:
    return " ".join(str(getattr(error, "problem", None) or error).split())


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in YAML file `path`; every problem is a one-line error naming the file (and line, column)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder, not a YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a text (UTF-8) file, so not a YAML config (byte {error.start})") from error
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(error)}") from error
    if data is None or data == {}:
        raise ConfigError(f"{path} is empty: a config names at least its task (e.g. `task: {{name: linear_regression}}`; see configs/)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data
