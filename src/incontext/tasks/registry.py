"""Name -> Task class, so configs and the command line can pick a task by name."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..config import from_dict
from .base import Task

_TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: registers a Task subclass under `name` (and sets its `name` attribute)."""

    def decorate(task_class: type[Task]) -> type[Task]:
        if name in _TASKS and _TASKS[name] is not task_class:
            raise ValueError(f"task {name!r} is already registered to {_TASKS[name].__name__}")
        task_class.name = name
        _TASKS[name] = task_class
        return task_class

    return decorate


def list_tasks() -> list[str]:
    return sorted(_TASKS)


def task_class(name: str) -> type[Task]:
    if name not in _TASKS:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}")
    return _TASKS[name]


def task_config_class(name: str) -> type:
    return task_class(name).config_class


def get_task(name: str, **config_overrides: Any) -> Task:
    """Builds task `name` with its config dataclass defaults replaced by `config_overrides`."""
    cls = task_class(name)
    return cls(build_config(cls.config_class, config_overrides, f"task {name!r}"))


def build_config(config_class: type, options: dict[str, Any], owner: str) -> Any:
    """`config_class` from `options` through config.from_dict (types checked), after checking every key names
    a field (the message lists the fields)."""
    allowed = [f.name for f in dataclasses.fields(config_class)]
    for key in options:
        if key not in allowed:
            raise ValueError(f"unknown config key {key!r} for {owner} ({config_class.__name__}); "
                             f"allowed keys: {', '.join(allowed)}")
    return from_dict(config_class, options, where=config_class.__name__)
