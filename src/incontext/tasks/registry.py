"""Name -> Task class, so configs and the command line can pick a task by name."""

from __future__ import annotations

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
    return build_task(name, config_overrides)


def build_task(name: str, options: dict[str, Any], where: str | None = None) -> Task:
    """Task `name` with its config built from `options` by config.from_dict: an unknown key or a bad value raises
    ConfigError naming it and what is allowed (prefixed by `where`, default the config class's name); an
    unknown task name raises KeyError listing the registered tasks."""
    cls = task_class(name)
    return cls(from_dict(cls.config_class, options, where=where))
