"""The one plug-in mechanism: a registry of name -> entry, used by the absorb methods (and their adapted models and
PEFT forms), the episode tasks, the training tasks, the metrics, the experiments and the model families.

    METHODS = Registry("absorb method")
    METHODS.register("keep-prompt", KeepPrompt)          # or @METHODS.register("keep-prompt") on a class or function
    METHODS.get("keep-promt")   # KeyError: unknown absorb method 'keep-promt'; registered: drop-prompt, keep-prompt, ...
    METHODS.names()             # sorted, for --help (cli/catalog.py writes `listing` of each registry)

A name registered twice to different entries is refused (one line naming both); registering the same entry again
does nothing. Pure Python (no torch): the command line's help may import it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def _label(entry: Any) -> str:
    """A short name of an entry for messages: a class's or function's name, else its type's."""
    return getattr(entry, "__qualname__", None) or type(entry).__name__


class Registry(Generic[T]):
    """Name -> entry for one kind of plug-in. `kind` names it in messages ("unknown {kind} 'x'"); `known` introduces
    the list of names an unknown-name error gives ("registered"); `load`, where given, is called before every look-up
    (a registry whose entries register themselves when their modules are imported, on first use)."""

    def __init__(self, kind: str, known: str = "registered", load: Callable[[], None] | None = None):
        self.kind, self.known, self._load = kind, known, load
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None):
        """Register `entry` under `name` and return it; without `entry`, a decorator that registers what it decorates.
        ValueError where `name` already holds another entry."""
        if entry is None:
            return lambda decorated: self.register(name, decorated)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} is registered under a non-empty name, got {name!r}")
        held = self._entries.get(name)
        if held is not None and held is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered to {_label(held)}")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Forget `name` (nothing happens where it is not registered)."""
        self._entries.pop(name, None)

    @contextlib.contextmanager
    def scoped(self) -> Iterator["Registry[T]"]:
        """Entries registered or removed inside the block are undone at its end (tests, guides run as written)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = saved

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            self._load()
        return self._entries

    def get(self, name: str) -> T:
        """The entry of `name`; KeyError (one line) listing the registered names."""
        entries = self._loaded()
        if name not in entries:
            raise KeyError(f"unknown {self.kind} {name!r}; {self.known}: {', '.join(self.names())}")
        return entries[name]

    def find(self, name: str | None) -> T | None:
        """The entry of `name`, or None."""
        return self._loaded().get(name) if isinstance(name, str) else None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._loaded())

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) in the order of registration."""
        return list(self._loaded().items())

    def values(self) -> list[T]:
        return list(self._loaded().values())

    def listing(self, describe: Callable[[T], Any], first: tuple[str, ...] = ()) -> dict[str, Any]:
        """name -> describe(entry) for every entry, `first` first and then the names sorted: what --help shows (the
        catalog, cli/catalog.py, is built from each registry's listing)."""
        entries = self._loaded()
        names = [*(n for n in first if n in entries), *(n for n in sorted(entries) if n not in first)]
        return {name: describe(entries[name]) for name in names}

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        """The names in the order of registration."""
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
