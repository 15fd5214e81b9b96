"""Name -> Task class, so configs and the command line can pick a task by name."""

from __future__ import annotations

from typing import Any, Callable

from ..config import from_dict
from ..registry import Registry
from .base import Task

TASKS: Registry[type[Task]] = Registry("task", known="registered tasks")


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: registers a Task subclass under `name` (and sets its `name` attribute)."""

    def decorate(task_class: type[Task]) -> type[Task]:
        TASKS.register(name, task_class)
        task_class.name = name
        return task_class

    return decorate


def list_tasks() -> list[str]:
    return TASKS.names()


def get_task(name: str, **config_overrides: Any) -> Task:
    """Builds task `name` with its config dataclass defaults replaced by `config_overrides`."""
    return build_task(name, config_overrides)


def build_task(name: str, options: dict[str, Any], where: str | None = None) -> Task:
    """Task `name` with its config built from `options` by config.from_dict: an unknown key or a bad value raises
    ConfigError naming it and what is allowed (prefixed by `where`, default the config class's name); an
    unknown task name raises KeyError listing the registered tasks."""
    cls = TASKS.get(name)
    return cls(from_dict(cls.config_class, options, where=where))
